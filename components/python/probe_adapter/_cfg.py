"""Denoising steps from the pipeline's NVTX ranges, and CFG branches batched
into one denoiser call (docs/components.md "Steps and CFG branches").

NVTX: the adapter wraps the Python `nvtx` package (PyPI `nvtx`, which
TensorRT-LLM's `nvtx_range` calls as `nvtx.annotate(msg, color=..,
domain="TensorRT-LLM")`) as soon as it is imported: `nvtx.annotate` (context
manager and decorator), `nvtx.push_range` and `nvtx.pop_range` keep, per
thread, the stack of open ranges (domain, message) and then do what they did.
Two range names matter:
  * `denoise_step {i}` (also `denoise_step_{i}`): the denoising step of the
    dit.step / dit.block calls inside it is i, and the CFG branch counter
    restarts at each new such range;
  * `_scheduler_step`: when it closes and no tapped scheduler.step completed
    inside it, one denoising step has completed (as a scheduler.step would).

CFG batched into one call: a dit.step call whose latent input (keyword
`hidden_states`, `sample` or `x`, else the first positional tensor) has twice
the batch of the last latents.init output holds both CFG branches along
axis 0, in the order [uncond, cond] (the convention of TensorRT-LLM
VisualGen's BasePipeline._denoise_step_standard, `torch.cat([neg, pos])`, and
of diffusers' batched pipelines, `noise_pred.chunk(2)` -> uncond, text).
Such calls are listed in the manifest key "cfg_batch".
"""

import functools
import re
import sys
import threading

_STEP_RE = re.compile(r"^denoise_step[ _](\d+)$")
SCHEDULER_RANGE = "_scheduler_step"
BATCH_ORDER = ("uncond", "cond")
LATENT_KWARGS = ("hidden_states", "sample", "x")


class NvtxSteps:
    """Per-thread stack of the `nvtx` package's open ranges."""

    def __init__(self, on_scheduler_range_end):
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._instances = 0
        self._on_scheduler_range_end = on_scheduler_range_end
        self.wrapped = False

    def _stack(self):
        s = getattr(self._tls, "stack", None)
        if s is None:
            s = self._tls.stack = []
        return s

    def push(self, domain, message):
        m = _STEP_RE.match(message) if isinstance(message, str) else None
        entry = {"domain": domain, "message": message, "step": -1, "instance": -1,
                 "sched_done": False}
        if m:
            with self._lock:
                self._instances += 1
                entry["instance"] = self._instances
            entry["step"] = int(m.group(1))
            self._tls.last_step = (entry["step"], entry["instance"])
        self._stack().append(entry)

    def pop(self, domain):
        s = self._stack()
        for i in range(len(s) - 1, -1, -1):
            if s[i]["domain"] == domain:
                e = s.pop(i)
                if e["message"] == SCHEDULER_RANGE and not e["sched_done"]:
                    self._on_scheduler_range_end()
                return

    def enclosing_step(self):
        """(step, instance) of the innermost open `denoise_step {i}` range of
        this thread, or None."""
        for e in reversed(self._stack()):
            if e["step"] >= 0:
                return e["step"], e["instance"]
        return None

    def last_step(self):
        """(step, instance) of the last `denoise_step {i}` range opened on this
        thread, or None."""
        return getattr(self._tls, "last_step", None)

    def scheduler_completed(self):
        """A tapped scheduler.step completed: the enclosing `_scheduler_step`
        range (if any) does not count a step again."""
        for e in reversed(self._stack()):
            if e["message"] == SCHEDULER_RANGE:
                e["sched_done"] = True
                return

    def wrap(self, nvtx):
        """Wrap nvtx.annotate, nvtx.push_range and nvtx.pop_range of the
        imported `nvtx` module. Leaves the module as it is when it lacks them."""
        orig = getattr(nvtx, "annotate", None)
        push, pop = getattr(nvtx, "push_range", None), getattr(nvtx, "pop_range", None)
        tolerate_color_names(nvtx)
        if not isinstance(orig, type) or getattr(orig, "__probe_wrapped__", False):
            return
        tracker = self

        class annotate(orig):
            __probe_wrapped__ = True

            def __init__(self, message=None, color=None, domain=None, category=None,
                         payload=None, **kw):
                super().__init__(message, color, domain, category, payload, **kw)
                self._probe_range = (domain, message)

            def __enter__(self):
                tracker.push(*self._probe_range)
                try:
                    return super().__enter__()
                except BaseException:
                    tracker.pop(self._probe_range[0])
                    raise

            def __exit__(self, *exc):
                try:
                    return super().__exit__(*exc)
                finally:
                    tracker.pop(self._probe_range[0])

            def __call__(self, func):
                inner = super().__call__(func)
                domain, message = self._probe_range
                name = message if message is not None else getattr(func, "__name__", None)

                @functools.wraps(func)
                def probe_nvtx_range(*args, **kwargs):
                    tracker.push(domain, name)
                    try:
                        return inner(*args, **kwargs)
                    finally:
                        tracker.pop(domain)
                return probe_nvtx_range

        annotate.__name__ = annotate.__qualname__ = orig.__name__
        annotate.__module__ = orig.__module__
        annotate.__doc__ = orig.__doc__
        nvtx.annotate = annotate
        if callable(push) and callable(pop):
            @functools.wraps(push)
            def push_range(message=None, color=None, domain=None, *args, **kwargs):
                tracker.push(domain, message)
                return push(message, color, domain, *args, **kwargs)

            @functools.wraps(pop)
            def pop_range(domain=None, *args, **kwargs):
                try:
                    return pop(domain, *args, **kwargs)
                finally:
                    tracker.pop(domain)
            nvtx.push_range, nvtx.pop_range = push_range, pop_range
        self.wrapped = True


