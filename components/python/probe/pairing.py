"""probe.pairing: same-process pairing of one component, feature off and on.

    import probe
    from diffusers.models.attention_dispatch import attention_backend

    res = probe.assert_pair(
        block, args=(hidden, enc, temb, rope),
        component="dit.block",                       # the boundary, as probe-run names it
        feature=probe.feature("attn:math", on=lambda: attention_backend("_native_math")),
        reference="feature-off",                     # or "fp32-oracle", or probe.external(fn)
        gate="T1-relaxed:backend-swap")              # or "T1", or "T2" with calibration=FILE

The component (an nn.Module or any callable) runs twice on the same inputs in
this process: once as the reference, once with the feature on (the
candidate). Every tensor of its output is a slot, named as the capture side
names it (probe_adapter: "out" for a bare tensor, "out.<key>" for an element
of a tuple, list, dict, dataclass or diffusers BaseOutput, "out.<k1>.<k2>" one
level deeper, and so on); each slot pair is compared by libprobe's C metrics
and judged by the gate (with oracle=True, by the oracle verdict: no less
accurate than the reference against the component run in fp32, a third
run). docs/pairing.md is the user guide and defines exactly what is
compared.

Both sides get:
  - their own copies of the tensor inputs (tensor.clone(), so an in-place
    change made by one side never reaches the other);
  - the same random state: the torch CPU generator, the CUDA generator of
    every device involved, Python's `random`, numpy's global generator and
    every torch.Generator passed among the inputs are set to the state they
    had when pair() was called (or seeded with seed=) before each side, and
    restored afterwards (torch.random.fork_rng), so dropout and noise draws
    match;
  - the component's own state as it was: an nn.Module's buffers, or the
    instance attributes of the object whose method it is, put back before
    each side and after the pair;
  - torch.no_grad().

Where the slots are compared:
  - both on one CUDA device: on that device, by libprobe_cuda.so's
    probe_cuda_metrics on the tensors' device pointers, on torch's current
    stream (probe._cuda); no host copy;
  - otherwise on the host, by libprobe's engine (a CUDA tensor paired with a
    host one is copied to the host first).
"""

import contextlib
import ctypes
import fnmatch
import inspect
import numbers
import sys
import threading

from probe_adapter import _slots

from . import _lib

__all__ = ["pair", "assert_pair", "assert_active", "feature", "external", "output_slots",
           "Toggle", "External", "PairResult", "ActiveResult"]

REFERENCE_OFF = "feature-off"
REFERENCE_ORACLE = "fp32-oracle"


# ---------------------------------------------------------------- features

class Toggle:
    """A feature that can be switched on around a call (the duck type pair()
    accepts; probe.Feature objects of the feature table have the same
    attributes).

    id:        the feature's name (str), used in messages and records.
    gate:      the gate this feature is judged by by default, or None.
    enable():  a fresh context manager; inside it the feature is on.
    disable(): a fresh context manager for the reference side (feature off).
    """

    def __init__(self, id, on=None, off=None, enable=None, disable=None, gate=None):
        if not isinstance(id, str) or not id:
            raise TypeError("probe.feature: the name must be a non-empty str, not %r" % (id,))
        if on is not None and (enable is not None or disable is not None):
            raise ValueError("probe.feature(%r): give on= (a context manager factory) or "
                             "enable=/disable= (plain callables), not both" % id)
        for k, v in (("on", on), ("off", off), ("enable", enable), ("disable", disable)):
            if v is not None and hasattr(v, "__enter__") and not inspect.isclass(v):
                raise TypeError("probe.feature(%r): %s= is a context manager object, which is used "
                                "once; pass a factory that makes a fresh one, e.g. "
                                "lambda: attention_backend('flash')" % (id, k))
            if v is not None and not callable(v):
                raise TypeError("probe.feature(%r): %s= must be callable, not %s"
                                % (id, k, type(v).__name__))
        if on is None and enable is None:
            raise ValueError("probe.feature(%r): give on= (a context manager factory) or enable= "
                             "(a callable that switches the feature on)" % id)
        if gate is not None and not isinstance(gate, str):
            raise TypeError("probe.feature(%r): gate must be a str such as 'T1', not %r" % (id, gate))
        self.id = id
        self.gate = gate
        self._on, self._off, self._enable, self._disable = on, off, enable, disable

    def enable(self):
        if self._on is not None:
            return self._on()
        return _switch(self._enable, self._disable)

    def disable(self):
        return self._off() if self._off is not None else contextlib.nullcontext()

    def __repr__(self):
        return "probe.feature(%r)" % self.id


@contextlib.contextmanager
def _switch(enable, disable):
    enable()
    try:
        yield
    finally:
        if disable is not None:
            disable()


def feature(name, on=None, off=None, *, enable=None, disable=None, gate=None):
    """A Toggle: the feature `name`, switched on by the context manager that
    on() returns (e.g. on=lambda: attention_backend("_native_flash")), or by
    the plain callables enable() before and disable() after the call (e.g.
    enable=lambda: model.set_attention_backend("flash"),
    disable=model.reset_attention_backend). off: a context manager factory
    for the reference side (default: nothing). gate: the feature's default
    gate."""
    return Toggle(name, on=on, off=off, enable=enable, disable=disable, gate=gate)


class _Feat:
    def __init__(self, id, on, off, gate, toggles):
        self.id, self.on, self.off, self.gate, self.toggles = id, on, off, gate, toggles


def _as_feature(f):
    if isinstance(f, str):
        if not f:
            raise ValueError("probe: feature must not be an empty name")
        return _Feat(f, contextlib.nullcontext, contextlib.nullcontext, None, False)
    fid = getattr(f, "id", None)
    en = getattr(f, "enable", None)
    if isinstance(fid, str) and fid and callable(en):
        dis = getattr(f, "disable", None)
        gate = getattr(f, "gate", None)
        if gate is not None and not isinstance(gate, str):
            raise TypeError("probe: feature %r has gate %r, not a str" % (fid, gate))
        return _Feat(fid, en, dis if callable(dis) else contextlib.nullcontext, gate, True)
    if callable(f) or hasattr(f, "__enter__"):
        raise TypeError("probe: feature must be named: probe.feature('NAME', on=%s) (or an object "
                        "with .id and .enable(), or a str for a feature the component has as "
                        "given), not a bare %s" % ("FACTORY" if callable(f) else "lambda: CM",
                                                   type(f).__name__))
    raise TypeError("probe: feature must be probe.feature(...), an object with .id (str) and "
                    ".enable() (returning a context manager), or a str; not %s" % type(f).__name__)


@contextlib.contextmanager
def _entered(factory, fid, what):
    cm = factory()
    if not (hasattr(cm, "__enter__") and hasattr(cm, "__exit__")):
        raise TypeError("probe: feature %r: %s returned %s, not a context manager"
                        % (fid, what, type(cm).__name__))
    with cm:
        yield


