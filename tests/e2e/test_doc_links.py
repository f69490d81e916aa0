"""Every document a tracked file names exists (scripts/check-doc-links).

- The checker itself on a small tree: a markdown link to a missing file, a
  link to a missing heading and a bare *.md name in a C comment are reported
  (exit 1, one line each); links to existing files and headings, URLs and
  bare names of docs/ pages pass (exit 0).
- The repository: no reference fails.
"""
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("PROBE_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
CHECK = os.path.join(SRC, "scripts", "check-doc-links")
# The fixture names below are built from parts so that the checker, run on
# this repository, does not read them as references.
MD = "." + "md"


def run(root):
    p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
    return p.returncode, p.stdout


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        write(root, "README" + MD, "See [the format](docs/format" + MD + "#the-layout-v1) and "
              "[web](https://example.com/x" + MD + ").\n")
        write(root, "docs/format" + MD, "# Format\n\n## The layout (v1)\n\nSee metrics" + MD + ".\n")
        write(root, "docs/metrics" + MD, "# Metrics\n")
        write(root, "src/a.c", "/* definitions: docs/metrics" + MD + " */\n")
        rc, out = run(root)
        assert rc == 0, out
        write(root, "src/b.c", "/* see GONE" + MD + " */\n")
        write(root, "docs/gates" + MD, "[x](missing" + MD + ") [y](format" + MD + "#no-such-heading)\n")
        rc, out = run(root)
        assert rc == 1, out
        lines = sorted(out.splitlines())
        assert lines == [s.replace(".MD", MD) for s in
                         ["docs/gates.MD:1: format.MD#no-such-heading (no such heading)",
                          "docs/gates.MD:1: missing.MD (no such file)",
                          "src/b.c:1: GONE.MD (no such file)"]], lines


def main():
    self_test()
    rc, out = run(SRC)
    assert rc == 0, "references that do not resolve:\n" + out
    print("ok")


if __name__ == "__main__":
    main()
