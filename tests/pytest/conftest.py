"""pytest configuration of the worked example (tests/pytest).

- `probe` is imported from the build tree named by PROBE_BUILD_DIR (its
  share/probe/python) when it is set, else from the environment.
- Fixture `pair_stats`: a session object of the duck type probe.pair
  accepts (.repeat, .record(component, feature, stats, arch)). With
  PROBE_PAIR_STATS=FILE every recorded slot is appended to FILE as one JSON
  line (what scripts/gpu/pytest.sh prints); PROBE_PAIR_REPEAT=1 sets
  .repeat, so each pair also measures the reference's determinism floor.
"""
import json
import os
import sys

import pytest

_build = os.environ.get("PROBE_BUILD_DIR")
if _build:
    sys.path.insert(0, os.path.join(os.path.abspath(_build), "share", "probe", "python"))
# the repository's C folder probe/ is a namespace package when the repository
# root is on sys.path; a regular package `probe` anywhere on the path wins
_ns = sys.modules.get("probe")
if _ns is not None and getattr(_ns, "__file__", None) is None:
    del sys.modules["probe"]


class StatsRecorder:
    def __init__(self, path, repeat):
        self.path = path
        self.repeat = repeat
        self.test = None

    def record(self, component, feature, stats, arch):
        if not self.path:
            return
        line = dict(stats, test=self.test, component=component, feature=feature, arch=arch)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(line, default=str) + "\n")


@pytest.fixture
def pair_stats(request):
    rec = StatsRecorder(os.environ.get("PROBE_PAIR_STATS"), os.environ.get("PROBE_PAIR_REPEAT") == "1")
    rec.test = request.node.nodeid
    return rec