# ---------------------------------------------------------------- references

class External:
    """An external implementation used as the reference: fn(*args, **kwargs)
    on the same inputs, run without the feature's context."""

    def __init__(self, fn, name=None):
        if not callable(fn):
            raise TypeError("probe.external: fn must be callable, not %s" % type(fn).__name__)
        if name is not None and not isinstance(name, str):
            raise TypeError("probe.external: name must be a str, not %r" % (name,))
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__

    def __repr__(self):
        return "external:%s" % self.name


def external(fn, name=None):
    """The reference `fn` (an nn.Module or callable: another implementation
    of the component, e.g. a PyTorch reference of a fused kernel)."""
    return External(fn, name)


def _as_reference(ref):
    if isinstance(ref, External):
        return ref
    if isinstance(ref, str):
        if ref in (REFERENCE_OFF, REFERENCE_ORACLE):
            return ref
        raise ValueError("probe: reference must be %r, %r or probe.external(fn), not %r"
                         % (REFERENCE_OFF, REFERENCE_ORACLE, ref))
    if callable(ref):
        return External(ref)
    raise TypeError("probe: reference must be %r, %r, probe.external(fn) or a callable, not %s"
                    % (REFERENCE_OFF, REFERENCE_ORACLE, type(ref).__name__))


def _ref_label(ref):
    return ref if isinstance(ref, str) else repr(ref)


# ---------------------------------------------------------------- outputs

_slot_part = _slots.slot_part


def _is_tensor(x):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _children(obj):
    """(key, value) pairs one level into a structured output, as the capture
    side takes them (probe_adapter._slots)."""
    return _slots.children(obj, _is_tensor)


def output_slots(output, prefix="out"):
    """[(slot, tensor)] of every tensor in output, depth first in the
    output's own order: "out" for a bare tensor, "out.<key>" for an element
    (probe_adapter's names), "out.<key>.<key2>..." deeper (the capture keeps
    two levels; pairing compares every level). torch tensors and numpy
    arrays are tensors; other leaves (None, numbers, strings) are skipped."""
    if _is_tensor(output):
        return [(prefix, output)]
    out = []
    seen = set()

    def walk(obj, name, depth):
        if depth > 32 or id(obj) in seen:
            return
        seen.add(id(obj))
        for key, value in _children(obj):
            slot = "%s.%s" % (name, _slot_part(key))
            if _is_tensor(value):
                out.append((slot, value))
            else:
                walk(value, slot, depth + 1)
        seen.discard(id(obj))

    walk(output, prefix, 0)
    return out


# ---------------------------------------------------------------- inputs, RNG, dtypes

def _map_tensors(obj, fn):
    """obj with every torch tensor t replaced by fn(t), through tuples, lists
    and dicts (other objects are passed as they are)."""
    torch = sys.modules["torch"]
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[_map_tensors(v, fn) for v in obj])
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    if isinstance(obj, dict):
        try:
            new = type(obj)()
        except Exception:
            new = {}
        for k, v in obj.items():
            new[k] = _map_tensors(v, fn)
        return new
    return obj


def _walk(obj):
    torch = sys.modules["torch"]
    if isinstance(obj, (torch.Tensor, torch.Generator)):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _walk(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)


def _narrow_float(t):
    torch = sys.modules["torch"]
    return t.is_floating_point() and t.element_size() < 4 and t.dtype != torch.float32


def _module_of(fn):
    torch = sys.modules["torch"]
    if isinstance(fn, torch.nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return owner
    return None


@contextlib.contextmanager
def _full_fp32(torch):
    """float32 matmuls and convolutions in full float32 inside the block: TF32
    off for cuBLAS and cuDNN, matmul precision "highest"; put back after."""
    prec = torch.get_float32_matmul_precision() if hasattr(torch, "get_float32_matmul_precision") else None
    mm = torch.backends.cuda.matmul.allow_tf32
    cd = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if prec is not None:
            torch.set_float32_matmul_precision("highest")
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = mm
        torch.backends.cudnn.allow_tf32 = cd
        if prec is not None:
            torch.set_float32_matmul_precision(prec)


@contextlib.contextmanager
def _in_fp32(module):
    """module's floating parameters and buffers narrower than float32
    (bfloat16, float16, FP8) held in float32 inside the block, then put back
    in their own type (exact: each of these types converts to float32 and
    back without change). float32 and float64 tensors are left as they are.
    Inside the block float32 arithmetic is full float32 (_full_fp32)."""
    torch = sys.modules["torch"]
    saved = []
    try:
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                if _narrow_float(t):
                    saved.append((t, t.dtype))
                    t.data = t.data.to(torch.float32)
        with _full_fp32(torch):
            yield
    finally:
        with torch.no_grad():
            for t, dt in saved:
                t.data = t.data.to(dt)


class _Rng:
    """The random state at pair()'s call, set identically before each side."""

    def __init__(self, torch, args, kwargs, seed, devices):
        import random
        self.torch = torch
        self.seed = seed
        self.devices = sorted(devices)
        self.cpu = torch.get_rng_state()
        self.cuda = {d: torch.cuda.get_rng_state(d) for d in self.devices}
        self.py = random.getstate()
        np = sys.modules.get("numpy")
        self.np = np.random.get_state() if np is not None else None
        self.gens = [(g, g.get_state()) for g in list(_walk(args)) + list(_walk(kwargs))
                     if isinstance(g, torch.Generator)]

    @contextlib.contextmanager
    def side(self):
        import random
        torch = self.torch
        np = sys.modules.get("numpy")
        py_outer = random.getstate()
        np_outer = np.random.get_state() if np is not None and self.np is not None else None
        with torch.random.fork_rng(devices=self.devices):
            if self.seed is not None:
                torch.manual_seed(self.seed)  # also every CUDA device
                random.seed(self.seed)
                if np_outer is not None:
                    np.random.seed(self.seed % (1 << 32))
            else:
                torch.set_rng_state(self.cpu)
                for d, s in self.cuda.items():
                    torch.cuda.set_rng_state(s, d)
                random.setstate(self.py)
                if np_outer is not None:
                    np.random.set_state(self.np)
            for g, s in self.gens:
                g.set_state(s)
            try:
                yield
            finally:
                for g, s in self.gens:
                    g.set_state(s)
                random.setstate(py_outer)
                if np_outer is not None:
                    np.random.set_state(np_outer)


class _State:
    """The state a call of the component may change, put back before each
    side and after the pair: for an nn.Module (or a method of one) its
    buffers (restored in place: BatchNorm running statistics, caches held in
    buffers); for a method of another object (scheduler.step) that object's
    instance attributes, one level deep (an attribute rebound by the call,
    such as a step counter, gets its old value back; a tensor changed in
    place does not)."""

    def __init__(self, torch, fn):
        self.torch = torch
        self.module = _module_of(fn)
        self.buffers = None
        self.attrs = None
        owner = getattr(fn, "__self__", None) if self.module is None else None
        if self.module is not None:
            self.buffers = [(b, b.detach().clone()) for b in self.module.buffers()]
        elif owner is not None and not isinstance(owner, type) and hasattr(owner, "__dict__") \
                and not isinstance(owner, type(sys)):
            self.owner = owner
            self.attrs = dict(vars(owner))

    def restore(self):
        if self.buffers is not None:
            with self.torch.no_grad():
                for b, saved in self.buffers:
                    if b.shape == saved.shape:
                        b.copy_(saved)
        if self.attrs is not None:
            d = vars(self.owner)
            for k in [k for k in d if k not in self.attrs]:
                del d[k]
            d.update(self.attrs)


def _cuda_devices(torch, *objs):
    """The CUDA device indices of the tensors in objs (an nn.Module among
    them: of its parameters and buffers), plus the current device when CUDA
    is initialized."""
    devs = set()
    for o in objs:
        if isinstance(o, torch.nn.Module):
            o = list(o.parameters()) + list(o.buffers())
        for t in _walk(o):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                devs.add(t.device.index if t.device.index is not None else torch.cuda.current_device())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devs.add(torch.cuda.current_device())
    return devs


# ---------------------------------------------------------------- comparing one slot

_READ = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64,
                         ctypes.c_size_t, ctypes.c_void_p)


