"""The adapter at run time: finds component classes, wraps their methods, and
hands each call's tensor inputs and outputs to the shim's probe_tap_v1.

Rules (docs/components.md):
  * path /<component>/<call:04>/<slot>; call counts the outermost calls of
    the component in this process, from 0;
  * a wrapped method that runs inside another wrapped method of the SAME
    component on the same thread is not tapped (re-entrancy guard); one of
    another component is, as a nested call (a DiT block inside dit.step);
  * step = scheduler.step calls completed so far (dit.step, controlnet and
    scheduler.step); a nested call of another component takes the enclosing
    call's; -1 otherwise;
  * cfg_branch = index of the dit.step call within the current step
    (dit.step; a nested call takes the enclosing call's; -1 otherwise);
  * inside a call of an "opaque" row's component (controlnet) nothing else
    is tapped;
  * a nested call also carries its parent, the enclosing call
    "/<component>/<call:04>", and its block index, the number of earlier
    calls of the same component inside that parent call (-1 and no parent
    when not nested); every call carries the class ("module.Qualname") of
    the object whose method was wrapped, and its module path when it can be
    found (_module_path);
  * threads: the main thread's calls are counted as above; a call made on
    another thread is the component "<component>@<thread>" (<thread> its
    threading name, sanitized), with its own call, step and CFG-branch
    counters, so concurrent threads never interleave one another's indices;
  * processes: a multiprocessing child that is a DataLoader worker, or whose
    first call is not one of the pipeline's own (a root input, dit.step,
    scheduler.step), is a worker and
    writes its own file, <stem>.proc<identity><ext> (probe_tap_sidecar_v1);
    a child forked after its parent opened the capture file cannot capture
    and names what it did not capture in one line at its exit;
  * timestep = the value of an argument named `timestep` or `t` when it is a
    Python number or a CPU tensor whose elements are all equal; NaN
    otherwise (a CUDA tensor is never read: that would synchronize).
Tensor bytes never pass through Python: probe_tap_v1 gets data_ptr(), shape,
strides (in elements) and the producer stream.

Injection (docs/inject.md), when probe-run sets PROBE_INJECT: before a
tensor is tapped, probe_inject_v1 may replace it with the reference's value
at the same path. Component inputs are replaced in a private contiguous
tensor that is passed to the component instead of the caller's (tensors the
pipeline shares, e.g. latents also given to the scheduler, keep their own
values); outputs (the root inputs a source method returns, and the
scheduler attributes of `timesteps`) are replaced in place, so the pipeline
goes on with them. The tap then records what was actually used.
"""

import atexit
import builtins
import ctypes
import fnmatch
import functools
import inspect
import json
import math
import numbers
import os
import re
import stat
import sys
import threading
import types
import weakref

from . import _abi, _cfg, _slots

# torch dtype attribute name -> probe_dtype (include/probe/dtype.h)
_DTYPE_CODES = (
    ("bool", 1), ("int8", 2), ("int16", 3), ("int32", 4), ("int64", 5),
    ("uint8", 6), ("uint16", 7), ("uint32", 8), ("uint64", 9),
    ("float16", 10), ("bfloat16", 11), ("float32", 12), ("float64", 13),
    ("float8_e4m3fn", 14), ("float8_e5m2", 15),
)

_TIMESTEP_ARGS = ("timestep", "t")
_MAX_EQUAL_SCAN = 4096  # CPU timestep tensors up to this size are checked for one value


_DYNAMO_EVAL_FRAME = "torch._dynamo.eval_frame"
_PIPELINE_OWN = ("dit.step", "scheduler.step", "dit.block")  # with the table's root rows
_THREAD_TAG_MAX = 48


def _thread_tag(name):
    """The path form of a thread name: runs of characters other than
    [A-Za-z0-9_.-] become '_', at most 48 characters; "thread" if empty."""
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:_THREAD_TAG_MAX]
    return tag if tag.strip(".") else "thread"


def _run_wrote_something():
    """True when another process of the run has written a capture: PROBE_OUT,
    or a per-rank or per-process file next to it, is not empty (a launcher
    such as torchrun's agent imports torch and matches no class itself)."""
    out = os.environ.get("PROBE_OUT")
    if not out:
        return False
    import glob
    head, base = os.path.split(out)
    dot = base.rfind(".")
    stem, ext = (base[:dot], base[dot:]) if dot > 0 else (base, "")
    names = [out]
    for kind in ("rank", "proc"):
        names += glob.glob(os.path.join(glob.escape(head), glob.escape(stem) + "." + kind + "*"
                                        + glob.escape(ext)))
    for n in names:
        try:
            if os.path.getsize(n) > 0:
                return True
        except OSError:
            pass
    return False


def _dataloader_worker():
    """True in a torch DataLoader worker process (whatever it calls)."""
    data = sys.modules.get("torch.utils.data")
    try:
        return data is not None and data.get_worker_info() is not None
    except Exception:
        return False


def _mp_child():
    """The multiprocessing identity of this process when it is a
    multiprocessing child ((1,), (1, 2), ...), else None."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return None
    try:
        if mp.parent_process() is None:
            return None
        return tuple(mp.current_process()._identity) or ()
    except Exception:
        return None


class _PostImportHook:
    """A sys.meta_path entry that runs callback(module) right after the
    module `name` is executed, then removes itself. It finds nothing itself:
    it asks the other finders and only wraps the loader's exec_module."""

    def __init__(self, name, callback):
        self.name = name
        self.callback = callback
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_callback(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_callback
        return spec

    def invalidate_caches(self):
        pass


def _adapter_code_objects():
    """Code objects of every function of the adapter's modules (methods and
    nested functions included, e.g. the wrapper defined in _make_wrapper)."""
    seen = {}

    def add(code):
        if id(code) in seen:
            return
        seen[id(code)] = code
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                add(c)

    pkg = __name__.rpartition(".")[0]
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == pkg or name.startswith(pkg + ".")):
            continue
        for obj in list(vars(mod).values()):
            objs = [obj]
            if isinstance(obj, type) and getattr(obj, "__module__", None) == name:
                objs = list(vars(obj).values())
            for o in objs:
                f = o.__func__ if isinstance(o, (staticmethod, classmethod)) else o
                if isinstance(f, types.FunctionType) and getattr(f, "__module__", None) == name:
                    add(f.__code__)
    return list(seen.values())


