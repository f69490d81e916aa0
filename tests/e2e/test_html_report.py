"""probe-compare --html in a real headless Chromium: two h5py-written captures
with known errors (a [1,4,3,16,16] latent per step for 3 steps, a text-encoder
tensor, a [1,3,2,128,128] decoded video with an error blob at a known frame and
pixel, a NaN, a shape mismatch) are compared, the page is loaded by Chromium
(--dump-dom) and the RENDERED values are checked against numpy: the verdict,
the first failing component, heatmap cells (worst rel_l2 of the output slots
per component and step), histogram counts (total = n, every log-spaced bin),
the per-channel mean shift, and the hottest spatial-map cell, and for nested
block calls the block x step map (worst rel_l2 per block and step against
numpy) and the first failing block. Also: the page
is self-contained, its inline JSON equals --json, and bad --html targets exit
2 with one line."""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from urllib.parse import quote

import h5py
import numpy as np

BUILD = os.environ.get("PROBE_BUILD_DIR", "build")
COMPARE = os.path.join(BUILD, "bin", "probe-compare")
BINS = 32  # PROBE_STATS_HIST_BINS
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def close(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM:
    print("FAIL chromium not found: scripts/setup installs the Debian package 'chromium'")
    sys.exit(1)

tmp = tempfile.mkdtemp(prefix="probe-html-")
ref_path, cand_path = os.path.join(tmp, "ref.h5"), os.path.join(tmp, "cand.h5")
rng = np.random.default_rng(11)
L = (1, 4, 3, 16, 16)  # [B, C, F, H, W]
entries = []  # (path, ref, cand, attrs) in execution order


def add(path, ref, cand, **attrs):
    entries.append((path, ref, cand, attrs))


def mult(r, eps):
    """c = r * (1 + eps*u), u uniform in [-1, 1]: |c - r| <= eps*|r| (within T1 for eps <= 1e-3)."""
    return (r * (1 + eps * rng.uniform(-1, 1, r.shape))).astype(r.dtype)


te = rng.standard_normal((1, 8, 32)).astype(np.float32)
add("/text_encoder/0000/out", te, mult(te, 1e-5))
for k in range(3):
    x = rng.standard_normal(L).astype(np.float32)
    add("/dit.step/%04d/in.hidden_states" % k, x, mult(x, 9e-4), step=k)  # larger than out at step 0
    o = rng.standard_normal(L).astype(np.float32)
    oc = mult(o, [1e-4, 3e-4, 5e-4][k])
    if k >= 1:  # the error enters at step 1 in frame 2, pixel (11, 5), and grows
        oc[0, :, 2, 11, 5] += np.float32(2.0 * k)
    add("/dit.step/%04d/out" % k, o, oc, step=k)
    s = rng.standard_normal(L).astype(np.float32)
    sc = mult(s, 2e-4)
    if k >= 1:
        sc[0, :, 2, 11, 5] += np.float32(1.0 * k)
    add("/scheduler.step/%04d/out.prev_sample" % k, s, sc, step=k)
vid = rng.uniform(-1, 1, (1, 3, 2, 128, 128)).astype(np.float32)
vidc = mult(vid, 1e-4)
vidc[0, :, 1, 101, 37] += np.float32(0.5)  # frame 1, pixel row 101, column 37
add("/vae.decode/0000/out", vid, vidc)
aux = rng.standard_normal((2, 16)).astype(np.float32)
auxc = mult(aux, 1e-4)
auxc[1, 3] = np.nan
add("/vae.decode/0000/out.aux", aux, auxc)
mm = rng.standard_normal((4, 4)).astype(np.float32)
add("/misc/0000/out", mm, rng.standard_normal((4, 5)).astype(np.float32))

with h5py.File(ref_path, "w") as fr, h5py.File(cand_path, "w") as fc:
    for seq, (path, r, c, attrs) in enumerate(entries):
        for f, a in ((fr, r), (fc, c)):
            d = f.create_dataset(path, data=a)
            d.attrs["probe.seq"] = seq
            for k, v in attrs.items():
                d.attrs["probe." + k] = v


def rel_l2(r, c):
    r, c = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    fin = np.isfinite(r) & np.isfinite(c)
    return float(np.linalg.norm(c[fin] - r[fin]) / np.linalg.norm(r[fin]))


class Dom(HTMLParser):
    """Every element as {tag, attrs, text}; text includes the descendants'."""
    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr"}

    def __init__(self):
        super().__init__()
        self.nodes, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        n = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.nodes.append(n)
        if tag not in self.VOID:
            self.stack.append(n)

    def handle_startendtag(self, tag, attrs):
        self.nodes.append({"tag": tag, "attrs": dict(attrs), "text": ""})

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        for n in self.stack:
            n["text"] += data

    def by_id(self, id_):
        for n in self.nodes:
            if n["attrs"].get("id") == id_:
                return n
        return None

    def by_class(self, cls):
        return [n for n in self.nodes if cls in (n["attrs"].get("class") or "").split()]


# Chromium runs without the sanitizer runtime that a PROBE_SANITIZE build
# preloads into the tests (it hangs with libasan preloaded).
BROWSER_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS",
                                                                "UBSAN_OPTIONS")}