class _PairSource(ctypes.Structure):
    """struct probe_pair_source (probe/metrics.h)."""
    _fields_ = [("n", ctypes.c_uint64), ("dtype", ctypes.c_int * 2), ("read", _READ),
                ("ctx", ctypes.c_void_p)]


def _host_metrics(lib, rv, cv, atol, rtol, channel):
    """probe_metrics_compute_source on two host views (read in chunks of
    131072 elements: memory bounded independently of n), with the channel
    spec (count, inner) or None. The metrics are bit-identical to
    probe_metrics_compute_typed's (probe.compare), which is this function on
    arrays."""
    from . import _cuda
    fn = getattr(lib, "_pair_compute_source", None)
    if fn is None:
        fn = lib.handle.probe_metrics_compute_source
        fn.argtypes = [ctypes.POINTER(_PairSource), ctypes.POINTER(_lib.MetricsOpts),
                       ctypes.POINTER(_StreamOpts), ctypes.POINTER(_lib.Metrics),
                       ctypes.POINTER(_cuda.ChannelShift)]
        fn.restype = ctypes.c_int
        for cls, name in ((_PairSource, "probe_pair_source"), (_StreamOpts, "probe_stream_opts"),
                          (_cuda.ChannelSpec, "probe_channel_spec"),
                          (_cuda.ChannelShift, "probe_channel_shift")):
            lib.check_layout(cls, name)
        lib._pair_compute_source = fn
        lib.handle.probe_dtype_size.argtypes = [ctypes.c_int]
        lib.handle.probe_dtype_size.restype = ctypes.c_size_t
    dts = [lib.dtype_from_name(rv.dtype_name.encode()), lib.dtype_from_name(cv.dtype_name.encode())]
    sizes = [lib.handle.probe_dtype_size(d) for d in dts]
    bases = [rv.ptr or 0, cv.ptr or 0]

    def read(ctx, side, offset, count, dst):
        try:
            ctypes.memmove(dst, bases[side] + offset * sizes[side], count * sizes[side])
            return 0
        except Exception:  # noqa: BLE001 - reported as a read error to the C engine
            return 3  # PROBE_EIO

    cb = _READ(read)
    src = _PairSource(rv.n, (ctypes.c_int * 2)(*dts), cb, None)
    so = _StreamOpts(0, _cuda.ChannelSpec(*(channel or (0, 1))), None, None, None)
    m = _lib.Metrics()
    sh = _cuda.ChannelShift()
    lib.check(fn(ctypes.byref(src), ctypes.byref(_lib.MetricsOpts(atol, rtol)), ctypes.byref(so),
                 ctypes.byref(m), ctypes.byref(sh)), "probe: metrics")
    return m, sh


def _stream_opts_type():
    from . import _cuda

    class StreamOpts(ctypes.Structure):
        """struct probe_stream_opts (probe/metrics.h)."""
        _fields_ = [("threads", ctypes.c_int), ("channel", _cuda.ChannelSpec),
                    ("channel_shift_out", ctypes.POINTER(ctypes.c_double)),
                    ("channel_se_out", ctypes.POINTER(ctypes.c_double)),
                    ("channel_n_out", ctypes.POINTER(ctypes.c_double))]
    return StreamOpts


_StreamOpts = _stream_opts_type()


def _channel_spec(shape, axis):
    if axis is None:
        return None
    rank = len(shape)
    a = axis + rank if axis < 0 else axis
    if rank == 0 or not 0 <= a < rank or shape[a] < 1:
        return None
    inner = 1
    for d in shape[a + 1:]:
        inner *= d
    if inner < 1 or shape[a] > 65536:  # PROBE_CHANNELS_MAX
        return None
    return (shape[a], inner)


def _value_at(x, index):
    try:
        v = x[tuple(index)] if index else x[()]
        v = v.item() if hasattr(v, "item") else v
        return float(v) if isinstance(v, float) else v
    except Exception:  # noqa: BLE001 - a value for the message only
        return None


def _shape(x):
    return tuple(int(d) for d in x.shape)


def _dtype_name(x):
    return str(x.dtype).replace("torch.", "")


def _raw_metrics(lib, component, slot, r, c, atol, rtol, channel):
    """(Metrics, ChannelShift or None, "device"/"host", reference dtype name,
    candidate dtype name) of one pair: on the device when both are on one
    CUDA device, else on the host."""
    import probe as _probe
    torch = sys.modules.get("torch")
    on_device = (torch is not None and isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor)
                 and r.device.type == "cuda" and r.device == c.device)
    if on_device:
        from . import _cuda
        rn = _probe._TORCH_NAMES.get(_dtype_name(r))
        cn = _probe._TORCH_NAMES.get(_dtype_name(c))
        for side, name, t in (("reference", rn, r), ("candidate", cn, c)):
            if name is None or t.is_complex():
                raise TypeError("probe: %s slot %s: %s has element type %s, which probe does not "
                                "compare" % (component, slot, side, t.dtype))
        m, sh = _cuda.metrics(r, c, lib.dtype_from_name(rn.encode()),
                              lib.dtype_from_name(cn.encode()), atol, rtol, channel)
        return m, sh, "device", rn, cn
    try:
        rv = _probe._view(r, "reference")
        cv = _probe._view(c, "candidate")
    except TypeError as e:
        raise TypeError("probe: %s slot %s: %s" % (component, slot,
                                                   str(e).replace("probe: ", "", 1))) from None
    m, sh = _host_metrics(lib, rv, cv, atol, rtol, channel)
    return m, sh, "host", rv.dtype_name, cv.dtype_name