def _line_start():
    """What a `probe:` line starts with so that it starts a line of its own,
    as the shim's lines do (docs/intercept.md "probe: lines"): "\\r\\033[K" on
    a terminal, "\\n" on a regular file whose last byte is not a newline,
    nothing otherwise."""
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
        if os.isatty(fd):
            return "\r\x1b[K"
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= 0:
            return ""
        with open("/proc/self/fd/%d" % fd, "rb") as f:
            f.seek(st.st_size - 1)
            return "" if f.read(1) in (b"\n", b"") else "\n"
    except Exception:
        return ""


def _note_stderr(msg):
    try:
        sys.stderr.write("%sprobe: %s\n" % (_line_start(), msg))
        sys.stderr.flush()
    except Exception:
        pass


_SKIP = object()


_slot_part = _slots.slot_part


class Runtime:
    def __init__(self, lib, table):
        self.lib = lib
        self.table = table
        self.enabled = True
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._calls = {name: 0 for name in table.names}
        self._class_names = {}  # class -> "module.Qualname", cut to 255 bytes
        self._module_paths = {}  # id(obj) -> (weakref to obj, module path or None)
        self._module_maps = {}   # id(module) -> (weakref, {id(submodule): name})
        self._steps_done = 0
        self._dit_in_step = 0
        self._dit_instance = None  # the denoise_step range of the last dit.step call
        self._sched_instance = None  # the denoise_step range the last scheduler.step completed
        self._latent_batch = None  # batch of the last latents.init output
        self._cfg_batched = []  # dit.step calls with both CFG branches batched (manifest cfg_batch)
        self.nvtx = _cfg.NvtxSteps(self._scheduler_range_end)
        self._threads = {}  # thread tag -> {"name", "calls", "steps", "dit"}
        self._pipeline_own = set(_PIPELINE_OWN) | {n for n, r in table.rows.items() if r.get("root")}
        self._role_done = False  # this process's first call decided worker or not
        self._missed = None      # forked after the parent opened the file: component -> calls
        self._exited = False
        self._child_exit = False
        self._noted = set()
        self._torch = None
        self._dtype_codes = None
        self._ext_streams = {}
        self._manifest_done = set()
        self._atexit_moved = False
        self._orig_build_class = None
        self._wrapper_code = None
        self.wrapped = []  # "module.Class.method -> component", for diagnostics
        # rows with "opaque": true (controlnet): no other component is tapped
        # inside their calls (a ControlNet's own Transformer2DModel is not a dit.step)
        self._opaque = {name for name, row in table.rows.items() if row.get("opaque") is True}
        self._out_attrs = {name: list(row.get("output_attrs") or [])
                           for name, row in table.rows.items()}
        self._dtypes = {}  # component -> dtype of its first output slot (manifest "dtypes")
        self._inject_globs = None
        if os.environ.get("PROBE_INJECT"):
            if getattr(lib, "inject", None) is None:
                _note_stderr("PROBE_INJECT is set but the preloaded shim has no probe_inject_v1: "
                             "nothing is injected")
            else:
                self._inject_globs = [g for g in os.environ.get("PROBE_INJECT_GLOBS", "*").split(",")
                                      if g]

    # -- notes -----------------------------------------------------------
    def note(self, kind, msg):
        """Print `probe: msg` once per kind."""
        with self._lock:
            if kind in self._noted:
                return
            self._noted.add(kind)
        _note_stderr(msg)

    # -- manifest --------------------------------------------------------
    def manifest(self, key, value):
        try:
            rc = self.lib.manifest(key.encode(), json.dumps(value).encode())
        except Exception as e:  # ctypes conversion errors
            rc = -1
            self.note("manifest-exc", "cannot record %s in the run manifest: %s" % (key, e))
        if rc != 0:
            self.note("manifest-" + key, "probe_tap_manifest_v1(%s) failed with status %d" % (key, rc))
        self._manifest_done.add(key)

    def manifest_libraries(self):
        for key in ("torch", "diffusers", "transformers", "tensorrt_llm"):
            if key in self._manifest_done:
                continue
            mod = sys.modules.get(key)
            ver = getattr(mod, "__version__", None) if mod is not None else None
            if ver is not None:
                self.manifest(key, str(ver))

    def manifest_dtypes(self):
        """Manifest "dtypes": torch's dtype settings and each component's
        output dtype as tapped (what a bf16-vs-fp32 comparison compared)."""
        torch = self._torch
        if torch is None:
            return
        d = {"outputs": dict(self._dtypes)}
        try:
            d["default_dtype"] = str(torch.get_default_dtype()).replace("torch.", "")
            getp = getattr(torch, "get_float32_matmul_precision", None)
            if getp is not None:
                d["float32_matmul_precision"] = getp()
            be = getattr(torch, "backends", None)
            if be is not None:
                d["cuda_matmul_allow_tf32"] = bool(be.cuda.matmul.allow_tf32)
                d["cudnn_allow_tf32"] = bool(be.cudnn.allow_tf32)
                d["cuda_matmul_allow_bf16_reduced_precision_reduction"] = bool(
                    getattr(be.cuda.matmul, "allow_bf16_reduced_precision_reduction", False))
        except Exception:
            pass
        self.manifest("dtypes", d)

    def manifest_scheduler(self, obj):
        """Manifest "scheduler": the scheduler's class and configuration
        (diffusers: obj.config; otherwise its public plain attributes), keys
        sorted, so that probe-compare can tell two runs' schedulers apart."""
        cfg = getattr(obj, "config", None)
        if isinstance(cfg, dict):
            items = list(cfg.items())
        else:
            try:
                items = list(vars(obj).items())
            except TypeError:
                items = []

        def plain(v):
            if v is None or isinstance(v, (bool, int, str)):
                return v
            if isinstance(v, float):
                return v if math.isfinite(v) else repr(v)
            if isinstance(v, (list, tuple)) and all(plain(x) is not _SKIP for x in v):
                return [plain(x) for x in v]
            return _SKIP

        conf = {}
        for k, v in items:
            if not isinstance(k, str) or k.startswith("_"):
                continue
            pv = plain(v)
            if pv is not _SKIP:
                conf[k] = pv
        t = type(obj)
        self.manifest("scheduler", {"class": "%s.%s" % (t.__module__, t.__qualname__),
                                    "config": dict(sorted(conf.items()))})

    # -- exit --------------------------------------------------------------
    def at_exit(self):
        if self._exited:
            return
        if not self.enabled or not self.lib.enabled():
            return  # nothing to flush, or the library already reported why
        self._exited = True
        try:
            self.manifest_threads()
        except Exception:
            pass
        if self.lib.sidecar is not None and self._child_exit and self._role_done == "worker":
            self._flush_at_exit()
            return  # a worker: the run's main process reports unmatched patterns
        if not self._role_done and _run_wrote_something():
            # This process called no component while another process of the run
            # captured (a multiprocessing parent): that one reports patterns.
            self._flush_at_exit()
            return
        # A --tap or --scope that wrapped nothing is almost always a class name
        # that does not exist in this program (a typo, another version).
        try:
            for kind, comp, text in self.table.unused_user_patterns():
                _note_stderr("%s %s=%s matched no method in this run: no class named like '%s' "
                             "with a method '%s' was defined or imported (classes are matched by "
                             "their name, e.g. WanTransformerBlock.forward)"
                             % (kind, comp, text, text.rsplit(":", 1)[-1].rsplit(".", 1)[0],
                                text.rsplit(".", 1)[-1]))
        except Exception:
            pass
        try:
            self._note_unmatched()
        except Exception:
            pass
        try:
            for comp, pats in self.table.unused_enabled_rows():
                _note_stderr("opt-in component %s (probe-run --blocks) matched no method in this "
                             "run: no class matched %s; name the class with --tap %s=Class.forward"
                             % (comp, ", ".join(pats), comp))
        except Exception:
            pass
        self._flush_at_exit()

    def _note_unmatched(self):
        """At exit: classes that match the table but were never wrapped (made
        by type(), which the class hook does not see), or, in a process that
        imported torch while no process of the run wrote a capture, no class
        of the table at all; one line."""
        escaped = set()
        for mod in list(sys.modules.values()):
            mname = getattr(mod, "__name__", None)
            d = getattr(mod, "__dict__", None)
            if not isinstance(d, dict):
                continue
            for value in list(d.values()):
                # type(value), not isinstance: some module attributes warn on __class__
                if not issubclass(type(value), type) or value.__dict__.get("__module__") != mname:
                    continue
                try:
                    found = self.table.match(value)
                except Exception:
                    continue
                for method, component in found:
                    f = getattr(value, method, None)
                    if f is not None and getattr(f, "__probe_component__", None) is None:
                        escaped.add("%s.%s.%s -> %s" % (mname, value.__qualname__, method,
                                                           component))
        if escaped:
            names = sorted(escaped)
            _note_stderr("classes created without a class statement (type()) match the component "
                         "table but were never wrapped, so their calls were not captured: %s"
                         % ", ".join(names[:8] + (["..."] if len(names) > 8 else [])))
        elif not self.wrapped and "torch" in sys.modules and not _run_wrote_something():
            _note_stderr("pid %d imported torch but no class matched the component table "
                         "(%s): nothing of this process was captured; name the classes with "
                         "--tap COMPONENT=Class.method" % (os.getpid(), self.table.path))

    def _flush_at_exit(self):
        try:
            self.manifest_libraries()
            self.manifest_dtypes()
            rc = self.lib.flush()
            # 3 (PROBE_EIO): capture was disabled by an I/O error, which the
            # library has already reported in its one `probe:` line.
            if rc not in (0, 3):
                _note_stderr("probe_tap_flush_v1 failed with status %d: the capture file may be incomplete" % rc)
        except Exception as e:
            _note_stderr("flush at exit failed: %s" % e)

    def _move_atexit_last(self):
        # atexit runs handlers last-registered-first: registering again after
        # torch (and its CUDA users) registered theirs makes the flush run
        # while CUDA is still usable.
        self._atexit_moved = True
        atexit.unregister(self.at_exit)
        atexit.register(self.at_exit)

    def after_fork_in_child(self):
        was = self.enabled
        try:
            self.enabled = bool(self.lib.enabled())
        except Exception:
            self.enabled = False
        parent, self.pid = self.pid, os.getpid()
        self._tls = threading.local()
        self._lock = threading.Lock()
        if self.enabled:
            # The parent had not opened the capture file: this child is a
            # fresh process of the run, counting its own calls from 0.
            self._calls = {name: 0 for name in self.table.names}
            self._steps_done = self._dit_in_step = 0
            self._dit_instance = self._sched_instance = None
            self._cfg_batched = []
            self._threads = {}
            self._dtypes = {}
            self._role_done = False
            self._exited = False
            self._child_exit = False
        elif was:
            self._missed = {}
            self._fork_parent = parent

    def _miss(self, component):
        """Count a call this forked child cannot capture; the first one
        arranges the one line at exit."""
        with self._lock:
            first = not self._missed
            self._missed[component] = self._missed.get(component, 0) + 1
        if first:
            atexit.register(self._report_missed)
            self._at_mp_exit(self._report_missed)
            self._before_os_exit(self._report_missed)

    @staticmethod
    def _before_os_exit(fn):
        """Run fn before os._exit in this process: a forked child often ends
        with os._exit, which runs no atexit handler. fn's errors are ignored;
        os._exit then does what it did."""
        orig = os._exit
        if getattr(orig, "__probe_wrapped__", False):
            return

        @functools.wraps(orig)
        def _exit(status):
            try:
                fn()
            except Exception:
                pass
            orig(status)
        _exit.__probe_wrapped__ = True
        os._exit = _exit

    def _report_missed(self):
        missed, self._missed = self._missed, None
        if not missed:
            return
        what = ", ".join("%s (%d call%s)" % (c, n, "" if n == 1 else "s")
                         for c, n in sorted(missed.items()))
        _note_stderr("pid %d did not capture %s: it was forked from pid %d after that process "
                     "opened the capture file, and such a child never captures (start it with "
                     "the spawn start method, or before the first capture)"
                     % (os.getpid(), what, self._fork_parent))

    @staticmethod
    def _at_mp_exit(fn):
        """Run fn when this multiprocessing child leaves its target: a forked
        child ends with os._exit, which runs no atexit handler."""
        if _mp_child() is None:
            return
        try:
            import multiprocessing.util as mpu
            mpu.Finalize(None, fn, exitpriority=-1000)
        except Exception:
            pass

    def _close_at_child_exit(self):
        self.at_exit()
        close = self.lib.close
        if close is not None:
            rc = close()
            if rc not in (0, 3):
                _note_stderr("probe_tap_close_v1 failed with status %d: the capture file may be "
                             "incomplete" % rc)

    def _first_call(self, component):
        """This process's first component call: a multiprocessing child that
        is a DataLoader worker, or whose first call is not one of the
        pipeline's own, is a worker and writes its own file; any
        multiprocessing child closes its file when it leaves its target."""
        ident = _mp_child()
        if ident is None:
            self._role_done = "main"
            return
        role = "main"
        name = "proc" + ("-".join(str(i) for i in ident) if ident else "-pid%d" % os.getpid())
        if (component not in self._pipeline_own or _dataloader_worker()) and self.lib.sidecar is not None:
            rc = self.lib.sidecar(name.encode())
            if rc == 0:
                role = "worker"
            else:
                self.note("sidecar", "probe_tap_sidecar_v1(%s) failed with status %d: this worker "
                          "writes to the run's capture file if it is free" % (name, rc))
        elif self.lib.sidecar is not None:
            # a child running the pipeline: the run's file if it is free (the
            # first of a pool of pipeline processes), else its own
            rc = self.lib.sidecar_if_taken(name.encode())
            if rc != 0:
                self.note("sidecar", "probe_tap_sidecar_if_taken_v1(%s) failed with status %d"
                          % (name, rc))
        self._role_done = role
        self._child_exit = True
        self._at_mp_exit(self._close_at_child_exit)

    def manifest_threads(self):
        """Manifest "threads": for each thread other than the main one that
        called components, its name and its calls per component."""
        with self._lock:
            d = {tag: {"name": t["name"], "calls": {c: n for c, n in sorted(t["calls"].items()) if n}}
                 for tag, t in sorted(self._threads.items())}
        if d:
            self.manifest("threads", d)

    # -- torch -------------------------------------------------------------
    def _get_torch(self):
        t = self._torch
        if t is None:
            t = sys.modules.get("torch")
            if t is None or not hasattr(t, "Tensor"):
                return None
            self._torch = t
            codes = {}
            for name, code in _DTYPE_CODES:
                dt = getattr(t, name, None)
                if dt is not None and isinstance(dt, t.dtype):
                    codes[dt] = code
            self._dtype_codes = codes
        return t

    # -- classes -------------------------------------------------------------
    def consider_class(self, cls):
        for method, component in self.table.match(cls):
            self._wrap_method(cls, method, component)

    def _wrap_method(self, cls, method, component):
        raw = None
        for klass in cls.__mro__:
            if method in klass.__dict__:
                raw = klass.__dict__[method]
                break
        if raw is None:
            return
        if isinstance(raw, staticmethod):
            kind, func = "static", raw.__func__
        elif isinstance(raw, classmethod):
            kind, func = "class", raw.__func__
        elif isinstance(raw, types.FunctionType):
            kind, func = "function", raw
        else:
            self.note("kind-" + type(raw).__name__,
                      "%s.%s.%s is a %s, not a function: not tapped"
                      % (cls.__module__, cls.__qualname__, method, type(raw).__name__))
            return
        if not callable(func) or getattr(func, "__probe_component__", None) is not None:
            return  # already wrapped (here or in a base class)
        wrapper = self._make_wrapper(func, component, cls, kind)
        if kind == "static":
            wrapper = staticmethod(wrapper)
        elif kind == "class":
            wrapper = classmethod(wrapper)
        try:
            setattr(cls, method, wrapper)
        except (AttributeError, TypeError) as e:
            self.note("setattr-" + cls.__qualname__, "cannot wrap %s.%s.%s: %s"
                      % (cls.__module__, cls.__qualname__, method, e))
            return
        self.wrapped.append("%s.%s.%s -> %s" % (cls.__module__, cls.__qualname__, method, component))

    def _make_wrapper(self, func, component, owner=None, kind="function"):
        rt = self
        sig_cache = []

        def signature():
            if not sig_cache:
                try:
                    sig_cache.append(inspect.signature(func))
                except (TypeError, ValueError):
                    sig_cache.append(None)
            return sig_cache[0]

        scope_only = component in self.table.scope_only

        @functools.wraps(func)
        def probe_wrapper(*args, **kwargs):
            if not rt.enabled:
                if rt._missed is not None:
                    rt._miss(component)
                return func(*args, **kwargs)
            if scope_only:
                try:
                    stack = rt._stack()
                    scoped = rt._scope_enter(rt._begin(component, stack[-1] if stack else None,
                                                       rt._class_of(owner, kind, args)))
                except Exception as e:
                    scoped = False
                    rt.note("internal-scope", "adapter error while opening scope %s: %s: %s"
                            % (component, type(e).__name__, e))
                try:
                    return func(*args, **kwargs)
                finally:
                    if scoped:
                        rt._scope_exit()
            active = getattr(rt._tls, "active", None)
            if active is None:
                active = rt._tls.active = set()
            if component in active or (rt._opaque and not rt._opaque.isdisjoint(active)):
                return func(*args, **kwargs)
            active.add(component)
            stack = rt._stack()
            scoped = pushed = False
            try:
                parent = stack[-1] if stack else None
                ctx = rt._begin(component, parent, rt._class_of(owner, kind, args))
                if kind == "function" and args:
                    ctx["obj"] = args[0]
                    ctx["module"] = rt._module_path(args[0], parent)
                stack.append(ctx)
                pushed = True
                if component == "dit.step" and ctx["parent"] is None:
                    try:
                        rt._cfg_batch(ctx, args, kwargs)
                    except Exception as e:
                        rt.note("internal-cfg", "adapter error while checking the CFG batch "
                                "of %s: %s: %s" % (component, type(e).__name__, e))
                try:
                    args, kwargs = rt._tap_inputs(ctx, signature(), args, kwargs)
                except Exception as e:
                    rt.note("internal-in", "adapter error while tapping inputs of %s: %s: %s"
                            % (component, type(e).__name__, e))
                scoped = rt._scope_enter(ctx)
                result = func(*args, **kwargs)
            finally:
                if scoped:
                    rt._scope_exit()
                if pushed:
                    rt._pop(stack, ctx)
                active.discard(component)
            rt._end(component)
            try:
                rt._tap_output(ctx, result, args[0] if args else None)
            except Exception as e:
                rt.note("internal-out", "adapter error while tapping the output of %s: %s: %s"
                        % (component, type(e).__name__, e))
            return result

        probe_wrapper.__probe_component__ = component
        # torch.compile: dynamo must not trace the wrapper (its ctypes calls
        # and record_stream would end up in a graph). This attribute makes
        # dynamo break the graph at a call of the wrapper and run it eagerly;
        # the wrapper's code object is also marked "skip" once
        # torch._dynamo is loaded (watch_dynamo), so dynamo does not compile
        # the wrapper's own frame either but still compiles the wrapped
        # method's frame (the same as torch.compiler.disable(recursive=False)).
        probe_wrapper._torchdynamo_disable = True
        if self._wrapper_code is None:
            self._wrapper_code = probe_wrapper.__code__
        return probe_wrapper

    # -- per call bookkeeping ----------------------------------------------
    def _stack(self):
        """The tapped component calls open on this thread, outermost first."""
        stack = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        return stack

    @staticmethod
    def _pop(stack, ctx):
        """Remove the call ctx from this thread's stack (normally its top)."""
        if stack and stack[-1] is ctx:
            stack.pop()
            return
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is ctx:
                del stack[i]
                return

    def _class_of(self, owner, kind, args):
        """"module.Qualname" of the object whose method runs: the instance's
        class for a method, the class for a classmethod, the class the method
        was wrapped on otherwise (a staticmethod). None when unknown."""
        try:
            t = owner
            if args and kind == "function" and (owner is None or isinstance(args[0], owner)):
                t = type(args[0])
            elif args and kind == "class" and isinstance(args[0], type):
                t = args[0]
            if t is None:
                return None
            name = self._class_names.get(t)
            if name is None:
                text = "%s.%s" % (getattr(t, "__module__", None) or "?",
                                  getattr(t, "__qualname__", None) or t.__name__)
                name = text.encode("utf-8", "replace")[:255].decode("utf-8", "ignore")
                name = "".join(c for c in name if ord(c) >= 0x20 and ord(c) != 0x7f)
                self._class_names[t] = name
            return name
        except Exception:
            return None

    def _submodule_names(self, mod):
        """{id(submodule): dotted name} of an nn.Module-like object (one with
        named_modules()), built once per object; {} otherwise."""
        key = id(mod)
        hit = self._module_maps.get(key)
        if hit is not None and hit[0]() is mod:
            return hit[1]
        names = {}
        named = getattr(type(mod), "named_modules", None)
        if callable(named):
            for name, sub in named(mod):
                if name:
                    names.setdefault(id(sub), name)
        try:
            self._module_maps[key] = (weakref.ref(mod), names)
        except TypeError:
            pass
        return names

    def _cached_module_path(self, obj):
        hit = self._module_paths.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else None

    @staticmethod
    def _is_compiled_wrapper_of(v, obj):
        """v is torch.compile's wrapper (OptimizedModule) of obj."""
        if type(v).__name__ != "OptimizedModule":
            return False
        inner = getattr(v, "__dict__", {}).get("_modules", {}).get("_orig_mod")
        return inner is obj or v.__dict__.get("_orig_mod") is obj

    def _module_path(self, obj, parent):
        """The module path of obj, the object whose wrapped method runs:
          * inside another component's call whose object has a module tree
            (an nn.Module), obj's dotted name in that tree, after the
            parent's own module path: "transformer.blocks.3";
          * otherwise the attribute that holds obj on the `self` of the
            nearest calling frame that has one (the pipeline: "text_encoder_2",
            "transformer_2", "scheduler"; a torch.compile wrapper held there
            counts as obj), or obj's dotted name in that self's module tree,
            after that self's own module path when it has one.
        Found once per object (weak reference; the result is kept for the
        object's life) and cut to 255 bytes. None when not found (obj is
        the pipeline itself, or is called from code without a `self`)."""
        try:
            hit = self._module_paths.get(id(obj))
            if hit is not None and hit[0]() is obj:
                return hit[1]
            path = None
            if parent is not None and parent.get("obj") is not None and parent["obj"] is not obj:
                name = self._submodule_names(parent["obj"]).get(id(obj))
                if name:
                    pp = parent.get("module")
                    path = pp + "." + name if pp else name
            if path is None:
                f = sys._getframe(2)
                for _ in range(12):
                    if f is None:
                        break
                    code = f.f_code
                    if code.co_argcount and code.co_varnames[0] == "self" and \
                            code is not self._wrapper_code:
                        holder = f.f_locals.get("self")
                        if holder is not None and holder is not obj and \
                                not self._is_compiled_wrapper_of(holder, obj):
                            name = None
                            for k, v in getattr(holder, "__dict__", {}).items():
                                if isinstance(k, str) and (v is obj or
                                                           self._is_compiled_wrapper_of(v, obj)):
                                    name = k
                                    break
                            if name is None:
                                name = self._submodule_names(holder).get(id(obj))
                            if name:
                                hp = self._cached_module_path(holder)
                                path = hp + "." + name if hp else name
                                break
                    f = f.f_back
            if path is not None:
                path = path.encode("utf-8", "replace")[:255].decode("utf-8", "ignore")
                path = "".join(c for c in path if ord(c) >= 0x20 and ord(c) != 0x7f) or None
            try:
                self._module_paths[id(obj)] = (weakref.ref(obj), path)
            except TypeError:
                pass
            return path
        except Exception:
            return None

    def _begin(self, component, parent=None, cls=None):
        """The context of a new call of component: its call index, step, CFG
        branch, and, inside the call `parent` (the enclosing tapped call on
        this thread), the parent's path and this call's block index; a nested
        call whose step or branch is unknown takes the parent's."""
        if not self._role_done:
            self._first_call(component)
        tag, base = self._thread_state(), component
        with self._lock:
            st = self._threads[tag] if tag is not None else None
            calls = st["calls"] if st is not None else self._calls
            call = calls.get(component, 0)
            calls[component] = call + 1
            steps = st["steps"] if st is not None else self._steps_done
            if component == "dit.step":
                nv = self.nvtx.enclosing_step()
                step = steps
                if st is not None:
                    if nv is not None:
                        step = nv[0]
                        if nv[1] != st.get("dit_instance"):
                            st["dit"] = 0
                        st["dit_instance"] = nv[1]
                    cfg = st["dit"]
                    st["dit"] += 1
                else:
                    if nv is not None:
                        step = nv[0]
                        if nv[1] != self._dit_instance:
                            self._dit_in_step = 0
                        self._dit_instance = nv[1]
                    cfg = self._dit_in_step
                    self._dit_in_step += 1
            elif component in ("scheduler.step", "controlnet"):
                nv = (self.nvtx.last_step() if component == "scheduler.step"
                      else self.nvtx.enclosing_step())
                step, cfg = steps, -1
                done = st.get("sched_instance") if st is not None else self._sched_instance
                if nv is not None and (component == "controlnet" or nv[1] != done):
                    step = nv[0]
            else:
                step, cfg = -1, -1
        if tag is not None:
            # a component name is at most 127 bytes (tap.h): the tag gives way
            room = 126 - len(component.encode("utf-8"))
            component = "%s@%s" % (component, tag[:max(room, 1)])
        parent_path, block = None, -1
        if parent is not None:
            if step < 0:
                step = parent["step"]
            if cfg < 0:
                cfg = parent["cfg"]
            kids = parent["children"]
            block = kids.get(component, 0)
            kids[component] = block + 1
            parent_path = "/%s/%04d" % (parent["component"], parent["call"])
        return {"component": component, "call": call, "step": step, "cfg": cfg,
                "timestep": math.nan, "parent": parent_path, "block": block, "class": cls,
                "children": {}, "base": base}

    def _thread_state(self):
        """None on the main thread; otherwise this thread's tag, its counters
        created at its first call."""
        tls = self._tls
        tag = getattr(tls, "tag", False)
        if tag is not False:
            return tag
        cur = threading.current_thread()
        if cur is threading.main_thread():
            tag = None
        else:
            tag = _thread_tag(cur.name)
            with self._lock:
                if tag not in self._threads:
                    self._threads[tag] = {"name": cur.name, "calls": {}, "steps": 0, "dit": 0}
        tls.tag = tag
        return tag

    def _scope_enter(self, ctx):
        """Announce the component call to the shim (probe_scope_enter_v1), so
        the GEMMs, collectives and kernels it issues on this thread are
        attributed to /<component>/<call>. True when a scope was opened."""
        enter = self.lib.scope_enter
        if enter is None:
            return False
        try:
            desc = _abi.ProbeScopeV1(
                struct_size=ctypes.sizeof(_abi.ProbeScopeV1),
                abi_version=_abi.PROBE_TAP_ABI_VERSION,
                component=ctx["component"].encode(),
                call=ctx["call"], step=ctx["step"], cfg_branch=ctx["cfg"],
                parent=ctx["parent"].encode() if ctx.get("parent") else None,
                block=ctx.get("block", -1))
            rc = enter(ctypes.byref(desc))
        except Exception as e:
            self.note("internal-scope", "adapter error while opening scope %s: %s: %s"
                      % (ctx.get("component"), type(e).__name__, e))
            return False
        if rc != 0:
            self.note("scope-%d" % rc, "probe_scope_enter_v1 refused %s with status %d"
                      % (ctx["component"], rc))
            return False
        return True

    def _scope_exit(self):
        rc = self.lib.scope_exit()
        if rc != 0:
            self.note("scope-exit-%d" % rc, "probe_scope_exit_v1 failed with status %d" % rc)

    def _end(self, component):
        if component == "scheduler.step":
            nv = self.nvtx.last_step()
            tag = self._thread_state()
            with self._lock:
                if tag is None:
                    self._steps_done += 1
                    self._dit_in_step = 0
                    self._dit_instance = None
                    self._sched_instance = nv[1] if nv is not None else None
                else:
                    st = self._threads[tag]
                    st["steps"] += 1
                    st["dit"] = 0
                    st["dit_instance"] = None
                    st["sched_instance"] = nv[1] if nv is not None else None
            self.nvtx.scheduler_completed()

    def _scheduler_range_end(self):
        """A `_scheduler_step` NVTX range closed without a tapped
        scheduler.step inside: one denoising step completed."""
        tag = self._thread_state()
        with self._lock:
            if tag is None:
                self._steps_done += 1
                self._dit_in_step = 0
                self._dit_instance = None
            else:
                st = self._threads[tag]
                st["steps"] += 1
                st["dit"] = 0
                st["dit_instance"] = None

    def watch_nvtx(self):
        """Wrap the `nvtx` package (now, if it is imported; else when it is)."""
        mod = sys.modules.get("nvtx")
        if mod is not None:
            self._wrap_nvtx(mod)
        else:
            sys.meta_path.insert(0, _PostImportHook("nvtx", self._wrap_nvtx))

    def _wrap_nvtx(self, mod):
        try:
            self.nvtx.wrap(mod)
        except Exception as e:
            self.note("nvtx-wrap", "cannot follow the nvtx package's ranges: %s: %s"
                      % (type(e).__name__, e))

    def _cfg_batch(self, ctx, args, kwargs):
        """Record a dit.step call whose latent input holds both CFG branches
        (twice the batch of the last latents.init output) in the manifest
        key cfg_batch."""
        torch = self._get_torch()
        if torch is None or self._latent_batch is None:
            return
        x = _cfg.latent_input(torch, args, kwargs)
        if x is None or x.dim() == 0 or int(x.shape[0]) != 2 * self._latent_batch:
            return
        with self._lock:
            self._cfg_batched.append(ctx["call"])
            calls = list(self._cfg_batched)
        self.manifest("cfg_batch", {"component": "dit.step", "order": list(_cfg.BATCH_ORDER),
                                    "latent_batch": self._latent_batch, "calls": calls})

    # -- tapping -------------------------------------------------------------
    def _first_sight_of_torch(self):
        if not self._atexit_moved:
            self._move_atexit_last()
        self.manifest_libraries()

    def _tap_inputs(self, ctx, sig, args, kwargs):
        """Tap the tensor arguments; returns (args, kwargs) for the call,
        with injected inputs substituted (the caller's tensors untouched)."""
        torch = self._get_torch()
        if torch is None:
            return args, kwargs  # no torch imported: there is no tensor to tap
        if not self._atexit_moved or "diffusers" not in self._manifest_done:
            self._first_sight_of_torch()
        Tensor = torch.Tensor
        items = None  # (name, value, origin)
        bound = None
        if sig is not None:
            try:
                bound = sig.bind(*args, **kwargs)
                items = []
                for name, value in bound.arguments.items():
                    kind = sig.parameters[name].kind
                    if kind == inspect.Parameter.VAR_KEYWORD and isinstance(value, dict):
                        items.extend((k, v, ("varkw", name, k)) for k, v in value.items())
                    else:
                        items.append((name, value, ("arg", name)))
            except TypeError:
                items = None
                bound = None
        if items is None:
            items = ([("arg%d" % i, v, ("pos", i)) for i, v in enumerate(args)] +
                     [(k, v, ("key", k)) for k, v in kwargs.items()])
        for name, value, _ in items:
            if name in _TIMESTEP_ARGS:
                ctx["timestep"] = self._timestep_value(torch, value)
        replaced = []
        for name, value, origin in items:
            slot = "in." + _slot_part(name)
            if isinstance(value, Tensor):
                new = self._inject_input(ctx, slot, value)
                self._tap(ctx, slot, new)
                if new is not value:
                    replaced.append((origin, new))
            elif isinstance(value, (list, tuple)):
                vals, changed = list(value), False
                for i, v in enumerate(vals):
                    if isinstance(v, Tensor):
                        nv = self._inject_input(ctx, "%s.%d" % (slot, i), v)
                        self._tap(ctx, "%s.%d" % (slot, i), nv)
                        if nv is not v:
                            vals[i], changed = nv, True
                if changed:
                    if isinstance(value, tuple) and hasattr(value, "_fields"):
                        new = type(value)(*vals)  # namedtuple
                    elif isinstance(value, tuple):
                        new = tuple(vals)
                    else:
                        new = vals
                    replaced.append((origin, new))
            elif isinstance(value, dict):
                new, changed = dict(value), False
                for k, v in value.items():
                    if isinstance(v, Tensor):
                        nv = self._inject_input(ctx, "%s.%s" % (slot, _slot_part(k)), v)
                        self._tap(ctx, "%s.%s" % (slot, _slot_part(k)), nv)
                        if nv is not v:
                            new[k], changed = nv, True
                if changed:
                    replaced.append((origin, new))
        if not replaced:
            return args, kwargs
        if bound is not None:
            for origin, new in replaced:
                if origin[0] == "arg":
                    bound.arguments[origin[1]] = new
                else:  # varkw
                    d = dict(bound.arguments[origin[1]])
                    d[origin[2]] = new
                    bound.arguments[origin[1]] = d
            return tuple(bound.args), dict(bound.kwargs)
        args, kwargs = list(args), dict(kwargs)
        for origin, new in replaced:
            if origin[0] == "pos":
                args[origin[1]] = new
            else:
                kwargs[origin[1]] = new
        return tuple(args), kwargs

    # -- injection -----------------------------------------------------------
    def _inject_wanted(self, ctx, slot):
        """Pre-filter with the shim's glob rule (fnmatch, '*' matches '/', a
        glob without a leading '/' also tried without the path's '/'); the
        shim decides. A glob with a backslash is left to the shim."""
        globs = self._inject_globs
        if not globs or self.table.slot_excluded(ctx.get("base", ctx["component"]), slot):
            return False
        path = "/%s/%04d/%s" % (ctx["component"], ctx["call"], slot)
        for g in globs:
            if "\\" in g or fnmatch.fnmatchcase(path, g) or (
                    not g.startswith("/") and fnmatch.fnmatchcase(path[1:], g)):
                return True
        return False

    def _inject(self, ctx, slot, t):
        desc = self._describe(ctx, slot, t)
        if desc is None:
            return _abi.PROBE_INJECT_NONE
        return self.lib.inject(ctypes.byref(desc))

    def _inject_input(self, ctx, slot, t):
        """A component input: the reference's value in a new contiguous
        tensor (returned), or t itself when nothing is injected."""
        if not self._inject_wanted(ctx, slot):
            return t
        torch = self._torch
        try:
            tmp = torch.empty_like(t, memory_format=torch.contiguous_format)
        except Exception as e:
            self.note("inject-alloc", "cannot allocate a tensor to inject /%s/%04d/%s: %s"
                      % (ctx["component"], ctx["call"], slot, e))
            return t
        return tmp if self._inject(ctx, slot, tmp) == _abi.PROBE_INJECT_DONE else t

    def _inject_output(self, ctx, slot, t):
        """A source's output: replaced in place (the pipeline goes on with it)."""
        if not self._inject_wanted(ctx, slot):
            return
        torch = self._torch
        if t.device.type == "cuda" and not t.is_contiguous():
            tmp = torch.empty_like(t, memory_format=torch.contiguous_format)
            if self._inject(ctx, slot, tmp) == _abi.PROBE_INJECT_DONE:
                with torch.no_grad():
                    t.copy_(tmp)
        else:
            self._inject(ctx, slot, t)

    def _timestep_value(self, torch, value):
        try:
            if isinstance(value, bool):
                return math.nan
            if isinstance(value, numbers.Real):
                return float(value)
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu" or value.is_complex():
                    return math.nan
                n = value.numel()
                if n == 1:
                    return float(value.reshape(-1)[0].item())
                if 1 < n <= _MAX_EQUAL_SCAN:
                    flat = value.reshape(-1)
                    first = flat[0]
                    if bool((flat == first).all()):
                        return float(first.item())
        except Exception:
            pass
        return math.nan

    def _tap_output(self, ctx, result, obj=None):
        torch = self._get_torch()
        if torch is None:
            return
        Tensor = torch.Tensor
        outs = []
        if isinstance(result, Tensor):
            outs.append(("out", result))
        else:
            for key, value in self._children(result, Tensor):
                slot = "out." + _slot_part(key)
                if isinstance(value, Tensor):
                    outs.append((slot, value))
                    continue
                for key2, value2 in self._children(value, Tensor):
                    if isinstance(value2, Tensor):
                        outs.append(("%s.%s" % (slot, _slot_part(key2)), value2))
        base = ctx.get("base", ctx["component"])
        attrs = self._out_attrs.get(base)
        if attrs and obj is not None:
            # set_timesteps & co return nothing: what they set is the output
            for a in attrs:
                v = getattr(obj, a, None)
                if isinstance(v, Tensor):
                    outs.append(("out." + _slot_part(a), v))
            if base == "timesteps":
                self.manifest_scheduler(obj)
        for slot, t in outs:
            if self.table.slot_excluded(ctx.get("base", ctx["component"]), slot):
                continue
            self._inject_output(ctx, slot, t)
            self._tap(ctx, slot, t)
        if base == "latents.init":
            b = _cfg.latent_batch(torch, result)
            if b:
                self._latent_batch = b

    @staticmethod
    def _children(obj, Tensor):
        """(key, value) pairs one level into a structured output (_slots.children)."""
        return _slots.children(obj, lambda x: isinstance(x, Tensor))

    def _describe(self, ctx, slot, t):
        """The tap descriptor of t (its shape/strides arrays are kept alive
        by ctypes), or None for a tensor probe does not capture (noted once)."""
        torch = self._torch
        component = ctx["component"]
        if t.layout != torch.strided:
            self.note("layout-%s" % t.layout, "%s tensors are not captured (first: /%s/%04d/%s)"
                      % (t.layout, component, ctx["call"], slot))
            return None
        if t.is_quantized:
            self.note("quantized", "quantized tensors are not captured (first: /%s/%04d/%s)"
                      % (component, ctx["call"], slot))
            return None
        if t.is_complex():
            self.note("complex", "complex tensors are not captured (first: /%s/%04d/%s)"
                      % (component, ctx["call"], slot))
            return None
        dev = t.device
        if dev.type == "cpu":
            device = -1
        elif dev.type == "cuda":
            device = dev.index if dev.index is not None else torch.cuda.current_device()
        else:
            self.note("device-" + dev.type, "tensors on %s devices are not captured (first: /%s/%04d/%s)"
                      % (dev.type, component, ctx["call"], slot))
            return None
        code = self._dtype_codes.get(t.dtype)
        if code is None:
            self.note("dtype-%s" % t.dtype, "%s tensors are not captured (first: /%s/%04d/%s)"
                      % (t.dtype, component, ctx["call"], slot))
            return None
        rank = t.dim()
        if rank > _abi.PROBE_MAX_RANK:
            self.note("rank", "tensors of rank > %d are not captured (first: /%s/%04d/%s)"
                      % (_abi.PROBE_MAX_RANK, component, ctx["call"], slot))
            return None
        try:
            data = t.data_ptr()
        except Exception as e:  # tensor subclasses without storage (DTensor, fake tensors, ...)
            self.note("noptr-" + type(t).__name__, "%s has no data pointer, not captured (first: /%s/%04d/%s): %s"
                      % (type(t).__name__, component, ctx["call"], slot, e))
            return None
        shape = (ctypes.c_int64 * max(rank, 1))(*t.shape)
        strides = (ctypes.c_int64 * max(rank, 1))(*t.stride())
        stream = None
        if device >= 0:
            stream = torch.cuda.current_stream(dev).cuda_stream or None
        desc = _abi.ProbeTapTensorV1(
            struct_size=ctypes.sizeof(_abi.ProbeTapTensorV1),
            abi_version=_abi.PROBE_TAP_ABI_VERSION,
            component=component.encode(),
            slot=slot.encode(),
            call=ctx["call"],
            step=ctx["step"],
            cfg_branch=ctx["cfg"],
            device=device,
            dtype=code,
            rank=rank,
            shape=shape,
            strides=strides,
            data=data or None,
            stream=stream,
            timestep=ctx["timestep"],
            parent=ctx["parent"].encode() if ctx.get("parent") else None,
            block=ctx.get("block", -1),
            class_name=ctx["class"].encode() if ctx.get("class") else None,
            module=ctx["module"].encode() if ctx.get("module") else None,
        )
        return desc

    def _tap(self, ctx, slot, t):
        if self.table.slot_excluded(ctx.get("base", ctx["component"]), slot):
            return
        desc = self._describe(ctx, slot, t)
        if desc is None:
            return
        torch = self._torch
        component = ctx["component"]
        device = desc.device
        base = ctx.get("base", component)
        if slot.startswith("out") and base not in self._dtypes:
            self._dtypes[base] = str(t.dtype).replace("torch.", "")
        rc = self.lib.tap(ctypes.byref(desc))
        if rc != 0:
            if not self.lib.enabled():
                # The library disabled capture (it said why on stderr): stop
                # tapping, the program goes on uncaptured.
                self.enabled = False
                return
            self.note("tap-%d" % rc, "probe_tap_v1 refused /%s/%04d/%s with status %d"
                      % (component, ctx["call"], slot, rc))
            return
        if device >= 0:
            self._record_on_probe_stream(torch, t, device)

    def _record_on_probe_stream(self, torch, t, device):
        handle = self.lib.stream(device)
        if not handle:
            return
        key = (device, handle)
        ext = self._ext_streams.get(key)
        if ext is None:
            ext = torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))
            self._ext_streams[key] = ext
        try:
            t.record_stream(ext)
        except Exception as e:
            self.note("record_stream", "record_stream on probe's copy stream failed: %s" % e)

    # -- torch.compile -------------------------------------------------------
    def watch_dynamo(self):
        """Mark the wrapper's code object as skipped by dynamo as soon as
        torch._dynamo.eval_frame is loaded (now, if it already is). Does not
        import torch."""
        if self._wrapper_code is None:
            self._make_wrapper(lambda: None, self.table.names[0])  # sets _wrapper_code
        mod = sys.modules.get(_DYNAMO_EVAL_FRAME)
        if mod is not None:
            self._skip_wrapper_code(mod)
        else:
            sys.meta_path.insert(0, _PostImportHook(_DYNAMO_EVAL_FRAME, self._skip_wrapper_code))

    def _skip_wrapper_code(self, eval_frame):
        try:
            skip_code = getattr(eval_frame, "skip_code", None)
            if skip_code is not None:
                # The wrapper and every adapter function it runs (their
                # frames would otherwise be compiled one by one once the
                # wrapper's frame runs eagerly); the wrapped method is not
                # among them and is compiled as usual.
                for code in _adapter_code_objects():
                    skip_code(code)
            else:
                self.note("dynamo", "torch._dynamo has no skip_code: torch.compile may trace "
                          "probe's wrappers")
        except Exception as e:
            self.note("dynamo", "cannot keep torch.compile out of probe's wrappers: %s: %s"
                      % (type(e).__name__, e))

    # -- class discovery -----------------------------------------------------
    def install_class_hook(self):
        orig = builtins.__build_class__
        rt = self

        def __build_class__(func, name, *bases, **kwds):
            cls = orig(func, name, *bases, **kwds)
            try:
                if isinstance(cls, type):
                    rt.consider_class(cls)
            except Exception as e:
                rt.note("hook", "adapter error while checking class %s: %s: %s"
                        % (name, type(e).__name__, e))
            return cls

        __build_class__.__probe_hook__ = True
        if getattr(orig, "__probe_hook__", False):
            return  # already installed (adapter activated twice)
        self._orig_build_class = orig
        builtins.__build_class__ = __build_class__

    def scan_loaded_modules(self):
        for mod in list(sys.modules.values()):
            try:
                mname = getattr(mod, "__name__", None)
                d = getattr(mod, "__dict__", None)
                if not isinstance(d, dict):
                    continue
                for value in list(d.values()):
                    if isinstance(value, type) and getattr(value, "__module__", None) == mname:
                        self.consider_class(value)
            except Exception:
                continue
