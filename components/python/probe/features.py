"""The feature table: which features a project's parity tests run over.

A feature is an id (the column of a components x features matrix,
docs/matrix.md), a way to switch it on (a callable that returns a context
manager: inside it the feature is on), the gate its parity is judged by
(docs/gates.md: "T1", "T1-relaxed:CAUSE", "T2") and a set of capabilities
(free-form strings such as "attention", "lossy", "kernel-swap") that tests
select features by:

    # conftest.py
    import probe
    probe.register_feature("flash-attn", enable=lambda: attn_backend("flash"),
                           gate="T1-relaxed:backend-swap", capabilities={"attention"})

    # test_attention.py
    @probe.parametrize_features("attention")
    def test_attention(feature):
        with feature.enable():
            ...

The table is FEATURES (id -> Feature), filled by register_feature; the
pytest plugin (probe.pytest_plugin) parametrizes a test marked by
parametrize_features over the features that have every capability it names,
and fails collection when none has them (never an empty, silently skipped
parameter set). docs/pytest.md.
"""

import contextlib

__all__ = ["Feature", "FEATURES", "register_feature", "unregister_feature", "features_with",
           "parametrize_features"]

# id -> Feature, in registration order
FEATURES = {}


def _check_id(fid):
    __tracebackhide__ = True
    if not isinstance(fid, str):
        raise TypeError("probe: a feature id must be a string, not %s %r" % (type(fid).__name__, fid))
    if not fid or fid != fid.strip() or any(ch in fid for ch in "/,{}") or \
            any(ord(ch) < 0x20 for ch in fid):
        raise ValueError("probe: feature id %r: must be non-empty, without '/', ',', braces, "
                         "control characters or surrounding spaces (it is the FEATURE of a "
                         "COMPONENT/FEATURE cell id)" % (fid,))
    return fid


def _check_gate(gate):
    """The gate string, parsed by libprobe's probe_gate_parse (ValueError for an
    unknown gate or cause)."""
    __tracebackhide__ = True
    import ctypes
    from . import _lib
    if not isinstance(gate, str):
        raise TypeError("probe: a feature's gate must be a string such as 'T1', not %s %r"
                        % (type(gate).__name__, gate))
    lib = _lib.get()
    g = _lib.Gate()
    lib.check(lib.gate_parse(gate.encode(), ctypes.byref(g)), "probe: feature gate %r" % gate)
    return gate


def _check_caps(caps):
    __tracebackhide__ = True
    if isinstance(caps, str):
        raise TypeError("probe: capabilities must be a set of strings, not the string %r "
                        "(write {%r})" % (caps, caps))
    out = frozenset(caps)
    for c in out:
        if not isinstance(c, str) or not c:
            raise TypeError("probe: a capability must be a non-empty string, not %r" % (c,))
    return out


class Feature:
    """One row of the feature table.

    id: the feature's name (no '/', ',' or braces).
    enable: a callable taking no argument that returns a context manager
        under which the feature is on (a contextlib.contextmanager function, a
        class, a lambda returning one). None: nothing to switch (e.g. a feature
        that a test applies itself); enable() is then a no-op context.
    gate: the gate its parity is judged by ("T1", "T1-relaxed:CAUSE", "T2").
    capabilities: a set of strings that tests select features by.
    description: free text.
    """

    def __init__(self, id, enable=None, gate="T1", capabilities=(), description=""):
        __tracebackhide__ = True
        self.id = _check_id(id)
        if enable is not None and not callable(enable):
            raise TypeError("probe: feature %r: enable must be a callable returning a context "
                            "manager, not %s %r" % (id, type(enable).__name__, enable))
        self._enable = enable
        self.gate = _check_gate(gate)
        self.capabilities = _check_caps(capabilities)
        self.description = str(description)

    def enable(self):
        """A context manager under which the feature is on."""
        __tracebackhide__ = True
        if self._enable is None:
            return contextlib.nullcontext()
        cm = self._enable()
        if not (hasattr(cm, "__enter__") and hasattr(cm, "__exit__")):
            raise TypeError("probe: feature %r: enable() returned %s %r, not a context manager"
                            % (self.id, type(cm).__name__, cm))
        return cm

    def has(self, *capabilities):
        """True when the feature has every capability given."""
        return set(capabilities) <= self.capabilities

    def __repr__(self):
        return "Feature(%r, gate=%r, capabilities=%r)" % (self.id, self.gate,
                                                          sorted(self.capabilities))

    def __str__(self):
        return self.id


def register_feature(feature, enable=None, gate="T1", capabilities=(), description="",
                     replace=False):
    """Add a feature to FEATURES and return it. `feature` is a Feature, or an
    id with the other arguments as Feature's. A second feature of the same id
    is a ValueError unless replace=True."""
    __tracebackhide__ = True
    if not isinstance(feature, Feature):
        feature = Feature(feature, enable=enable, gate=gate, capabilities=capabilities,
                          description=description)
    if feature.id in FEATURES and not replace:
        raise ValueError("probe: feature %r is already registered (replace=True replaces it)"
                         % feature.id)
    FEATURES[feature.id] = feature
    return feature


def unregister_feature(fid):
    """Remove a feature from FEATURES (KeyError when it is not there)."""
    del FEATURES[fid]


def features_with(*capabilities):
    """The registered features that have every capability given, in
    registration order (every feature when none is given)."""
    return [f for f in FEATURES.values() if f.has(*capabilities)]


def parametrize_features(*capabilities, argname="feature"):
    """Decorator: parametrize a pytest test over the registered features that
    have every capability given; the test receives the Feature as `argname`,
    each case's id is the feature's id. The features are looked up when pytest
    collects the test (so a conftest may register them later than the
    decorator runs). No feature with those capabilities fails collection with
    an error naming them and the capabilities that exist. Needs the pytest
    plugin (registered by the package; else -p probe.pytest_plugin)."""
    __tracebackhide__ = True
    if not capabilities:
        raise TypeError("probe: parametrize_features needs at least one capability")
    _check_caps(capabilities)
    if not isinstance(argname, str) or not argname.isidentifier():
        raise TypeError("probe: parametrize_features: argname must be an identifier, not %r"
                        % (argname,))
    import pytest
    return pytest.mark.probe_features(*capabilities, argname=argname)