def _compare_slot(lib, slot, r, c, gate_spec, atol, rtol, calibration, component, path, axis,
                  oracle=None, headroom=None):
    """The stats dict of one slot pair (probe.compare's keys plus the
    channel shift, the values at the max-abs index, where it was computed);
    with `oracle` (the slot of an fp32 oracle run) also the oracle verdict,
    which is then the slot's verdict."""
    import probe as _probe
    if _shape(r) != _shape(c):
        raise ValueError("probe: %s slot %s: reference shape %s, candidate shape %s (the two sides "
                         "of a slot must have one shape)" % (component, slot, list(_shape(r)),
                                                             list(_shape(c))))
    g = _probe._effective_gate(lib, gate_spec, atol, rtol, calibration, component, path)
    shape = _shape(r)
    channel = _channel_spec(shape, axis)
    m, sh, where, rname, cname = _raw_metrics(lib, component, slot, r, c, g.atol, g.rtol, channel)
    v = _lib.GateVerdict()
    lib.check(lib.gate_check(ctypes.byref(g), ctypes.byref(m), ctypes.byref(v)), "probe: gate")
    if g.kind == 3:  # T2: the calibrated structure (gain z; channel z with a channel axis)
        noise_g = lib.systematic_limit(1, 1e-6)  # PROBE_SYSTEMATIC_FALSE_ALARM
        noise_c = lib.systematic_limit(sh.count, 1e-6) if sh is not None and sh.count else float("nan")
        lib.check(lib.gate_check_structure(ctypes.byref(g), ctypes.byref(m),
                                           ctypes.byref(sh) if sh is not None and sh.count else None,
                                           noise_c, noise_g, ctypes.byref(v)), "probe: gate")
    passed = bool(v.pass_)
    reasons = [v.reasons[i].value.decode("utf-8", "replace") for i in range(v.nreasons)]
    idx = _probe._unravel(m.max_abs_offset, shape)
    res = {
        "slot": slot, "path": path, "n": m.n, "shape": list(shape), "dtype": rname,
        "dtype_candidate": cname, "device": str(getattr(c, "device", "cpu")), "computed_on": where,
        "rel_l2": m.rel_l2, "cosine": m.cosine, "max_abs": m.max_abs, "max_abs_index": idx,
        "p99_abs": m.p99_abs, "mean_abs": m.mean_abs, "mismatch_fraction": m.mismatch_fraction,
        "mismatch_count": m.mismatch_count, "nan_ref": m.nan_ref, "nan_cand": m.nan_cand,
        "inf_ref": m.inf_ref, "inf_cand": m.inf_cand, "inf_mismatch": m.inf_mismatch,
        "n_finite": m.n_finite, "zero_norm_reference": bool(m.zero_norm_reference),
        "identical": bool(m.identical), "norm_ref": m.norm_ref, "norm_cand": m.norm_cand,
        "norm_diff": m.norm_diff, "dot": m.dot, "gain": m.gain, "gain_z": m.gain_z,
        "reference_at_max_abs": _value_at(r, idx) if m.n else None,
        "candidate_at_max_abs": _value_at(c, idx) if m.n else None,
        "gate": _probe._gate_dict(g), "verdict": "pass" if passed else "fail", "reasons": reasons,
    }
    if sh is not None and sh.count:
        res.update({"channel_axis": axis, "channels": sh.count, "channel_shift_max": sh.max,
                    "channel_shift_channel": sh.argmax, "channel_shift_rel": sh.max_rel,
                    "channel_z_max": sh.z_max, "channel_z_channel": sh.z_argmax})
    if oracle is not None:
        _oracle_verdict(lib, res, component, slot, r, c, oracle, g, m, headroom)
    return res


class _Systematic(ctypes.Structure):
    """struct probe_systematic (probe/verdict.h)."""
    _fields_ = [("computed", ctypes.c_int), ("floor_gate", ctypes.c_double),
                ("floor", ctypes.c_double), ("gain_limit", ctypes.c_double),
                ("gain_fail", ctypes.c_int), ("channels", ctypes.c_uint64),
                ("channel_limit", ctypes.c_double), ("channel", ctypes.c_uint64),
                ("channel_z", ctypes.c_double), ("channel_shift", ctypes.c_double),
                ("channel_size", ctypes.c_double), ("channel_fail", ctypes.c_int)]


class _OracleVerdict(ctypes.Structure):
    """struct probe_oracle_verdict (probe/verdict.h)."""
    _fields_ = [("computed", ctypes.c_int), ("err_reference", ctypes.c_double),
                ("err_candidate", ctypes.c_double), ("ratio", ctypes.c_double),
                ("limit", ctypes.c_double), ("ratio_fail", ctypes.c_int),
                ("floor", ctypes.c_double), ("gain_excess", ctypes.c_double),
                ("gain_excess_size", ctypes.c_double), ("gain_fail", ctypes.c_int),
                ("channel", ctypes.c_uint64), ("channel_excess", ctypes.c_double),
                ("channel_excess_size", ctypes.c_double), ("channel_fail", ctypes.c_int),
                ("pass_", ctypes.c_int)]


def _verdict_fns(lib):
    fns = getattr(lib, "_pair_verdict_fns", None)
    if fns is None:
        sc = lib.handle.probe_systematic_check
        sc.argtypes = [ctypes.POINTER(_lib.Metrics), ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_uint64, ctypes.c_double,
                       ctypes.POINTER(_Systematic)]
        sc.restype = ctypes.c_int
        oc = lib.handle.probe_oracle_check
        oc.argtypes = [ctypes.POINTER(_lib.Metrics), ctypes.POINTER(_lib.Metrics),
                       ctypes.POINTER(_lib.Metrics), ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                       ctypes.POINTER(_Systematic), ctypes.c_double,
                       ctypes.POINTER(_OracleVerdict)]
        oc.restype = ctypes.c_int
        fns = lib._pair_verdict_fns = (sc, oc)
    return fns


