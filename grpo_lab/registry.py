"""One shape for the project's registries: the preflight's rules (grpo_lab/checks/rules) and the doctor's failure
signatures (grpo_lab/after_run/doctor).

An entry's fields, the registration order and an example: docs/preflight.md."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

# the phases of a job, in the order a job passes them
PHASES: dict[str, str] = {
    "compose": "the config as composed: its keys and the types and ranges of its values",
    "preflight": "grpo-lab's own checks before anything starts: what they planned from, what they skipped",
    "start-up": "Ray, the workers, the model and the rollout engine starting; verl's checks of its config",
    "rollout": "generating the answers",
    "reward": "scoring the answers",
    "update": "the actor's update and the log-prob passes",
    "weight sync": "the new weights (or the LoRA adapter) handed to the rollout engine",
    "any": "no single phase: the whole run, or a phase the evidence does not tell",
}

_ID = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Entry:
    """One registered thing: its id, its kind and the phase of a job it concerns."""

    id: str
    kind: str
    phase: str


E = TypeVar("E", bound=Entry)


class Registry(Mapping[str, E], Generic[E]):
    """Entries by id, in registration order. `what` names an entry in errors ("rule", "doctor signature"); kinds:
    each kind with what it covers; kinds_listed_in: where a reader finds them (said in errors)."""

    def __init__(self, what: str, kinds: Mapping[str, str], kinds_listed_in: str) -> None:
        self.what = what
        self.kinds = dict(kinds)
        self.kinds_listed_in = kinds_listed_in
        self._entries: dict[str, E] = {}

    def add(self, entry: E) -> E:
        if not _ID.match(entry.id):
            raise ValueError(f"{self.what} id {entry.id!r}: use lower-case letters, digits and underscores")
        if entry.id in self._entries:
            raise ValueError(f"{self.what} {entry.id!r} is registered twice")
        if entry.kind not in self.kinds:
            raise ValueError(f"{self.what} {entry.id!r}: kind {entry.kind!r} is not one of "
                             f"{', '.join(self.kinds)} ({self.kinds_listed_in})")
        if entry.phase not in PHASES:
            raise ValueError(f"{self.what} {entry.id!r}: phase {entry.phase!r} is not one of "
                             f"{', '.join(PHASES)} (PHASES in grpo_lab/registry.py)")
        self._entries[entry.id] = entry
        return entry

    def ids(self, kind: str | None = None) -> list[str]:
        """Every id, or those of one kind; a kind this registry does not have is an error, not an empty list."""
        if kind is not None and kind not in self.kinds:
            raise ValueError(f"{self.what} kind {kind!r} is not one of {', '.join(self.kinds)} "
                             f"({self.kinds_listed_in})")
        return [e.id for e in self._entries.values() if kind is None or e.kind == kind]

    def sort(self, key: Callable[[E], Any]) -> None:
        """Put the entries in the order of key (stable: entries of one key keep their registration order)."""
        self._entries = dict(sorted(self._entries.items(), key=lambda item: key(item[1])))

    def kind_of(self, entry_id: str) -> str | None:
        e = self._entries.get(entry_id)
        return e.kind if e is not None else None

    def __getitem__(self, entry_id: str) -> E:
        return self._entries[entry_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
