"""The component table (components/components.json) and class matching.

A pattern is `[module-glob:]Class-glob.method` (docs/components.md):
module-glob is matched with fnmatch (case-sensitive) against the class's
__module__, Class-glob against its __name__, and method is the exact name of
the method to wrap. The table's "exclude_modules" globs keep the table's
patterns away from classes of those modules (e.g. torch.optim's
*LRScheduler.step); extra taps given with probe-run --tap are not excluded.
A row with "opt_in": true (dit.block) finds nothing until it is enabled
(probe-run --blocks: PROBE_OPT_IN); an enabled row's patterns are tried
before the other rows', after --tap and --scope.

A table pattern that starts with '!' is an exclusion of its row: a method it
selects is not taken by that row, wherever in the row's list it stands; a
later row (or a --tap) may still take it. A row's "exclude_slots" globs name
slots (fnmatch against "in.<name>..."/"out.<key>...") that are not captured
for that component (vocabulary logits of a text encoder).
"""

import fnmatch
import json
import os
import re

# Same grammar as scripts/probe-run's check of --tap patterns.
_PATTERN_RE = re.compile(
    r"^(?:(?P<module>[][A-Za-z0-9_.*?!-]+):)?"
    r"(?P<cls>[][A-Za-z0-9_*?!-]+)\."
    r"(?P<method>[A-Za-z_][A-Za-z0-9_]*)$"
)


class TableError(Exception):
    """The table file or an extra tap is unusable; the message names it."""


def check_component_name(name):
    """None when `name` is a valid component name (1..127 bytes of UTF-8, no
    '/', no control characters, not '.' or '..': one HDF5 path element, as
    the shim requires), else why not."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if "/" in name:
        return "contains '/'"
    if name in (".", ".."):
        return "is '.' or '..'"
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in name):
        return "contains a control character"
    try:
        n = len(name.encode("utf-8"))
    except UnicodeError:
        return "is not valid UTF-8"
    if n > 127:
        return "is %d bytes long (at most 127)" % n
    return None


class Pattern:
    __slots__ = ("component", "module_glob", "class_glob", "method", "from_table", "text", "used",
                 "kind", "exclude")

    def __init__(self, component, text, from_table):
        self.exclude = from_table and text.startswith("!")
        if not from_table and text.startswith("!"):
            raise TableError(
                "pattern %r for component %r: a leading '!' (an exclusion) is only for the "
                "component table's rows" % (text, component))
        m = _PATTERN_RE.match(text[1:] if self.exclude else text)
        if m is None:
            raise TableError(
                "malformed pattern %r for component %r (expected [module-glob:]Class-glob.method)"
                % (text, component))
        self.component = component
        self.module_glob = m.group("module")
        self.class_glob = m.group("cls")
        self.method = m.group("method")
        self.from_table = from_table
        self.text = text
        self.used = False  # it selected a method of some class (Table.match)
        self.kind = "table"  # or "--tap" / "--scope" (user patterns)


def default_table_path():
    """components.json next to the adapter's python/ directory: share/probe/
    in a build or install tree, components/ in the source tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(os.path.dirname(here)), "components.json")