def _oracle_verdict(lib, res, component, slot, r, c, o, g, m, headroom):
    """probe_oracle_check of one slot (docs/gates.md "The oracle"): the
    candidate is no less accurate than the reference against the oracle o
    (error ratio, gain excess; no channel excess), put into res as "oracle";
    res's verdict becomes the oracle's, plus what every gate fails (NaN in the
    candidate, NaN in the reference only, an infinity mismatch). The gate's
    own verdict stays in "gate_verdict" / "gate_reasons". An oracle that
    holds the reference's very bytes cannot judge: the gate's verdict stays."""
    if _shape(o) != _shape(r):
        raise ValueError("probe: %s slot %s: the oracle's shape %s is not the reference's %s"
                         % (component, slot, list(_shape(o)), list(_shape(r))))
    m_or = _raw_metrics(lib, component, slot, o, r, g.atol, g.rtol, None)[0]
    m_oc = _raw_metrics(lib, component, slot, o, c, g.atol, g.rtol, None)[0]
    sc, oc = _verdict_fns(lib)
    sy = _Systematic()
    lib.check(sc(ctypes.byref(m), None, None, None, 0, g.rel_l2_max, ctypes.byref(sy)),
              "probe: systematic")
    ov = _OracleVerdict()
    lib.check(oc(ctypes.byref(m_or), ctypes.byref(m_oc), ctypes.byref(m), None, None, None, None, 0,
                 ctypes.byref(sy), float(headroom or 0.0), ctypes.byref(ov)), "probe: oracle")
    reasons = []
    if ov.ratio_fail:
        reasons.append("less accurate than the reference: error against the oracle %.4g vs the "
                       "reference's %.4g (ratio %.4g > %.4g)" % (ov.err_candidate, ov.err_reference,
                                                                ov.ratio, ov.limit))
    if ov.gain_fail:
        reasons.append("adds a systematic gain error against the oracle: excess %.4g (z %.3g > %.3g)"
                       % (ov.gain_excess_size, ov.gain_excess, sy.gain_limit))
    same = bool(m_or.identical)
    res["oracle"] = {"err_reference": ov.err_reference, "err_candidate": ov.err_candidate,
                     "ratio": ov.ratio, "limit": ov.limit, "gain_excess": ov.gain_excess,
                     "gain_excess_size": ov.gain_excess_size, "same_as_reference": same,
                     "verdict": "pass" if ov.pass_ else "fail", "reasons": reasons}
    res["gate_verdict"], res["gate_reasons"] = res["verdict"], list(res["reasons"])
    if same:
        return
    always = []
    if m.nan_cand:
        always.append("NaN in candidate (%d elements)" % m.nan_cand)
    if m.nan_ref_only:
        always.append("NaN in reference where the candidate is not NaN (%d elements)" % m.nan_ref_only)
    if m.inf_mismatch:
        always.append("infinity mismatch (%d elements)" % m.inf_mismatch)
    res["reasons"] = always + reasons
    res["verdict"] = "pass" if not res["reasons"] else "fail"


# ---------------------------------------------------------------- results

def _fmt(x):
    if isinstance(x, float):
        return "%.6g" % x
    return repr(x)


def _slot_line(s):
    line = ("slot %s: dtype %s/%s shape %s on %s: rel_l2=%.6g cosine=%.9g max_abs=%.6g at %s "
            "(reference %s, candidate %s) p99_abs=%.6g mean_abs=%.6g mismatch_fraction=%.6g "
            "(atol=%g rtol=%g)" % (s["slot"], s["dtype"], s["dtype_candidate"], s["shape"],
                                   s["device"], s["rel_l2"], s["cosine"], s["max_abs"],
                                   s["max_abs_index"], _fmt(s["reference_at_max_abs"]),
                                   _fmt(s["candidate_at_max_abs"]), s["p99_abs"], s["mean_abs"],
                                   s["mismatch_fraction"], s["gate"]["atol"], s["gate"]["rtol"]))
    if "channels" in s:
        line += " channel_shift=%.6g (channel %d, %.4g std) channel_z=%.4g" % (
            s["channel_shift_max"], s["channel_shift_channel"], s["channel_shift_rel"],
            s["channel_z_max"])
    if "oracle" in s:
        o = s["oracle"]
        line += (" oracle: error %.4g vs the reference's %.4g, ratio %.4g (limit %.4g)%s"
                 % (o["err_candidate"], o["err_reference"], o["ratio"], o["limit"],
                    "; it holds the reference's bytes: the gate judges" if o["same_as_reference"]
                    else ""))
    if "floor_identical" in s:
        line += (" floor: identical" if s["floor_identical"] else
                 " floor: rel_l2=%.6g max_abs=%.6g (the reference differs from itself)"
                 % (s["floor_rel_l2"], s["floor_max_abs"]))
    if s["nan_ref"] or s["nan_cand"] or s["inf_ref"] or s["inf_cand"]:
        line += " nan_ref=%d nan_cand=%d inf_ref=%d inf_cand=%d" % (
            s["nan_ref"], s["nan_cand"], s["inf_ref"], s["inf_cand"])
    return line


class PairResult:
    """What pair() measured.

    case:     dict: component, tensor (the slot glob), feature, reference, gate.
    slots:    {slot: stats dict} in output order (keys: docs/pairing.md).
    passed:   every compared slot passes its gate (and, for the feature-off
              reference, the candidate is not identical to it everywhere).
    failed:   the slots that failed.
    reasons:  failures of the whole pair (e.g. "feature not active").
    floor:    {slot: stats of reference vs reference again} when the session
              asked for repeats, else None.
    arch:     "cpu" or "sm_XY" of the candidate's device.
    """

    def __init__(self, case, slots, reasons, floor, arch):
        self.case = case
        self.slots = slots
        self.reasons = reasons
        self.floor = floor
        self.arch = arch
        self.failed = [k for k, s in slots.items() if s["verdict"] != "pass"]
        self.passed = not self.failed and not reasons

    def __getitem__(self, slot):
        return self.slots[slot]

    def __iter__(self):
        return iter(self.slots)

    def __len__(self):
        return len(self.slots)

    def header(self):
        c = self.case
        return ("probe: %s (tensor %s) under feature %s, reference %s, gate %s"
                % (c["component"], c["tensor"], c["feature"], c["reference"], c["gate"]))

    def report(self):
        """Every slot's line (failing ones with their reasons)."""
        lines = [self.header() + ": %s" % ("pass" if self.passed else "FAIL")]
        for r in self.reasons:
            lines.append("  " + r)
        for k, s in self.slots.items():
            lines.append("  %s %s" % ("ok  " if s["verdict"] == "pass" else "FAIL", _slot_line(s)))
            for r in s["reasons"]:
                lines.append("         " + r)
        if self.floor is not None:
            for k, s in self.floor.items():
                lines.append("  floor %s: %s (rel_l2=%.6g max_abs=%.6g)"
                             % (k, "identical" if s["identical"] else "NOT identical",
                                s["rel_l2"], s["max_abs"]))
        return "\n".join(lines)

    def assert_pass(self):
        __tracebackhide__ = True
        if self.passed:
            return self
        n = len(self.failed)
        msg = [self.header() + ": %d of %d slots failed%s" % (
            n, len(self.slots), "" if not self.reasons else "; " + "; ".join(self.reasons))]
        for k in self.failed:
            s = self.slots[k]
            msg.append("  %s" % _slot_line(s))
            msg.append("    " + "; ".join(s["reasons"]))
        passing = [k for k in self.slots if k not in self.failed]
        if passing:
            msg.append("  passing slots: %s" % ", ".join(passing))
        raise AssertionError("\n".join(msg))

    def __repr__(self):
        return "<PairResult %s: %s>" % (self.case["component"], "pass" if self.passed else "fail")