def render(html, fragment=""):
    """Load the page in headless Chromium; return its DOM after the scripts ran."""
    url = "file://" + quote(os.path.abspath(html)) + fragment
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--user-data-dir=" + os.path.join(tmp, "profile"), "--dump-dom", url],
                       capture_output=True, text=True, timeout=120, env=BROWSER_ENV)
    if p.returncode != 0 or "</html>" not in p.stdout:
        print("chromium stderr:", p.stderr[-2000:])
    d = Dom()
    d.feed(p.stdout)
    return d


html = os.path.join(tmp, "report.html")
cmp_json = os.path.join(tmp, "cmp.json")
p = subprocess.run([COMPARE, ref_path, cand_path, "--html", html, "--json", cmp_json, "--quiet"],
                   capture_output=True, text=True)
check(p.returncode == 1, "probe-compare exits 1 (a gate fails), got %d: %s" % (p.returncode, p.stderr))
page = open(html, encoding="utf-8").read()

# Self-contained: nothing is loaded from elsewhere; the inline data is --json's.
check("<link" not in page and " src=" not in page and "@import" not in page and "url(" not in page,
      "the page loads no external resource")
start = page.index('id="probe-data">') + len('id="probe-data">')
inline = json.loads(page[start:page.index("</script>", start)].replace("<\\/", "</"))
check(inline == json.load(open(cmp_json)), "the inline probe-data JSON equals the --json output")

dom = render(html)
check(dom.by_id("verdict") is not None and dom.by_id("verdict")["text"] == "FAIL",
      "rendered verdict FAIL")
check(dom.by_id("first-failure-component")["text"] == "dit.step",
      "rendered first failing component dit.step (got %r)" % dom.by_id("first-failure-component")["text"])
check(dom.by_id("first-failure-path")["text"] == "/dit.step/0001/out", "rendered first failing path")

# Heatmap: worst rel_l2 of the output slots per (component, step); the input
# slot in.hidden_states (larger error at step 0) must not count.
expect = {}
for path, r, c, attrs in entries:
    comp, slot = path.split("/")[1], path.split("/")[3]
    if not slot.startswith("out") or comp == "misc":
        continue
    col = attrs.get("step", int(path.split("/")[2]))
    expect[(comp, col)] = max(expect.get((comp, col), 0.0), rel_l2(r, c))
cells = {(n["attrs"]["data-component"], int(n["attrs"]["data-step"])): n for n in dom.by_class("hm")
         if "data-component" in n["attrs"]}
check(set(cells) == set(expect) | {("misc", 0)},
      "heatmap has exactly the (component, step) cells of the captures: %s" % sorted(cells))
for key, want in sorted(expect.items()):
    n = cells.get(key)
    got = float(n["attrs"]["data-rel-l2"]) if n else float("nan")
    shown = float(n["text"]) if n else float("nan")
    check(close(got, want, 1e-9) and close(shown, want, 1e-3),
          "heatmap %s step %d: rel_l2 %.6g (shown %r), numpy %.6g" % (key[0], key[1], got,
                                                                        n and n["text"], want))
x0 = rel_l2(entries[1][1], entries[1][2])
check(x0 > 2 * expect[("dit.step", 0)], "(test data: the input slot's error %.3g exceeds the output's)" % x0)
check(cells.get(("misc", 0)) is not None and cells[("misc", 0)]["text"] == "n/a",
      "a tensor that was not compared (shape mismatch) shows n/a in the heatmap")
order = [n["text"] for n in dom.nodes if n["tag"] == "th" and "row" in (n["attrs"].get("class") or "")]
check(order == ["text_encoder", "dit.step", "scheduler.step", "vae.decode", "misc"],
      "heatmap rows in execution order: %s" % order)

# Default selection: the first failing tensor's charts.
check(dom.by_id("detail-path")["text"] == "/dit.step/0001/out", "the first failure is shown by default")


