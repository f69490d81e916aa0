"""probe's Python adapter: finds component boundaries (text encoder, DiT step,
scheduler step, VAE encode/decode) in a running Python process and hands
their tensors to the preloaded shim through the tap ABI (include/probe/tap.h).

It is activated by probe-run's sitecustomize.py. It stays inert (wraps
nothing, costs nothing) unless the process exports probe_tap_v1 and
probe_tap_enabled_v1() returns 1. It never imports torch itself.

Environment (set by probe-run, docs/probe-run.md):
  PROBE_COMPONENTS  path of components.json (default: next to this package)
  PROBE_TAPS        extra taps, lines NAME=[module-glob:]Class-glob.method
  PROBE_SCOPES      scope-only components, same lines: calls open a scope for
                    the library calls they make, no tensor is tapped
  PROBE_OPT_IN      opt-in rows of the table to turn on, joined by ','
                    (probe-run --blocks: dit.block)
"""

import atexit
import os
import platform
import sys

from . import _abi, _table
from ._runtime import Runtime

__all__ = ["activate", "runtime"]

_active = None


def runtime():
    """The active Runtime, or None when the adapter is inert."""
    return _active


def _note(msg):
    try:
        from ._runtime import _note_stderr
    except Exception:
        try:
            sys.stderr.write("probe: %s\n" % msg)
            sys.stderr.flush()
        except Exception:
            pass
        return
    _note_stderr(msg)


def _flush_only(lib):
    try:
        if lib.enabled():
            lib.flush()
    except Exception:
        pass


def activate():
    """Activate once per process. Returns the Runtime, or None when inert.
    Problems are reported as one `probe:` line on stderr each; nothing is
    raised to the caller for a missing shim, a disabled capture or a bad
    table (the user's program keeps running, uncaptured)."""
    global _active
    if _active is not None:
        return _active
    lib = _abi.load()
    if lib is None:
        if os.environ.get("PROBE_OUT"):
            _note("PROBE_OUT is set but probe_tap_v1 is not in this process "
                  "(libprobe_intercept.so not preloaded): Python components are not captured")
        return None
    if not lib.enabled():
        return None  # not the capturing process (child, no output file, capture disabled)

    path = os.environ.get("PROBE_COMPONENTS") or _table.default_table_path()
    try:
        table = _table.Table(path)
    except _table.TableError as e:
        _note("%s; Python components are not captured" % e)
        # Still close the capture file from the interpreter's exit, while the
        # frameworks' libraries are alive, as an active adapter would.
        atexit.register(_flush_only, lib)
        return None
    for name in (os.environ.get("PROBE_OPT_IN") or "").split(","):
        name = name.strip()
        if not name:
            continue
        try:
            table.enable(name)
        except _table.TableError as e:
            _note("%s: ignored" % e)
    for name, pat in _table.parse_taps(os.environ.get("PROBE_TAPS", "")):
        if pat is None:
            _note("malformed PROBE_TAPS line %r (expected NAME=PATTERN): ignored" % name)
            continue
        try:
            table.add_tap(name, pat)
        except _table.TableError as e:
            _note("%s: ignored" % e)

    for name, pat in _table.parse_taps(os.environ.get("PROBE_SCOPES", "")):
        if pat is None:
            _note("malformed PROBE_SCOPES line %r (expected NAME=PATTERN): ignored" % name)
            continue
        try:
            table.add_scope(name, pat)
        except _table.TableError as e:
            _note("%s: ignored" % e)

    rt = Runtime(lib, table)
    rt.manifest("python", platform.python_version())
    atexit.register(rt.at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=rt.after_fork_in_child)
    rt.watch_dynamo()
    rt.watch_nvtx()
    rt.install_class_hook()
    rt.scan_loaded_modules()
    _active = rt
    return rt
