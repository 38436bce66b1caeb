"""Hypothesis strategies for any wire Struct, built from msgspec's own view of its types, so
that every bound a message declares is the bound its generated values respect."""

from __future__ import annotations

import math
from typing import Any

import msgspec.inspect as mi
from hypothesis import strategies as st

from engine.wire.control import RoundStart
from engine.wire.groups import RoundGroups
from engine.wire.types import MAX_COUNT, MAX_PIECES

MAX_ITEMS = 3  # lists and dicts stay small: the shapes matter, not the sizes
MAX_TEXT = 12


def valid(type_: Any) -> st.SearchStrategy[Any]:
    """Values of ``type_`` that decoding accepts (Structs whose __post_init__ refuses them are
    filtered out)."""
    return _strategy(mi.type_info(type_))


def _strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(t, mi.StructType):
        return _round_start(t) if t.cls is RoundStart else _struct(t)
    if isinstance(t, mi.Metadata):
        # A rule stated for people and the published schema, checked in __post_init__.
        schema = t.extra_json_schema or {}
        if isinstance(t.type, mi.StrType) and "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        if isinstance(t.type, mi.StrType) and "minLength" in schema:
            return st.text(min_size=schema["minLength"], max_size=schema["minLength"] + MAX_TEXT)
        return _strategy(t.type)
    if isinstance(t, mi.UnionType):
        return st.one_of(*(_strategy(member) for member in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -(2**62))
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**62)
        return st.integers(low, high)
    if isinstance(t, mi.FloatType):
        low = t.ge if t.ge is not None else t.gt
        high = t.le if t.le is not None else t.lt
        return st.floats(low if low is not None else -1e300, high if high is not None else 1e300,
                         exclude_min=t.gt is not None, exclude_max=t.lt is not None,
                         allow_nan=False, allow_infinity=False).filter(math.isfinite)
    if isinstance(t, mi.StrType):
        if t.pattern:
            return st.from_regex(t.pattern, fullmatch=True)
        return st.text(min_size=t.min_length or 0, max_size=min(t.max_length or MAX_TEXT, MAX_TEXT))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.ListType):
        return st.lists(_strategy(t.item_type), min_size=t.min_length or 0,
                        max_size=min(t.max_length or MAX_ITEMS, MAX_ITEMS))
    if isinstance(t, mi.DictType):
        return st.dictionaries(_strategy(t.key_type), _strategy(t.value_type), min_size=t.min_length or 0,
                               max_size=min(t.max_length or MAX_ITEMS, MAX_ITEMS))
    raise NotImplementedError(f"no strategy for {t!r}: teach tests/wire_values.py")


def _struct(t: mi.StructType) -> st.SearchStrategy[Any]:
    fields = {f.name: _strategy(f.type) for f in t.fields}

    def build(values: dict[str, Any]) -> Any:
        try:
            return t.cls(**values)
        except (ValueError, TypeError):
            return None  # refused by __post_init__, as decoding would refuse it

    return st.fixed_dictionaries(fields).map(build).filter(lambda value: value is not None)


@st.composite
def _round_start(draw: st.DrawFn, t: mi.StructType) -> RoundStart:
    """A round's members, shares, probation, auxiliaries and groups hang together by rules
    that random fields almost never meet: draw the members first, and the rest from them
    (the scalar fields still from their declared types)."""
    types = {f.name: f.type for f in t.fields}
    group = draw(st.lists(_strategy(types["checkpoint_by"]).filter(bool), min_size=1, max_size=4,
                          unique=True))
    optional = draw(st.lists(st.sampled_from(group), max_size=len(group) - 1, unique=True))
    active = [p for p in group if p not in optional]
    auxiliary = draw(st.lists(st.sampled_from(active), max_size=len(active) - 1, unique=True))
    share = st.floats(1e-3, 1e9)
    shares = [0.0 if p in optional else draw(share) for p in group]
    grouped = len(group) >= 2 and not optional and draw(st.booleans())
    groups = None
    if grouped:
        cut = draw(st.integers(1, len(group) - 1))
        halves = [group[:cut], group[cut:]]
        reducers = [[h[0]] for h in halves]
        auxiliary = [p for p in auxiliary if [p] in reducers]
        groups = RoundGroups(groups=halves, reducers=reducers, slot_shares=[draw(share)],
                             pieces=[[draw(share), draw(share)]])
    caps = draw(st.one_of(st.just([]), st.lists(st.integers(0, MAX_COUNT), min_size=len(group),
                                                max_size=len(group))))
    return RoundStart(
        round_id=draw(_strategy(types["round_id"])), epoch=draw(_strategy(types["epoch"])),
        group=group, shares=shares, timeout=draw(_strategy(types["timeout"])),
        checkpoint_by=draw(_strategy(types["checkpoint_by"])), optional=optional, auxiliary=auxiliary,
        pieces=1 if grouped else draw(st.integers(1, MAX_PIECES)), caps=caps,
        nonce=draw(_strategy(types["nonce"])), groups=groups)


def structs_of(type_: Any) -> list[type]:
    """The Struct classes a union (or a single Struct) admits."""
    info = mi.type_info(type_)
    members = info.types if isinstance(info, mi.UnionType) else (info,)
    return [m.cls for m in members if isinstance(m, mi.StructType)]
