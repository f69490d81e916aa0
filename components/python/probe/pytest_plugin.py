"""probe's pytest plugin (docs/pytest.md).

Registered through the `pytest11` entry point of the probe-parity
distribution; from a build tree or an install prefix, load it with
`-p probe.pytest_plugin` or `pytest_plugins = ["probe.pytest_plugin"]`.

- @probe.parametrize_features(CAP, ...): the test runs once per registered
  feature (probe.FEATURES) that has every capability; none is a collection
  error.
- @pytest.mark.probe_cell("COMPONENT/FEATURE", ...): the matrix cells a test
  proves; "{feature}" in an id is the feature of the test's
  parametrize_features case. An unknown component (not in the component
  table) or feature (not in probe.FEATURES nor the probe_features ini list)
  is a usage error at collection, --collect-only included.
  --probe-matrix-out FILE writes each cell's status (worst of its tests:
  failed > skipped > passed) as JSON ("probe-pytest-cells" version 1), which
  `probe-matrix --tests FILE` merges into its matrix.
- --probe-repeat: probe_session.repeat is True; probe_session.run(fn, ...)
  then calls fn twice and fails unless both results are bit-identical (the
  determinism floor), reporting the measured difference.
- --probe-record FILE: probe_session.record(component, feature, stats, arch)
  appends one JSON line per call ("probe-record" version 1), the input of
  `probe-calibrate --records FILE`.

Code that runs inside a test without the fixture (a pairing helper) gets the
same object from current(): the running test's ProbeTest, or None outside a
test or without the plugin.
"""

import json
import os
import re
import sys

import pytest

from . import _lib
from . import features as _features

CELLS_FORMAT = "probe-pytest-cells"
RECORD_FORMAT = "probe-record"

# the statistics a record keeps from a probe.compare() dict (docs/calibration.md)
RECORD_STATS = ("rel_l2", "cosine", "max_abs", "p99_abs", "mean_abs", "mismatch_fraction",
                "gain_z", "channel_z", "n")

_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def pytest_addoption(parser):
    g = parser.getgroup("probe", "probe parity tests (docs/pytest.md)")
    g.addoption("--probe-matrix-out", metavar="FILE", default=None,
                help="write the status of every probe_cell the run proved (JSON, format "
                     "probe-pytest-cells; merge with probe-matrix --tests FILE)")
    g.addoption("--probe-repeat", action="store_true", default=False,
                help="run each side of a paired test twice and fail unless the two runs are "
                     "bit-identical (the determinism floor)")
    g.addoption("--probe-record", metavar="FILE", default=None,
                help="append the statistics that tests record (probe_session.record) to FILE "
                     "as JSON lines (format probe-record; input of probe-calibrate --records)")
    g.addoption("--probe-arch", metavar="ARCH", default=None,
                help="the GPU architecture recorded with the statistics (default: $PROBE_ARCH, "
                     "else the first CUDA device's sm_XY, else cpu)")
    parser.addini("probe_features", type="linelist", default=[],
                  help="feature ids a probe_cell may name besides the registered features "
                       "(e.g. features proven by probe-compare runs)")
    parser.addini("probe_components", default="",
                  help="the component table (components.json) probe_cell ids are checked "
                       "against (default: $PROBE_COMPONENTS, else probe's own)")


def pytest_configure(config):
    config.addinivalue_line("markers", "probe_cell(*ids): the COMPONENT/FEATURE matrix cells "
                            "this test proves (docs/pytest.md)")
    config.addinivalue_line("markers", "probe_features(*capabilities, argname='feature'): set by "
                            "probe.parametrize_features")
    config._probe = ProbeSession(config)


# --- the feature table --------------------------------------------------------

def pytest_generate_tests(metafunc):
    for mark in metafunc.definition.iter_markers("probe_features"):
        caps = mark.args
        argname = mark.kwargs.get("argname", "feature")
        chosen = _features.features_with(*caps)
        if not chosen:
            have = sorted({c for f in _features.FEATURES.values() for c in f.capabilities})
            # a collection error of the module, shown as this message alone
            raise pytest.Collector.CollectError(
                "probe: %s: no registered feature has the capabilities %s (features: %s; "
                "capabilities they have: %s); register one with probe.register_feature in a "
                "conftest.py" % (metafunc.definition.nodeid, ", ".join(map(repr, caps)),
                                 ", ".join(_features.FEATURES) or "none",
                                 ", ".join(have) or "none"))
        metafunc.parametrize(argname, chosen, ids=[f.id for f in chosen])


