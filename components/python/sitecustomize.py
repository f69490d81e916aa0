"""probe: activate the Python adapter, then run the sitecustomize this one
shadows.

probe-run puts this file's directory first on PYTHONPATH, so Python's site
module imports this sitecustomize instead of the next one on sys.path (e.g.
Debian's /usr/lib/python3.X/sitecustomize.py, or one in another PYTHONPATH
directory). After activating the adapter it finds that next one with
importlib.machinery.PathFinder on the sys.path entries that follow this
directory and executes it as the module `sitecustomize`.

Nothing here raises: an adapter problem is one `probe:` line on stderr; an
error in the chained sitecustomize is reported the way site.py reports it.
"""


def _probe_activate():
    import sys
    try:
        import probe_adapter
        probe_adapter.activate()
    except Exception as e:  # never stop the user's program
        try:
            sys.stderr.write("probe: Python adapter not active: %s: %s\n" % (type(e).__name__, e))
        except Exception:
            pass


def _probe_chain():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    def real(p):
        try:
            return os.path.realpath(p or os.curdir)
        except Exception:
            return p

    here = real(os.path.dirname(os.path.abspath(__file__)))
    after = None
    for i, p in enumerate(sys.path):
        if real(p) == here:
            after = i + 1  # entries after the last occurrence of our directory
    if after is None:
        return
    rest = [p for p in sys.path[after:] if real(p) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)
    except Exception as e:
        try:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             "%s: %s\n" % (type(e).__name__, e))
        except Exception:
            pass


_probe_activate()
_probe_chain()
