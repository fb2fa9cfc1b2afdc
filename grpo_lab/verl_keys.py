"""verl's keys, read and written by dotted path on the resolved config verl gets (`get(verl, A + "rollout.n")`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

A = "actor_rollout_ref."
MISSING = object()  # what lookup finds where a key is not


def get(d: Mapping[str, Any] | None, dotted: str, default: Any = None) -> Any:
    """d['a']['b'] for 'a.b', or default when any part is missing or the value is None."""
    cur = lookup(d, dotted)
    return default if cur is None or cur is MISSING else cur


def put(d: dict[str, Any], dotted: str, value: Any) -> None:
    """d['a']['b'] = value for 'a.b', making the dicts on the way."""
    *path, leaf = dotted.split(".")
    for part in path:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d = d[part]
    d[leaf] = value


def merge(into: dict[str, Any], new: Mapping[str, Any], keep_dicts: bool = False) -> None:
    """`new` merged into `into` in place, key by key, the dicts on the way new; keep_dicts: a value that is not a
    mapping leaves a dict already there as it is."""
    for k, v in new.items():
        if isinstance(v, Mapping):
            if not isinstance(into.get(k), dict):
                into[k] = {}
            merge(into[k], v, keep_dicts)
        elif not (keep_dicts and isinstance(into.get(k), dict)):
            into[k] = v


def with_value(d: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of d with d['a']['b'] = value for 'a.b': the dicts on the way are new (read-only mappings too),
    everything else is shared."""
    out = cur = dict(d)
    *path, leaf = dotted.split(".")
    for part in path:
        cur[part] = dict(cur[part]) if isinstance(cur.get(part), Mapping) else {}
        cur = cur[part]
    cur[leaf] = value
    return out


def flatten(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf) pairs; an empty dict is a leaf."""
    if isinstance(d, Mapping) and d:
        for k, v in d.items():
            yield from flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], d


def lookup(d: Any, dotted: str) -> Any:
    """d['a']['b'] for 'a.b' as it is (None too), MISSING when a part is missing."""
    cur = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return MISSING
        cur = cur[part]
    return cur


def freeze(x: Any) -> Any:
    """A read-only copy: mappings become MappingProxyType, lists tuples (rules cannot change what they read)."""
    if isinstance(x, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return tuple(freeze(v) for v in x)
    return x


def thaw(x: Any) -> Any:
    """Plain dicts and lists again from what freeze made (to compare with plain data, or hand on as verl would)."""
    if isinstance(x, Mapping):
        return {k: thaw(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [thaw(v) for v in x]
    return x