# ---------------------------------------------------------------- pair()

def _check_number(name, v):
    __tracebackhide__ = True
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError("probe: %s must be a number, not %s" % (name, type(v).__name__))
    if not v >= 0:
        raise ValueError("probe: %s must be >= 0, not %r" % (name, v))


def _arch(torch, tensors):
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(t.device)
            return "sm_%d%d" % (major, minor)
    return "cpu"


def _validate(fn, args, kwargs, component, tensor, channel_axis, seed):
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError("probe: the component must be an nn.Module or a callable, not %s"
                        % type(fn).__name__)
    if not isinstance(args, (tuple, list)):
        raise TypeError("probe: args must be a tuple of positional arguments (args=(x,)), not %s"
                        % type(args).__name__)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError("probe: kwargs must be a dict, not %s" % type(kwargs).__name__)
    if not isinstance(component, str):
        raise TypeError("probe: component must be a str naming the boundary (e.g. 'dit.block'), "
                        "not %s" % type(component).__name__)
    if not component:
        raise ValueError("probe: component must not be empty")
    if not isinstance(tensor, str) or not tensor:
        raise TypeError("probe: tensor must be a slot glob such as 'out' or 'out.*', not %r"
                        % (tensor,))
    if channel_axis is not None and (isinstance(channel_axis, bool)
                                     or not isinstance(channel_axis, numbers.Integral)):
        raise TypeError("probe: channel_axis must be an int or None, not %r" % (channel_axis,))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise TypeError("probe: seed must be an int or None, not %r" % (seed,))


def _slots_of(component, side, out, tensor):
    slots = output_slots(out)
    if not slots:
        raise ValueError("probe: %s returned no tensor on the %s side (got %s)"
                         % (component, side, type(out).__name__))
    return slots