# --- matrix cells ---------------------------------------------------------------

def _component_table(config):
    path = config.getini("probe_components") or os.environ.get("PROBE_COMPONENTS") or \
        _lib.share_file("components.json")
    if not path:
        raise pytest.UsageError("probe: the component table components.json was not found next "
                                "to the package; set PROBE_COMPONENTS or the probe_components ini")
    try:
        with open(path) as f:
            doc = json.load(f)
        return path, [c["name"] for c in doc["components"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise pytest.UsageError("probe: cannot read the component table %s: %s" % (path, e))


def _item_cells(item):
    """The cell ids an item declares, "{feature}" filled in; (ids, errors)."""
    ids, errors = [], []
    feature = None
    callspec = getattr(item, "callspec", None)
    for mark in item.iter_markers("probe_features"):
        argname = mark.kwargs.get("argname", "feature")
        if callspec is not None and argname in callspec.params:
            feature = callspec.params[argname]
    for mark in item.iter_markers("probe_cell"):
        if not mark.args:
            errors.append("probe_cell() names no cell")
        for cid in mark.args:
            if not isinstance(cid, str):
                errors.append("cell id %r is not a string" % (cid,))
                continue
            if "{feature}" in cid:
                if feature is None:
                    errors.append("cell id %r uses {feature} but the test is not parametrized "
                                  "by probe.parametrize_features" % cid)
                    continue
                cid = cid.replace("{feature}", str(feature))
            ids.append(cid)
    return ids, errors


def pytest_collection_modifyitems(session, config, items):
    ps = config._probe
    bad = []
    known_features = None
    comps = None
    for item in items:
        ids, errors = _item_cells(item)
        bad.extend("%s: %s" % (item.nodeid, e) for e in errors)
        cells = []
        for cid in ids:
            m = re.fullmatch(r"([^/,]+)/([^/,]+)", cid)
            if not m:
                bad.append("%s: cell id %r is not COMPONENT/FEATURE" % (item.nodeid, cid))
                continue
            if comps is None:
                table, comps = _component_table(config)
                known_features = list(_features.FEATURES) + list(config.getini("probe_features"))
            comp, feat = m.groups()
            if comp not in comps:
                bad.append("%s: cell %r: unknown component %r (the component table %s has: %s)"
                           % (item.nodeid, cid, comp, table, ", ".join(comps)))
            elif feat not in known_features:
                bad.append("%s: cell %r: unknown feature %r (registered features and the "
                           "probe_features ini: %s)" % (item.nodeid, cid, feat,
                                                        ", ".join(known_features) or "none"))
            else:
                cells.append((comp, feat))
        if cells:
            ps.item_cells[item.nodeid] = cells
    if bad:
        raise pytest.UsageError("probe: bad probe_cell ids:\n  " + "\n  ".join(bad))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    ps = item.config._probe
    if item.nodeid not in ps.item_cells:
        return
    if rep.failed:
        status = "failed"
    elif rep.skipped:
        # an expected failure proves nothing about the cell
        status = "skipped"
    elif rep.when == "call":
        status = "passed"
    else:
        return
    prev = ps.item_status.get(item.nodeid)
    if prev is None or _RANK[status] > _RANK[prev[0]]:
        ps.item_status[item.nodeid] = (status, _first_line(rep) if status != "passed" else None)


def _first_line(rep):
    if rep.skipped and isinstance(rep.longrepr, tuple):
        return str(rep.longrepr[2])
    if hasattr(rep, "wasxfail"):
        return "xfail: %s" % rep.wasxfail
    crash = getattr(getattr(rep, "longrepr", None), "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0] if crash.message else "failed"
    text = str(rep.longrepr or "failed").strip().splitlines()
    return text[-1] if text else "failed"


def pytest_sessionfinish(session, exitstatus):
    ps = session.config._probe
    try:
        ps.write()
    except OSError as e:  # checked at start; the disk may still fill or the folder go
        sys.stderr.write("probe: cannot write %s: %s\n" % (e.filename or "the outputs", e.strerror or e))
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


# --- repeat and record ------------------------------------------------------------

def _detect_arch():
    env = os.environ.get("PROBE_ARCH")
    if env:
        return env
    import sys
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return "sm_%d%d" % (major, minor)
    except Exception:
        pass
    return "cpu"


def _abspath(p):
    return os.path.abspath(p) if p else None


class ProbeSession:
    """What the plugin keeps for one pytest run: the options, the cells and
    their outcomes, the recorded statistics."""

    def __init__(self, config):
        self.config = config
        self.repeat = bool(config.getoption("probe_repeat"))
        # absolute now: a test may change the working directory
        self.matrix_out = _abspath(config.getoption("probe_matrix_out"))
        self.record_path = _abspath(config.getoption("probe_record"))
        for opt, path in (("--probe-matrix-out", self.matrix_out), ("--probe-record", self.record_path)):
            _check_writable(opt, path)
        self._arch = config.getoption("probe_arch")
        self.item_cells = {}    # nodeid -> [(component, feature)]
        self.item_status = {}   # nodeid -> (status, first line)
        self.records = []

    @property
    def arch(self):
        if self._arch is None:
            self._arch = _detect_arch()
        return self._arch

    def cells(self):
        """The cells as written to --probe-matrix-out, in first-declared order."""
        out = {}
        for nodeid, cells in self.item_cells.items():
            st = self.item_status.get(nodeid)
            if st is None:      # declared, not run (deselected, interrupted)
                continue
            for comp, feat in cells:
                cid = "%s/%s" % (comp, feat)
                c = out.setdefault(cid, {"id": cid, "component": comp, "feature": feat,
                                         "status": "passed",
                                         "tests": {"passed": 0, "failed": 0, "skipped": 0},
                                         "nodeids": [], "reasons": []})
                c["tests"][st[0]] += 1
                c["nodeids"].append(nodeid)
                if _RANK[st[0]] > _RANK[c["status"]]:
                    c["status"] = st[0]
                if st[1] and len(c["reasons"]) < 3:
                    c["reasons"].append("%s: %s" % (nodeid, st[1]))
        return list(out.values())

    def write(self):
        if self.matrix_out:
            from . import __version__
            cells = self.cells()
            doc = {"format": CELLS_FORMAT, "version": 1, "probe_version": __version__,
                   "cells": cells,
                   "summary": {k: sum(c["status"] == k for c in cells)
                               for k in ("passed", "failed", "skipped")}}
            _write_atomic(self.matrix_out, json.dumps(doc, indent=2) + "\n")
        if self.record_path:
            text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in self.records)
            with open(self.record_path, "a") as f:
                f.write(text)


def _check_writable(opt, path):
    """A UsageError (one line, before any test runs) when the output file of option opt
    cannot be written: its folder missing or not writable, or the path a folder."""
    if not path:
        return
    d = os.path.dirname(path)
    why = ("%s is a folder" % path if os.path.isdir(path) else
           "the folder %s does not exist" % d if not os.path.isdir(d) else
           "the folder %s is not writable" % d if not os.access(d, os.W_OK | os.X_OK) else
           "%s is not writable" % path if os.path.exists(path) and not os.access(path, os.W_OK)
           else None)
    if why:
        raise pytest.UsageError("probe: %s %s: %s" % (opt, path, why))


def _write_atomic(path, text):
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, ".%s.tmp%d" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _bit_identical(a, b):
    """(identical, detail): a and b compared element for element at atol =
    rtol = 0 by probe.compare; tuples, lists and dicts of tensors element by
    element."""
    from . import compare
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False, "the runs returned different keys (%s vs %s)" % (sorted(a), sorted(b))
        for k in a:
            ok, why = _bit_identical(a[k], b[k])
            if not ok:
                return False, "[%r]: %s" % (k, why)
        return True, None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return False, "the runs returned %d and %d values" % (len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            ok, why = _bit_identical(x, y)
            if not ok:
                return False, "[%d]: %s" % (i, why)
        return True, None
    m = compare(a, b, atol=0, rtol=0)
    if m["identical"]:
        return True, None
    return False, ("rel_l2=%.6g max_abs=%.6g at %s (run 1 %r, run 2 %r), %d of %d elements differ"
                   % (m["rel_l2"], m["max_abs"], m["max_abs_index"], m["ref_at_max_abs"],
                      m["cand_at_max_abs"], m["mismatch_count"], m["n"]))


class ProbeTest:
    """probe_session: the plugin's view for one test.

    repeat: True under --probe-repeat.
    arch: the architecture records carry by default.
    run(fn, *args, side="reference", **kwargs): fn(*args, **kwargs); under
        --probe-repeat called twice, failing the test unless both results are
        bit-identical. Returns the first result.
    check_repeat(first, second, side="reference"): the same check on two
        results the caller computed.
    record(component, feature, stats, arch=None, kind="feature"): keep the
        statistics of one comparison (a probe.compare() dict or a dict of
        numbers) for --probe-record.
    """

    def __init__(self, ps, item):
        self._ps = ps
        self.nodeid = item.nodeid

    @property
    def repeat(self):
        return self._ps.repeat

    @property
    def arch(self):
        return self._ps.arch

    def check_repeat(self, first, second, side="reference"):
        __tracebackhide__ = True
        ok, why = _bit_identical(first, second)
        if not ok:
            pytest.fail("probe: nondeterministic %s: two runs of the same side differ: %s "
                        "(--probe-repeat: the determinism floor must be bit-identical)"
                        % (side, why), pytrace=False)

    def run(self, fn, *args, side="reference", **kwargs):
        __tracebackhide__ = True
        first = fn(*args, **kwargs)
        if self._ps.repeat:
            second = fn(*args, **kwargs)
            self.check_repeat(first, second, side=side)
        return first

    def record(self, component, feature, stats, arch=None, kind="feature"):
        __tracebackhide__ = True
        if not isinstance(component, str) or not component:
            raise TypeError("probe: record: component must be a non-empty string, not %r"
                            % (component,))
        _features._check_id(str(feature) if isinstance(feature, _features.Feature) else feature)
        if kind not in ("feature", "floor"):
            raise ValueError("probe: record: kind must be 'feature' or 'floor', not %r" % (kind,))
        if not isinstance(stats, dict):
            raise TypeError("probe: record: stats must be a dict (probe.compare's result), not %s"
                            % type(stats).__name__)
        _, comps = _component_table(self._ps.config)
        if component not in comps:
            raise ValueError("probe: record: unknown component %r (the component table has: %s)"
                             % (component, ", ".join(comps)))
        kept = {}
        for k in RECORD_STATS:
            v = stats.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError("probe: record: stats[%r] must be a number, not %r" % (k, v))
            kept[k] = v
        for k in ("rel_l2", "cosine", "max_abs"):
            if k not in kept:
                raise ValueError("probe: record: stats lacks %r (pass probe.compare()'s dict)" % k)
        import math
        if not all(math.isfinite(v) for v in kept.values()):
            raise ValueError("probe: record: a statistic is not finite (%r); nothing can be "
                             "calibrated on it" % kept)
        gate = stats.get("gate")
        if isinstance(gate, dict) and "atol" in gate:
            kept.setdefault("atol", gate["atol"])
            kept.setdefault("rtol", gate["rtol"])
        rec = {"format": RECORD_FORMAT, "version": 1, "test": self.nodeid,
               "component": component, "feature": str(feature), "kind": kind,
               "arch": str(arch if arch is not None else self._ps.arch), "stats": kept}
        self._ps.records.append(rec)
        return rec


_current = None


def current():
    """The running test's ProbeTest (what the fixture probe_session returns),
    or None outside a test or when the plugin is not loaded."""
    return _current


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    _current = item._probe_test = ProbeTest(item.config._probe, item)
    try:
        yield
    finally:
        _current = None


@pytest.fixture
def probe_session(request):
    """The plugin's per-test object (ProbeTest): repeat, arch, nodeid, run,
    check_repeat, record; the same object as current() during the test."""
    pt = getattr(request.node, "_probe_test", None)
    return pt if pt is not None else ProbeTest(request.config._probe, request.node)