def detail_checks(path, r, c, hottest=None):
    d = render(html, "#tensor=" + quote(path, safe=""))
    check(d.by_id("detail-path") is not None and d.by_id("detail-path")["text"] == path,
          "%s selected through the URL" % path)
    r64, c64 = r.astype(np.float64), c.astype(np.float64)
    fin = np.isfinite(r64) & np.isfinite(c64)
    diff = np.abs(c64 - r64)[fin]
    total = d.by_id("hist-total")
    check(total is not None and int(total["text"]) == r.size, "%s: histogram total %s = n = %d"
          % (path, total and total["text"], r.size))
    bars = d.by_class("hbar")
    check(sum(int(b["attrs"]["data-count"]) for b in bars) == r.size, "%s: the bars sum to n" % path)
    pos = diff[diff > 0]
    lo, hi = math.floor(math.log10(pos.min())), math.ceil(math.log10(pos.max()))
    hi = max(hi, lo + 1)
    svg = d.by_id("hist")
    check(int(svg["attrs"]["data-log10-lo"]) == lo and int(svg["attrs"]["data-log10-hi"]) == hi,
          "%s: histogram range 1e%d..1e%d" % (path, lo, hi))
    k = np.clip(np.floor((np.log10(pos) - lo) * BINS / (hi - lo)), 0, BINS - 1).astype(int)
    want = [int((diff == 0).sum())] + list(np.bincount(k, minlength=BINS)) + [int((~fin).sum())]
    got = [int(b["attrs"]["data-count"]) for b in bars]
    check(got == want, "%s: every histogram bar equals numpy's count" % path)
    if r.ndim in (2, 3, 4, 5):
        axis = 1 if r.ndim >= 4 else r.ndim - 1
        dd = np.where(fin, c64 - r64, 0)
        shift = dd.sum(axis=tuple(a for a in range(r.ndim) if a != axis)) / \
            fin.sum(axis=tuple(a for a in range(r.ndim) if a != axis))
        shown = [float(b["attrs"]["data-shift"]) for b in d.by_class("cbar")]
        check(len(shown) == r.shape[axis] and all(close(a, b, 1e-5) for a, b in zip(shown, shift)),
              "%s: per-channel mean shift over axis %d equals numpy's" % (path, axis))
    if hottest:
        h = d.by_id("map-hottest")
        check(h is not None and all(int(h["attrs"][k]) == v for k, v in hottest.items()),
              "%s: hottest spatial-map cell %s (rendered: %s)" % (path, hottest, h and h["text"]))
        cellsv = [n for n in d.by_class("mcell") if n["attrs"]["data-v"] != "null"]
        top = max(cellsv, key=lambda n: float(n["attrs"]["data-v"]))
        return d, top
    check(d.by_id("map-hottest") is None, "%s: no spatial map for rank %d" % (path, r.ndim))
    return d, None


ent = {e[0]: e for e in entries}
_, top = detail_checks("/dit.step/0001/out", ent["/dit.step/0001/out"][1], ent["/dit.step/0001/out"][2],
                       {"data-frame": 2, "data-row": 11, "data-row-last": 11, "data-col": 5, "data-col-last": 5})
check((top["attrs"]["data-frame"], top["attrs"]["data-y"], top["attrs"]["data-x"]) == ("2", "11", "5"),
      "dit.step/0001: the largest drawn map cell is frame 2, (11, 5)")
r, c = ent["/dit.step/0001/out"][1:3]
want = np.abs(c.astype(np.float64) - r)[0, :, 2, 11, 5].mean()
check(close(float(top["attrs"]["data-v"]), want, 1e-5), "dit.step/0001: that cell's mean |c-r| %.6g" % want)

# 128 x 128 pixels -> 64 x 64 cells of 2 x 2 pixels: (101, 37) is in cell (50, 18).
d, top = detail_checks("/vae.decode/0000/out", vid, vidc,
                       {"data-frame": 1, "data-row": 100, "data-row-last": 101, "data-col": 36,
                        "data-col-last": 37})
check((top["attrs"]["data-frame"], top["attrs"]["data-y"], top["attrs"]["data-x"]) == ("1", "50", "18"),
      "vae.decode: the largest drawn map cell is frame 1, cell (50, 18)")
want = np.abs(vidc.astype(np.float64) - vid)[0, :, 1, 100:102, 36:38].mean()
check(close(float(top["attrs"]["data-v"]), want, 1e-5), "vae.decode: that cell's mean |c-r| %.6g" % want)
check(len(d.by_class("map")) == 2 and len(d.by_class("mcell")) == 2 * 64 * 64,
      "vae.decode: 2 frame maps of 64 x 64 cells")

d, _ = detail_checks("/vae.decode/0000/out.aux", aux, auxc)
nf = [b for b in d.by_class("hbar") if b["attrs"].get("data-kind") == "nonfinite"]
check(len(nf) == 1 and nf[0]["attrs"]["data-count"] == "1", "the NaN is counted in the non-finite bar")
detail_checks("/text_encoder/0000/out", te, ent["/text_encoder/0000/out"][2])

d = render(html, "#tensor=" + quote("/misc/0000/out", safe=""))
check("not compared" in d.by_id("detail")["text"] and d.by_id("hist") is None,
      "a shape mismatch shows 'not compared' and no charts")

