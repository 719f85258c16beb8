"""Drafts: a dataclass state that reads through to another and copies only what it touches.

``draft(state)`` is a new instance of a subclass of the state's class whose fields are layered
over the original's as they are first read (dicts, lists and sets as layers): a read of an entry
hands out a private shallow copy of it (kept in the layer), a write lands in the layer, and the
original is never changed. So checking what a change would do costs what the change touches, not
the size of the state (docs/development.md: nothing proportional to a mission's history per
request). A draft answers the state's own queries, but ``dataclasses.asdict`` and ``copy`` of it
see the layers, not a state; what it holds becomes the original's with ``merge`` (then the draft
is done with): several changes checked together and applied together or not at all, for what
the changes touch.

The state's entries must be either immutable or mutated only through their own attributes (a
shallow copy then keeps them apart); nested containers inside an entry are never mutated in
place (an entry's list is copied with it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, MutableMapping
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
            value = own[key] = _shallow(value)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._own or (key not in self._gone and key in self._base)

    # ``get`` and ``setdefault`` without the mixins' KeyError for a missing key (the fold asks
    # for entries that are not there yet at nearly every event)
    def get(self, key: _K, default: Any = None) -> Any:
        own = self._own
        if key in own:
            return own[key]
        if key in self._gone or key not in self._base:
            return default
        return self[key]

    def setdefault(self, key: _K, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default
        return default

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

    def write_through(self) -> None:
        """Append to the original what was appended here (``merge``)."""
        self._base.extend(self._own)

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

    def write_through(self) -> None:
        """Add to the original what was added here (``merge``)."""
        self._base.update(self._own)

    def __contains__(self, item: object) -> bool:
        return item in self._own or item in self._base

    def __len__(self) -> int:
        return len(self._base) + sum(1 for i in self._own if i not in self._base)


def _layered(value: Any) -> Any:
    layer = _LAYERS.get(type(value))
    if layer is not None:
        return layer(value)
    if isinstance(value, dict):
        return Layer(value)
    if isinstance(value, list):
        return Tail(value)
    if isinstance(value, set):
        return Seen(value)
    if _mutable(value):  # a nested state object (e.g. the mission's terms): its own copy
        return _shallow(value)
    return value


_LAYERS: dict[type, Callable[[Any], Any]] = {dict: Layer, list: Tail, set: Seen}


def _shallow(value: Any) -> Any:
    """A shallow copy: a container's ``copy()``; an instance with a ``__dict__`` made anew with
    a copy of it (what ``copy.copy`` does for a plain class, without its dispatch: a draft
    copies every entry it reads); anything else by ``copy.copy``."""
    if isinstance(value, _CONTAINERS):
        return value.copy()
    attrs = getattr(value, "__dict__", None)
    if attrs is None or hasattr(type(value), "__slots__"):
        return copy.copy(value)
    new = object.__new__(type(value))
    new.__dict__.update(attrs)
    return new


class _LayeredField:
    """A field of a draft: layered over the original's on first read, then the draft's own (a
    non-data descriptor: the value it stores in the instance hides it from then on, and a write
    lands there too), so a draft costs the fields a change touches, not every field."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = _layered(getattr(instance.__dict__["_origin"], self.name))
        instance.__dict__[self.name] = value
        return value


_draft_classes: dict[type, type] = {}


def _draft_class(kind: type) -> type:
    """``kind``'s draft class (made once): a subclass whose every field is layered on touch."""
    made = _draft_classes.get(kind)
    if made is None:
        fields = {f.name: _LayeredField(f.name) for f in dataclasses.fields(kind)}
        made = _draft_classes[kind] = type(f"Draft{kind.__name__}", (kind,), fields)
    return made


def draft(state: _S) -> _S:
    """A draft of the dataclass ``state``: an instance of a subclass of its class whose fields
    are layered over the original's as they are first read; changes to the draft never reach
    ``state``. O(1) to make; each field touched costs one layer."""
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        raise TypeError(f"draft needs a dataclass instance, not {type(state).__name__}")
    new: Any = object.__new__(_draft_class(type(state)))
    new.__dict__["_origin"] = state
    return new  # type: ignore[no-any-return]


def merge(drafted: Any, into: Any) -> None:
    """Make ``into`` (the state ``drafted`` was drafted from) hold what the draft holds: each
    touched field's layer written through (its entries, deletions, appended items), every other
    touched field taken as the draft has it. Costs what the draft touched; the draft is not to
    be used after."""
    for name, value in drafted.__dict__.items():
        kind = type(value)  # exact types: ``isinstance`` of an ABC's subclass is slow
        if kind is Layer:
            base = value._base
            for key in value._gone:
                base.pop(key, None)
            base.update(value._own)
        elif kind is Tail or kind is Seen:
            value.write_through()
        elif name != "_origin":
            object.__setattr__(into, name, value)


__all__ = ["Layer", "Seen", "Tail", "draft", "merge"]