def pair(fn, args=(), kwargs=None, *, component, feature, gate=None, reference=REFERENCE_OFF,
         calibration=None, tensor="*", atol=None, rtol=None, channel_axis=None, seed=None,
         require_active=True, oracle=False, oracle_headroom=None, session=None):
    """Run fn(*args, **kwargs) as the reference and with the feature on, and
    compare every output slot matching `tensor` (docs/pairing.md).

    fn:          the component: an nn.Module or any callable.
    args, kwargs: its inputs (each side gets its own clones of the tensors).
    component:   the boundary's name as the capture names it ("dit.block",
                 "dit.step", "vae.decode", ...): messages, T2 thresholds,
                 session records.
    feature:     probe.feature(name, on=...), an object with .id and
                 .enable() (and optionally .disable(), .gate), or a str for
                 a feature the component has as given (e.g. "bf16", with a
                 reference that is not feature-off).
    gate:        "T1", "T1-relaxed:CAUSE" or "T2" (with calibration=FILE);
                 None: the feature's .gate.
    reference:   "feature-off" (fn with the feature off), "fp32-oracle" (fn
                 with its bfloat16/float16/FP8 parameters, buffers and
                 inputs held in float32, feature off; fn must be an
                 nn.Module or a method of one), or probe.external(ref_fn) /
                 a callable (another implementation on the same inputs).
    tensor:      fnmatch glob over slot names ("out", "out.sample", "out.*").
    atol, rtol:  override the gate's element-wise tolerance.
    channel_axis: axis of the per-channel mean shift (int, negative counts
                 from the end), applied to every slot that has that axis.
    seed:        None: both sides start from the random state at this call;
                 an int: both sides are seeded with it.
    require_active: with the feature-off reference, fail the pair as
                 "feature not active" when every compared slot is identical.
    oracle:      with the feature-off reference: also run the fp32 oracle
                 (as reference="fp32-oracle" runs it) and judge each slot by
                 the oracle verdict, "no less accurate than the reference"
                 (docs/gates.md): the candidate's error against the oracle
                 over the reference's, at most max(oracle_headroom (default
                 1.05), 1 + 4/sqrt(n)), and no added gain error. The gate's
                 verdict is kept in the stats as gate_verdict.
    session:     an object with .repeat (bool) and .record(component, feature,
                 stats, arch), such as the pytest plugin's probe_session;
                 None: the running test's when the plugin is loaded
                 (probe.pytest_plugin.current()), else none. Each slot's stats
                 are recorded; with .repeat (pytest --probe-repeat) both sides
                 run twice, the determinism floor is reported
                 (PairResult.floor), and with .check_repeat a side whose two
                 runs are not bit-identical fails the test.

    Returns a PairResult. Raises TypeError/ValueError for bad arguments,
    outputs whose structures (slot names) differ, shapes that differ.
    """
    __tracebackhide__ = True  # bad arguments point at the test's line
    import torch
    _validate(fn, args, kwargs, component, tensor, channel_axis, seed)
    _check_number("atol", atol)
    _check_number("rtol", rtol)
    kwargs = dict(kwargs or {})
    feat = _as_feature(feature)
    ref = _as_reference(reference)
    if gate is None:
        gate = feat.gate
    if gate is None:
        raise ValueError("probe: state the gate: gate='T1', 'T1-relaxed:CAUSE' or 'T2' with "
                         "calibration=FILE (feature %r has no default gate)" % feat.id)
    if not isinstance(gate, str):
        raise TypeError("probe: gate must be a str such as 'T1', not %r" % (gate,))
    if ref == REFERENCE_OFF and not feat.toggles:
        raise ValueError("probe: feature %r is a name only (a str): with reference %r both sides "
                         "would be the same run; give probe.feature(%r, on=...) or another "
                         "reference" % (feat.id, REFERENCE_OFF, feat.id))
    if not isinstance(oracle, bool):
        raise TypeError("probe: oracle must be True or False, not %r" % (oracle,))
    _check_number("oracle_headroom", oracle_headroom)
    if oracle and ref != REFERENCE_OFF:
        raise ValueError("probe: oracle=True judges the candidate against the %r reference through "
                         "an fp32 oracle; reference is %s" % (REFERENCE_OFF, _ref_label(ref)))
    module = None
    if ref == REFERENCE_ORACLE or oracle:
        module = _module_of(fn)
        if module is None:
            raise TypeError("probe: %s needs the component to be an nn.Module (or a bound "
                            "method of one), not %s; give probe.external(fp32_fn) instead"
                            % ("oracle=True" if oracle else "reference %r" % REFERENCE_ORACLE,
                               type(fn).__name__))
    lib = _lib.get()
    # the gate is parsed before anything runs: a bad gate costs no run
    _probe_mod = sys.modules["probe"]
    _probe_mod._effective_gate(lib, gate, atol, rtol, calibration, component,
                               "/%s/0000/out" % component)
    case = {"component": component, "tensor": tensor, "feature": feat.id,
            "reference": _ref_label(ref) + (" with the fp32 oracle verdict" if oracle else ""),
            "gate": gate}

    rng = _Rng(torch, args, kwargs, seed, _cuda_devices(torch, args, kwargs, _module_of(fn)))
    clone = lambda t: t.detach().clone()  # noqa: E731

    state = _State(torch, fn)

    def run_oracle():
        up = lambda t: t.detach().to(torch.float32) if _narrow_float(t) else t.detach().clone()  # noqa: E731
        with _in_fp32(module), _entered(feat.off, feat.id, "disable()"):
            return fn(*_map_tensors(args, up), **_map_tensors(kwargs, up))

    def run_ref(as_oracle=False):
        state.restore()
        with rng.side(), torch.no_grad():
            if as_oracle or ref == REFERENCE_ORACLE:
                return run_oracle()
            if ref == REFERENCE_OFF:
                with _entered(feat.off, feat.id, "disable()"):
                    return fn(*_map_tensors(args, clone), **_map_tensors(kwargs, clone))
            return ref.fn(*_map_tensors(args, clone), **_map_tensors(kwargs, clone))

    def run_cand():
        state.restore()
        with rng.side(), torch.no_grad():
            with _entered(feat.on, feat.id, "enable()"):
                return fn(*_map_tensors(args, clone), **_map_tensors(kwargs, clone))

    if session is None:  # the running test's, when the pytest plugin is loaded
        plugin = sys.modules.get("probe.pytest_plugin")
        session = plugin.current() if plugin is not None else None
    repeat = bool(getattr(session, "repeat", False)) if session is not None else False
    try:
        ref_out = run_ref()
        ref2_out = run_ref() if repeat else None
        oracle_out = run_ref(as_oracle=True) if oracle else None
        cand_out = run_cand()
        cand2_out = run_cand() if repeat else None
    finally:
        state.restore()
    if repeat and hasattr(session, "check_repeat"):  # the determinism floor: bit-identical
        session.check_repeat(ref_out, ref2_out, side="reference (%s off)" % feat.id)
        session.check_repeat(cand_out, cand2_out, side="candidate (%s on)" % feat.id)

    rs = _slots_of(component, "reference", ref_out, tensor)
    cs = _slots_of(component, "candidate", cand_out, tensor)
    rnames, cnames = [k for k, _ in rs], [k for k, _ in cs]
    if rnames != cnames:
        only_r = [k for k in rnames if k not in cnames]
        only_c = [k for k in cnames if k not in rnames]
        raise ValueError("probe: %s: the output structures differ: reference slots %s, candidate "
                         "slots %s (only in the reference: %s; only in the candidate: %s)"
                         % (component, rnames, cnames, only_r or "none, the order differs",
                            only_c or "none"))
    wanted = [k for k in rnames if fnmatch.fnmatchcase(k, tensor)]
    if not wanted:
        raise ValueError("probe: %s: no output slot matches tensor=%r (slots: %s)"
                         % (component, tensor, ", ".join(rnames)))
    rmap, cmap = dict(rs), dict(cs)
    omap = None
    if oracle_out is not None:
        omap = dict(_slots_of(component, "oracle", oracle_out, tensor))
        missing = [k for k in wanted if k not in omap]
        if missing:
            raise ValueError("probe: %s: the fp32 oracle's output has no slot %s (its slots: %s)"
                             % (component, ", ".join(missing), ", ".join(omap)))
    slots = {}
    for k in wanted:
        path = "/%s/0000/%s" % (component, k)
        slots[k] = _compare_slot(lib, k, rmap[k], cmap[k], gate, atol, rtol, calibration,
                                 component, path, channel_axis,
                                 oracle=omap[k] if omap is not None else None,
                                 headroom=oracle_headroom)
    floor = None
    if ref2_out is not None:
        r2 = dict(_slots_of(component, "reference (repeat)", ref2_out, tensor))
        floor = {}
        for k in wanted:
            if k not in r2:
                raise ValueError("probe: %s: the repeated reference has no slot %s" % (component, k))
            floor[k] = _compare_slot(lib, k, rmap[k], r2[k], gate, atol, rtol, calibration,
                                     component, "/%s/0000/%s" % (component, k), channel_axis)
    reasons = []
    if require_active and ref == REFERENCE_OFF and all(s["identical"] for s in slots.values()):
        reasons.append("feature not active: the candidate is identical to the reference in every "
                       "compared slot (%s)" % ", ".join(wanted))
    if floor is not None:
        for k, f in floor.items():
            slots[k]["floor_identical"] = f["identical"]
            slots[k]["floor_rel_l2"] = f["rel_l2"]
            slots[k]["floor_max_abs"] = f["max_abs"]
    arch = _arch(torch, [t for _, t in cs])
    res = PairResult(case, slots, reasons, floor, arch)
    if session is not None and hasattr(session, "record"):
        for k, s in slots.items():
            session.record(component, feat.id, dict(s, case=case), arch)
        # the determinism floor, for probe-calibrate --records, where the session takes it
        if floor is not None and "kind" in inspect.signature(session.record).parameters:
            for k, f in floor.items():
                session.record(component, feat.id, dict(f, case=case), arch, kind="floor")
    return res


def assert_pair(fn, args=(), kwargs=None, **kw):
    """pair(...) and assert that it passes: returns the PairResult, raises
    AssertionError naming the component, feature, reference, gate and, per
    failing slot, its dtype, shape, statistics and the reference and
    candidate values at the max-abs index."""
    __tracebackhide__ = True
    return pair(fn, args, kwargs, **kw).assert_pass()


# ---------------------------------------------------------------- feature active

class ActiveResult:
    """What assert_active() observed: calls_on (and calls_off when the off
    side ran) of the wrapped function, the slots that differ, the kernels
    matching the glob and how many CUDA kernels ran with the feature on."""

    def __init__(self):
        self.calls_on = None
        self.calls_off = None
        self.differing = None
        self.kernels = None
        self.kernels_matched = None
        self.reasons = []

    @property
    def active(self):
        return not self.reasons


_MISSING = object()