class Table:
    """Components (names in table order) and the patterns that find them."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "r", encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as e:
            raise TableError("cannot read component table %s: %s" % (path, e.strerror or e))
        except ValueError as e:
            raise TableError("component table %s is not valid JSON: %s" % (path, e))
        if not isinstance(doc, dict) or doc.get("format") != "probe-components":
            raise TableError("component table %s: \"format\" is not \"probe-components\"" % path)
        if doc.get("version") != 1:
            raise TableError("component table %s: unsupported version %r" % (path, doc.get("version")))
        comps = doc.get("components")
        if not isinstance(comps, list) or not comps:
            raise TableError("component table %s: \"components\" is not a non-empty list" % path)
        self.names = []
        self.exclude_slots = {}  # component -> slot globs not captured
        self.rows = {}
        self.patterns = []
        self.opt_in = {}  # opt-in row name -> its patterns (tried only once enabled)
        for row in comps:
            name = row.get("name") if isinstance(row, dict) else None
            if not isinstance(name, str) or check_component_name(name) is not None:
                raise TableError("component table %s: a component has no valid \"name\"" % path)
            pats = row.get("patterns", [])
            if not isinstance(pats, list) or not all(isinstance(p, str) for p in pats):
                raise TableError("component table %s: \"patterns\" of %s is not a list of strings"
                                 % (path, name))
            slots = row.get("exclude_slots", [])
            if not isinstance(slots, list) or not all(isinstance(g, str) for g in slots):
                raise TableError("component table %s: \"exclude_slots\" of %s is not a list of "
                                 "strings" % (path, name))
            if slots:
                self.exclude_slots[name] = list(slots)
            opt_in = row.get("opt_in", False)
            if not isinstance(opt_in, bool):
                raise TableError("component table %s: \"opt_in\" of %s is not true or false"
                                 % (path, name))
            self.names.append(name)
            self.rows[name] = row
            try:
                row_pats = [Pattern(name, p, True) for p in pats]
            except TableError as e:
                raise TableError("component table %s: %s" % (path, e))
            if opt_in:
                self.opt_in[name] = row_pats
            else:
                self.patterns.extend(row_pats)
        excl = doc.get("exclude_modules", [])
        if not isinstance(excl, list) or not all(isinstance(g, str) for g in excl):
            raise TableError("component table %s: \"exclude_modules\" is not a list of strings" % path)
        self.exclude_modules = list(excl)
        self._extra = []
        self._scopes = []
        self.enabled = []  # opt-in rows enabled, in the order asked
        self.scope_only = set()
        self._compile()

    def add_tap(self, name, text):
        """Add an extra tap (probe-run --tap NAME=PATTERN): the methods PATTERN
        selects are tapped as component NAME, a name of the table (also an
        opt-in row's, without enabling the row's own patterns) or any other
        valid component name, which makes a new component. Raises TableError
        for a bad name or a malformed pattern."""
        why = check_component_name(name)
        if why is not None:
            raise TableError("--tap %s=%s: component name %r %s (1..127 bytes, no '/', no control "
                             "characters, not '.' or '..')" % (name, text, name, why))
        p = Pattern(name, text, False)
        p.kind = "--tap"
        self._extra.append(p)
        self._compile()

    def add_scope(self, name, text):
        """Add a scope-only component (probe-run --scope NAME=PATTERN): each
        call of the method opens a component scope NAME in the shim
        (probe_scope_enter_v1), so the library calls it makes (GEMMs,
        collectives, kernels) are named /NAME/<call>/..., but none of its
        tensors is tapped. NAME is any component name (1..127 bytes, no '/').
        Raises TableError for a bad name or a malformed pattern."""
        why = check_component_name(name)
        if why is not None:
            raise TableError("--scope %s=%s: %r is not a valid component name (1..127 bytes, "
                             "no '/', no control characters)" % (name, text, name))
        p = Pattern(name, text, False)
        p.kind = "--scope"
        self._scopes.append(p)
        self.scope_only.add(name)
        self._compile()

    def enable(self, name):
        """Turn on the opt-in row `name` (probe-run --blocks: dit.block): its
        patterns are tried after --tap and --scope, before the other rows.
        Raises TableError when the table has no such opt-in row."""
        if name not in self.opt_in:
            raise TableError("component table %s has no opt-in component %r (opt-in: %s)"
                             % (self.path, name, ", ".join(sorted(self.opt_in)) or "none"))
        if name not in self.enabled:
            self.enabled.append(name)
            self._compile()

    def _compile(self):
        # Extra taps first: an explicit --tap decides a method that a table
        # pattern would give to another component; then --scope patterns,
        # then the enabled opt-in rows (a *DiTBlock is a block, not the
        # *DiT*.forward of dit.step), then the table.
        opt = [p for name in self.enabled for p in self.opt_in[name]]
        every = self._extra + self._scopes + opt + self.patterns
        self._excl = [p for p in every if p.exclude]
        self._all = [p for p in every if not p.exclude]
        globs = sorted({p.class_glob for p in self._all})
        self._quick = re.compile("|".join(fnmatch.translate(g) for g in globs)) if globs else None

    def match(self, cls):
        """[(method, component), ...] for the methods of class `cls` that a
        pattern selects (first matching pattern wins per method), only
        methods that cls has (own or inherited)."""
        name = getattr(cls, "__name__", None)
        if not isinstance(name, str) or self._quick is None or not self._quick.match(name):
            return []
        module = getattr(cls, "__module__", None)
        if not isinstance(module, str):
            module = ""
        excluded = any(fnmatch.fnmatchcase(module, g) for g in self.exclude_modules)

        def selects(p):
            if p.module_glob is not None and not fnmatch.fnmatchcase(module, p.module_glob):
                return False
            return fnmatch.fnmatchcase(name, p.class_glob)

        # a row's exclusions ('!') hold wherever they stand in its list
        blocked = set() if excluded else {(p.component, p.method) for p in self._excl if selects(p)}
        found = {}
        for p in self._all:
            if p.from_table and excluded:
                continue
            if p.method in found or (p.from_table and (p.component, p.method) in blocked):
                continue
            if not selects(p):
                continue
            if any(p.method in k.__dict__ for k in getattr(cls, "__mro__", ())):
                found[p.method] = p.component
                p.used = True
        return list(found.items())

    def slot_excluded(self, component, slot):
        """True when the row of `component` excludes `slot` from capture."""
        globs = self.exclude_slots.get(component)
        return bool(globs) and any(fnmatch.fnmatchcase(slot, g) for g in globs)

    def unused_user_patterns(self):
        """The --tap / --scope patterns that selected no method of any class
        seen so far: [(kind, component, pattern text)]."""
        return [(p.kind, p.component, p.text) for p in self._extra + self._scopes if not p.used]

    def unused_enabled_rows(self):
        """The enabled opt-in rows none of whose patterns selected a method:
        [(component, [pattern texts])]."""
        return [(name, [p.text for p in self.opt_in[name]]) for name in self.enabled
                if not any(p.used for p in self.opt_in[name])]


def parse_taps(text):
    """Lines `NAME=PATTERN` of PROBE_TAPS -> [(name, pattern)]; blank lines
    are skipped; a line without '=' is returned as (line, None)."""
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, pat = line.partition("=")
        out.append((name.strip(), pat.strip() if sep else None))
    return out
