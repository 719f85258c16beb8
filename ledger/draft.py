"""Drafts: a dataclass state that reads through to another and copies only what it touches.

``draft(state)`` is a new instance of the state's class whose tables (dicts, lists, sets) are layers
over the original's: a read of an entry hands out a private shallow copy of it (kept in the layer),
a write lands in the layer, and the original is never changed. So checking what a change would do
costs what the change touches, not the size of the state (docs/development.md: nothing proportional
to a mission's history per request). A draft answers the state's own queries, but
``dataclasses.asdict`` and ``copy`` of it see the layers, not a state; what it holds becomes the
original's with ``merge`` (then the draft is done with): several changes checked together and
applied together or not at all, for what the changes touch.

The state's entries must be either immutable or mutated only through their own attributes (a
shallow copy then keeps them apart); nested containers inside an entry are never mutated in
place (an entry's list is copied with it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")
_S = TypeVar("_S")

_CONTAINERS = (list, dict, set)
_mutable_types: dict[type, bool] = {}


def _mutable(value: object) -> bool:
    """Whether an entry can change in place: a container, or a dataclass that is not frozen."""
    kind = type(value)
    known = _mutable_types.get(kind)
    if known is None:
        params = getattr(kind, "__dataclass_params__", None)
        known = isinstance(value, _CONTAINERS) or (params is not None and not params.frozen)
        _mutable_types[kind] = known
    return known


class Layer(MutableMapping[_K, _V]):
    """A dict seen through a layer: reads fall through to ``base`` (a mutable entry is copied
    into the layer first), writes and deletions stay in the layer."""

    __slots__ = ("_base", "_gone", "_own")

    def __init__(self, base: Mapping[_K, _V]) -> None:
        self._base = base
        self._own: dict[_K, _V] = {}
        self._gone: set[_K] = set()

    def __getitem__(self, key: _K) -> _V:
        own = self._own
        if key in own:
            return own[key]
        if key in self._gone:
            raise KeyError(key)
        value = self._base[key]
        if _mutable(value):
            value = copy.copy(value)
            own[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._own or (key not in self._gone and key in self._base)

    def __setitem__(self, key: _K, value: _V) -> None:
        self._own[key] = value
        self._gone.discard(key)

    def __delitem__(self, key: _K) -> None:
        if key not in self:
            raise KeyError(key)
        self._own.pop(key, None)
        if key in self._base:
            self._gone.add(key)

    def __iter__(self) -> Iterator[_K]:
        own, gone = self._own, self._gone
        for key in self._base:
            if key not in gone:
                yield key
        for key in own:
            if key not in self._base:
                yield key

    def __len__(self) -> int:
        added = sum(1 for key in self._own if key not in self._base)
        return len(self._base) - len(self._gone) + added


class Tail:
    """A list seen through a layer: its items, then those appended to the layer."""

    __slots__ = ("_base", "_own")

    def __init__(self, base: list[Any]) -> None:
        self._base = base
        self._own: list[Any] = []

    def append(self, item: Any) -> None:
        self._own.append(item)

    def __iter__(self) -> Iterator[Any]:
        yield from self._base
        yield from self._own

    def __reversed__(self) -> Iterator[Any]:
        yield from reversed(self._own)
        yield from reversed(self._base)

    def __len__(self) -> int:
        return len(self._base) + len(self._own)


class Seen:
    """A set seen through a layer: membership in either, additions to the layer."""

    __slots__ = ("_base", "_own")

    def __init__(self, base: set[Any]) -> None:
        self._base = base
        self._own: set[Any] = set()

    def add(self, item: Any) -> None:
        self._own.add(item)

    def __contains__(self, item: object) -> bool:
        return item in self._own or item in self._base

    def __len__(self) -> int:
        return len(self._base) + sum(1 for i in self._own if i not in self._base)


def _layered(value: Any) -> Any:
    if isinstance(value, dict):
        return Layer(value)
    if isinstance(value, list):
        return Tail(value)
    if isinstance(value, set):
        return Seen(value)
    if _mutable(value):  # a nested state object (e.g. the mission's terms): its own copy
        return copy.copy(value)
    return value


def draft(state: _S) -> _S:
    """A draft of the dataclass ``state``: the same class, every field layered over the
    original's; changes to the draft never reach ``state``. O(number of fields)."""
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        raise TypeError(f"draft needs a dataclass instance, not {type(state).__name__}")
    new = object.__new__(type(state))
    for f in dataclasses.fields(state):
        object.__setattr__(new, f.name, _layered(getattr(state, f.name)))
    return new


def merge(drafted: Any, into: Any) -> None:
    """Make ``into`` (the state ``drafted`` was drafted from) hold what the draft holds: each
    layer's entries written through, its deletions made, its appended items appended; every
    other field taken as the draft has it. Costs what the draft touched; the draft is not to be
    used after."""
    for f in dataclasses.fields(into):
        name = f.name
        value = getattr(drafted, name)
        if isinstance(value, Layer):
            base = value._base
            assert isinstance(base, dict)
            for key in value._gone:
                base.pop(key, None)
            base.update(value._own)
        elif isinstance(value, Tail):
            value._base.extend(value._own)
        elif isinstance(value, Seen):
            value._base.update(value._own)
        else:
            object.__setattr__(into, name, value)


__all__ = ["Layer", "Seen", "Tail", "draft", "merge"]