@contextlib.contextmanager
def _counting(target, counter, armed):
    """owner.name (or owner[name] for a dict-like owner) replaced by a
    wrapper that counts the calls made while armed[0] names a side; the
    original is put back on exit. On a class the stored object is wrapped as
    it is stored (function, staticmethod, classmethod), so it binds as before."""
    owner, name = target
    is_map = isinstance(owner, dict) or (hasattr(owner, "keys") and hasattr(owner, "__setitem__")
                                         and not isinstance(owner, type))
    if is_map:
        if name not in owner:
            raise ValueError("probe: called=(%s, %r): no such key" % (type(owner).__name__, name))
        stored = owner[name]
    elif isinstance(owner, type):
        stored = owner.__dict__.get(name, _MISSING)
        if stored is _MISSING and not hasattr(owner, name):
            raise ValueError("probe: called=(%s, %r): no such attribute" % (owner.__name__, name))
    else:
        if not hasattr(owner, name):
            raise ValueError("probe: called=(%s, %r): no such attribute"
                             % (getattr(owner, "__name__", type(owner).__name__), name))
        stored = getattr(owner, "__dict__", {}).get(name, _MISSING)
    lock = threading.Lock()

    def counting(f):
        def counted(*a, **k):
            side = armed[0]
            if side:
                with lock:
                    counter[side] = counter.get(side, 0) + 1
            return f(*a, **k)
        counted.__wrapped__ = f
        return counted

    if isinstance(owner, type):
        raw = stored if stored is not _MISSING else inspect.getattr_static(owner, name)
        if isinstance(raw, staticmethod):
            repl = staticmethod(counting(raw.__func__))
        elif isinstance(raw, classmethod):
            repl = classmethod(counting(raw.__func__))
        else:
            repl = counting(raw)
    else:
        f = stored if is_map else getattr(owner, name)
        if not callable(f):
            raise TypeError("probe: called=(..., %r) is a %s, not a function" % (name, type(f).__name__))
        repl = counting(f)
    if is_map:
        owner[name] = repl
    else:
        setattr(owner, name, repl)
    try:
        yield
    finally:
        if is_map:
            owner[name] = stored
        elif stored is _MISSING:
            delattr(owner, name)  # it came from the class: drop the shadowing copy
        else:
            setattr(owner, name, stored)


def assert_active(fn, args=(), kwargs=None, *, component, feature, called=None, min_calls=1,
                  differs=False, kernel=None, seed=None):
    """Assert in one call that the feature was active inside the component.
    Each form given must hold:

    called=(owner, name): owner.name (a module, class or object attribute,
        or owner[name] of a dict-like registry) is wrapped while the
        component runs with the feature on, and must be called at least
        min_calls times inside that run.
    differs=True: the component's outputs with the feature on differ from
        those with it off (same inputs, same random state) in at least one
        slot: not bit-identical (probe's `identical`: element type and bytes).
    kernel=GLOB: a CUDA kernel whose name matches GLOB (fnmatch, case
        sensitive) ran during the feature-on call, as torch.profiler's CUDA
        kernel events record it (needs the component to run on CUDA).

    Returns an ActiveResult; raises AssertionError naming the component, the
    feature and what was observed; TypeError/ValueError for bad arguments.
    """
    __tracebackhide__ = True
    import torch
    _validate(fn, args, kwargs, component, "*", None, seed)
    kwargs = dict(kwargs or {})
    feat = _as_feature(feature)
    if not feat.toggles:
        raise ValueError("probe: assert_active needs a feature that can be switched "
                         "(probe.feature(%r, on=...)), not a name only" % feat.id)
    if called is None and not differs and kernel is None:
        raise ValueError("probe: assert_active needs at least one of called=(owner, name), "
                         "differs=True, kernel='GLOB'")
    if called is not None and not (isinstance(called, tuple) and len(called) == 2
                                   and isinstance(called[1], str)):
        raise TypeError("probe: called must be a tuple (owner, 'name'), not %r" % (called,))
    if isinstance(min_calls, bool) or not isinstance(min_calls, numbers.Integral) or min_calls < 1:
        raise ValueError("probe: min_calls must be an int >= 1, not %r" % (min_calls,))
    if kernel is not None and (not isinstance(kernel, str) or not kernel):
        raise TypeError("probe: kernel must be a non-empty glob str, not %r" % (kernel,))
    mod = _module_of(fn)
    devs = _cuda_devices(torch, args, kwargs, mod)
    on_cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda"
                  for o in (args, kwargs, list(mod.parameters()) if mod is not None else [])
                  for t in _walk(o))
    if kernel is not None and not on_cuda:
        raise ValueError("probe: kernel=%r needs the component to run on CUDA (no CUDA tensor among "
                         "its inputs or parameters); on the CPU use called= or differs=" % kernel)
    rng = _Rng(torch, args, kwargs, seed, devs)
    clone = lambda t: t.detach().clone()  # noqa: E731
    res = ActiveResult()
    counter = {}
    armed = [None]

    state = _State(torch, fn)

    def run(on):
        state.restore()
        with rng.side(), torch.no_grad():
            with _entered(feat.on if on else feat.off, feat.id, "enable()" if on else "disable()"):
                armed[0] = "on" if on else "off"
                try:
                    return fn(*_map_tensors(args, clone), **_map_tensors(kwargs, clone))
                finally:
                    armed[0] = None

    with contextlib.ExitStack() as stack:
        if called is not None:
            stack.enter_context(_counting(called, counter, armed))
        stack.callback(state.restore)
        off_out = run(False) if differs else None
        if kernel is not None:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                on_out = run(True)
                torch.cuda.synchronize()
            names = []
            for e in prof.events():
                dt = getattr(e, "device_type", None)
                if dt is not None and str(dt).endswith("CUDA"):
                    names.append(e.name)
            res.kernels = sorted(set(names))
            res.kernels_matched = [n for n in res.kernels if fnmatch.fnmatchcase(n, kernel)]
        else:
            on_out = run(True)
    what = "%s under feature %s" % (component, feat.id)
    if called is not None:
        res.calls_on = counter.get("on", 0)
        res.calls_off = counter.get("off", 0) if differs else None
        if res.calls_on < min_calls:
            res.reasons.append("%s.%s was called %d time(s) with the feature on (at least %d "
                               "expected)%s" % (getattr(called[0], "__name__", type(called[0]).__name__),
                                                called[1], res.calls_on, min_calls,
                                                "" if res.calls_off is None else
                                                "; %d time(s) with it off" % res.calls_off))
    if differs:
        rs = output_slots(off_out)
        cs = output_slots(on_out)
        if [k for k, _ in rs] != [k for k, _ in cs]:
            raise ValueError("probe: %s: the output structures differ with the feature off and on: "
                             "%s vs %s" % (component, [k for k, _ in rs], [k for k, _ in cs]))
        lib = _lib.get()
        diff = []
        for (k, r), (_, c) in zip(rs, cs):
            s = _compare_slot(lib, k, r, c, "T1", None, None, None, component,
                              "/%s/0000/%s" % (component, k), None)
            if not s["identical"]:
                diff.append(k)
        res.differing = diff
        if not diff:
            res.reasons.append("the outputs with the feature on are bit-identical to those with it "
                               "off in every slot (%s)" % ", ".join(k for k, _ in rs))
    if kernel is not None and not res.kernels_matched:
        shown = ", ".join(res.kernels[:12]) + (" ..." if len(res.kernels) > 12 else "")
        res.reasons.append("no CUDA kernel matching %r ran with the feature on (%d distinct kernels "
                           "ran: %s)" % (kernel, len(res.kernels), shown or "none"))
    if res.reasons:
        raise AssertionError("probe: feature not active: %s: %s" % (what, "; ".join(res.reasons)))
    return res
