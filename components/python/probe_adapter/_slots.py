"""Slot names of a call's outputs, shared by the adapter (capture) and
probe.pair (same-process pairing), so that both name a tensor the same way:
"out" for a tensor returned as it is, "out.<key>" one level into a dict
(diffusers BaseOutput, transformers ModelOutput), list, tuple or dataclass,
"out.<key>.<key2>" two levels; diffusers' *Distribution outputs (the VAE
posterior) give their mean and logvar."""

import dataclasses
import numbers

DIST_FIELDS = ("mean", "logvar")  # taken from *Distribution outputs (diffusers' VAE posterior)


def slot_part(key):
    """One path element of a slot name: the key as text, '/' made '_', never empty."""
    s = str(key).replace("/", "_")
    return s if s else "_"


def children(obj, is_tensor):
    """(key, value) pairs one level into a structured output; [] for a tensor
    (is_tensor(obj)), None, a string or a number, and for what is not a container."""
    if obj is None or isinstance(obj, (str, bytes, numbers.Number)) or is_tensor(obj):
        return []
    if isinstance(obj, dict):  # also diffusers BaseOutput / transformers ModelOutput
        return list(obj.items())
    if isinstance(obj, (list, tuple)):
        return list(enumerate(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if type(obj).__name__.endswith("Distribution"):
        return [(k, getattr(obj, k, None)) for k in DIST_FIELDS]
    return []
