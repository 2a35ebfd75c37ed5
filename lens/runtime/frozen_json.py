"""JSON made immutable, for the file formats held as frozen values (the store's manifest, ``result.json``,
``main_job.json``; issue #41): objects as :class:`FrozenDict`, arrays as :class:`FrozenList` — a ``dict`` / ``list``
that refuses every change, so ``json.dumps`` and any parser that wants a dict or a list still take it, and
:func:`thaw` gives the plain JSON back, in the same order. Nothing here imports torch (the explorer's data layer
reads result files through it)."""

from __future__ import annotations

from typing import Any


class FrozenDict(dict):
    """A JSON object that cannot be changed (a ``dict`` subclass, so ``json.dumps`` writes it as one)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a frozen value: change a copy from its to_dict() instead")

    __setitem__ = __delitem__ = __ior__ = _refuse  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce__(self):  # pickled (a store sent to a worker process) and copied whole, never item by item
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))


class FrozenList(list):
    """A JSON array that cannot be changed (a ``list`` subclass: equal to the list it was, and a parser that
    wants a list takes it)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a frozen value: change a copy from its to_dict() instead")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]

    def __reduce__(self):
        return (FrozenList, (list(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))


def freeze(value: Any) -> Any:
    """JSON ``value`` made immutable, order kept: objects as :class:`FrozenDict`, arrays as :class:`FrozenList`."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The plain JSON of a frozen ``value``: dicts and lists, order kept."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def ordered(values: dict, keys: tuple[str, ...]) -> dict:
    """``values`` in the order ``keys`` names (the order the JSON was read in), the rest after them."""
    out = {k: values[k] for k in keys if k in values}
    out.update((k, v) for k, v in values.items() if k not in out)
    return out
