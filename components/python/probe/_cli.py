"""The console scripts of the pip-installed package (pyproject.toml
[project.scripts]): each runs the tool of the same name from the package's
install prefix (<site-packages>/probe/_prefix/bin), with the same arguments,
replacing this process."""

import os
import sys

from . import _lib


def _run(name):
    tried = []
    for prefix in _lib.prefixes():
        exe = os.path.join(prefix, "bin", name)
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            os.execv(exe, [exe] + sys.argv[1:])
        tried.append(exe)
    sys.stderr.write("%s: the tool is not installed next to the probe package (tried %s)\n"
                     % (name, ", ".join(tried)))
    sys.exit(2)


def probe_run():
    _run("probe-run")


def probe_compare():
    _run("probe-compare")


def probe_calibrate():
    _run("probe-calibrate")


def probe_matrix():
    _run("probe-matrix")


def probe_recover():
    _run("probe-recover")


def probe_oracle():
    _run("probe-oracle")