UNRESOLVED_COLOR = 0x808080


def tolerate_color_names(nvtx):
    """Keep a color name the `nvtx` package cannot resolve from failing the
    program. With a tool attached (probe-run attaches its NVTX injection)
    nvtx resolves every range's color (nvtx.colors.color_to_hex): a name
    outside its own table goes through matplotlib and raises TypeError when
    matplotlib is absent (TensorRT-LLM's default "grey"), ValueError when the
    name is unknown to matplotlib too; without a tool attached nvtx never
    resolves it, so the same program runs. Such a name resolves to grey
    (UNRESOLVED_COLOR) instead; every name nvtx or matplotlib resolves is
    unchanged. Patches nvtx.colors.color_to_hex and the name nvtx._lib.lib
    imported from it."""
    colors = sys.modules.get("nvtx.colors")
    orig = getattr(colors, "color_to_hex", None)
    if not callable(orig) or getattr(orig, "__probe_wrapped__", False):
        return

    @functools.wraps(orig)
    def color_to_hex(color=None):
        try:
            return orig(color)
        except (TypeError, ValueError):
            return UNRESOLVED_COLOR
    color_to_hex.__probe_wrapped__ = True
    colors.color_to_hex = color_to_hex
    lib = sys.modules.get("nvtx._lib.lib")
    if lib is not None and getattr(lib, "color_to_hex", None) is orig:
        try:
            lib.color_to_hex = color_to_hex
        except (AttributeError, TypeError):
            pass


def latent_batch(torch, value):
    """Batch (axis 0 extent) of the first tensor of a source's output, or None."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else None
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return latent_batch(torch, value[0])
    return None


def latent_input(torch, args, kwargs):
    """The denoiser call's latent input: keyword hidden_states/sample/x, else
    the first positional tensor after self."""
    for k in LATENT_KWARGS:
        v = kwargs.get(k)
        if isinstance(v, torch.Tensor):
            return v
    for v in args[1:]:
        if isinstance(v, torch.Tensor):
            return v
    return None