# A passing run: the verdict and "none".
html2 = os.path.join(tmp, "pass.html")
p = subprocess.run([COMPARE, ref_path, cand_path, "--only", "/text_encoder/*", "--html", html2, "--quiet"],
                   capture_output=True, text=True)
check(p.returncode == 0, "--only /text_encoder/* passes (exit %d)" % p.returncode)
d = render(html2)
check(d.by_id("verdict")["text"] == "PASS" and d.by_id("first-failure-component")["text"] == "none",
      "passing page: PASS, first failing component none")

# A screenshot renders (docs/report.png is made the same way).
png = os.path.join(tmp, "report.png")
subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--user-data-dir=" + os.path.join(tmp, "profile"), "--screenshot=" + png,
                "--window-size=1400,1000", "file://" + quote(html)], capture_output=True, timeout=120,
               env=BROWSER_ENV)
check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "screenshot is a PNG")

# Block x step: nested dit.block calls (probe.parent, probe.block) of 2 steps x 2 CFG branches x
# 3 blocks; block 1's output gets an error from step 1 on. Each cell is the worst rel_l2 of the
# block's output over the branches of that step (numpy), and the first failing block is named.
bref, bcand = os.path.join(tmp, "bref.h5"), os.path.join(tmp, "bcand.h5")
bexp, seq, first_fail = {}, 0, None
with h5py.File(bref, "w") as fr, h5py.File(bcand, "w") as fc:
    for d in range(4):
        step, branch = d // 2, d % 2
        for b in range(3):
            path = "/dit.block/%04d/out" % (3 * d + b)
            r = rng.standard_normal((1, 16, 8)).astype(np.float32)
            c = mult(r, 1e-5)
            if b == 1 and step == 1:
                c[0, 3, :] += np.float32(0.5 * (1 + branch))
                first_fail = first_fail or path
            for f, a in ((fr, r), (fc, c)):
                ds = f.create_dataset(path, data=a)
                ds.attrs.update({"probe.seq": seq, "probe.step": step, "probe.cfg_branch": branch,
                                 "probe.parent": "/dit.step/%04d" % d, "probe.block": b,
                                 "probe.class": "m.Block"})
            seq += 1
            bexp[("dit.block %d" % b, step)] = max(bexp.get(("dit.block %d" % b, step), 0.0), rel_l2(r, c))
        o = rng.standard_normal((1, 16, 8)).astype(np.float32)
        for f in (fr, fc):
            ds = f.create_dataset("/dit.step/%04d/out" % d, data=o)
            ds.attrs.update({"probe.seq": seq, "probe.step": step, "probe.cfg_branch": branch})
        seq += 1
bhtml = os.path.join(tmp, "blocks.html")
p = subprocess.run([COMPARE, bref, bcand, "--html", bhtml, "--quiet"], capture_output=True, text=True)
check(p.returncode == 1, "block captures: exit 1 (block 1 fails at step 1), got %d" % p.returncode)
d = render(bhtml)
bcells = {(n["attrs"]["data-block"], int(n["attrs"]["data-step"])): n for n in d.by_class("hm")
          if "data-block" in n["attrs"]}
check(set(bcells) == set(bexp), "block map has exactly the (block, step) cells: %s" % sorted(bcells))
check(all(close(float(bcells[k]["attrs"]["data-rel-l2"]), v, 1e-9) for k, v in bexp.items() if k in bcells),
      "block map cells equal numpy's worst rel_l2 over the branches")
check([k for k, n in sorted(bcells.items()) if "failcell" in n["attrs"].get("class", "")] == [("dit.block 1", 1)],
      "only block 1 at step 1 is outlined as failing")
check(d.by_id("blocks-first") is not None and d.by_id("blocks-first")["text"] ==
      "first failing block output in execution order: %s (block 1 of /dit.step/0002, step 1)" % first_fail,
      "the first failing block is named (%r)" % (d.by_id("blocks-first") or {}).get("text"))
check(d.by_id("blocks-box")["attrs"].get("style", "") == "", "the block map is shown")
check(dom.by_id("blocks-box")["attrs"].get("style", "") == "display:none",
      "no block map for captures without nested calls")

# Bad --html targets: one line, exit 2, the inputs untouched.
for target, what in ((os.path.join(tmp, "no-such-dir", "r.html"), "missing directory"),
                     (tmp, "a directory")):
    p = subprocess.run([COMPARE, ref_path, cand_path, "--html", target], capture_output=True, text=True)
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("probe-compare: "),
          "--html to %s: exit 2 and one line (%d, %r)" % (what, p.returncode, p.stderr.strip()))

if failures:
    print("%d check(s) failed; files in %s" % (len(failures), tmp))
    sys.exit(1)
shutil.rmtree(tmp)
print("all checks passed")
