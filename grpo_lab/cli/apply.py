"""Changes to a resolved config: a fix, a memory remedy and a fit move are each `Change`s, applied here as composing
them would have (the preflight's fix re-check, the fit's verify) and printed from the same values; how: docs/cli.md."""

from __future__ import annotations

import copy
import functools
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from grpo_lab import facts
from grpo_lab.cli.knobs import SHORT_KEYS, moved_with, short_key_targets
from grpo_lab.labconf import Lab
from grpo_lab.verl_keys import get, lookup, put, thaw

MAX_MODEL_LEN = "actor_rollout_ref.rollout.max_model_len"
LENGTHS = ("data.max_prompt_length", "data.max_response_length")
_MISSING = object()


@dataclass(frozen=True)
class Change:
    """One override of the config: the key (verl's, a short key or lab's), its value, why; `op` is Hydra's "" | "+" |
    "++" | "~" (a key the config lacks is added with "+", one the user added is set again with "++")."""

    key: str
    value: Any = None
    op: str = ""
    reason: str = ""

    @property
    def override(self) -> str:
        """The change as Hydra reads it: `key=value`, the value quoted for Hydra's grammar."""
        from grpo_lab.cli.overrides import quote

        return f"~{self.key}" if self.op == "~" else f"{self.op}{self.key}={quote(self.value)}"

    @property
    def token(self) -> str:
        """The change as typed after `python run.py`: the override, quoted for the shell where it must be."""
        tok = self.override
        if re.fullmatch(r"[\w.+~=@/:,-]+", tok):
            return tok
        if not re.search(r"[\"$`!\\]", tok):
            return f'"{tok}"'  # key='1': the shell keeps Hydra's quotes inside double quotes
        return shlex.quote(tok)


def text(changes: Iterable[Change]) -> str:
    """Changes as typed after `python run.py`."""
    return " ".join(c.token for c in changes)


@functools.cache
def groups() -> frozenset[str]:
    return frozenset(p.name for p in facts.CONF.iterdir() if p.is_dir()) if facts.CONF.is_dir() else frozenset()


def parse(text: str | Iterable[str]) -> list[Change] | None:
    """The changes of overrides as typed after `python run.py` (Hydra's grammar); None when it is not all
    overrides: advice in words, or a config-group choice, which only a compose can apply."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        tokens = shlex.split(text) if isinstance(text, str) else [str(t) for t in text]
        parsed = OverridesParser.create().parse_overrides(tokens)
    except Exception:
        return None
    out: list[Change] = []
    for o in parsed:
        key = o.key_or_group
        if key in groups() or "/" in key or "@" in key or o.is_sweep_override():
            return None
        op = "~" if o.is_delete() else ("++" if o.is_force_add() else ("+" if o.is_add() else ""))
        out.append(Change(key, None if o.is_delete() else o.value(), op))
    return out or None


def _as_changes(overrides: Iterable[str] | Iterable[Change] | Mapping[str, Any]) -> list[Change]:
    if isinstance(overrides, Mapping):
        return [Change(k, v) for k, v in overrides.items()]
    items = list(overrides)
    if all(isinstance(o, Change) for o in items):
        return items
    parsed = parse([str(o) for o in items])
    if parsed is None:
        bad = [o for o in items if str(o).split("=", 1)[0].lstrip("+~") in groups()]
        raise ValueError(f"{' '.join(map(str, bad or items))}: a config group choice (or not an override) cannot be "
                         f"applied to a resolved config; compose it: python run.py {' '.join(map(str, items))}")
    return parsed


def _set_following(verl: dict[str, Any], key: str, value: Any, delete: bool, touched: set[str]) -> None:
    """Set (or delete) a key, and set the keys interpolated from it that still hold its old value (they followed it)."""
    old = get(verl, key, _MISSING)
    touched.add(key)
    if delete:
        head, _, leaf = key.rpartition(".")
        parent = lookup(verl, head) if head else verl
        if isinstance(parent, dict):
            parent.pop(leaf, None)
        return
    put(verl, key, copy.deepcopy(value))
    if old is not _MISSING:
        for f in moved_with(key, old, lambda k: get(verl, k, _MISSING), touched):
            put(verl, f, copy.deepcopy(value))


def already_has(verl: Mapping[str, Any], override: str) -> bool:
    """Whether the config already has this override's value (every verl key a short key sets)."""
    (parsed,) = parse([override]) or [Change("", op="~")]
    op, key, value = parsed.op, parsed.key, parsed.value
    keys = short_key_targets(key) if key in SHORT_KEYS else (key,)
    same = lambda cur: cur == value and isinstance(cur, (str, bool)) == isinstance(value, (str, bool))  # noqa: E731
    return op != "~" and bool(keys) and all(same(get(verl, k)) for k in keys)


def jobs_at_once(n_jobs: Any) -> int:
    """Jobs run at once for joblib's n_jobs (-1: one a CPU core, as joblib counts them)."""
    try:
        n = int(n_jobs)
    except (TypeError, ValueError):
        return 1
    return (os.cpu_count() or 1) if n < 0 else max(1, n)


def apply_overrides(verl: Mapping[str, Any], lab: Lab, overrides: Iterable[str] | Iterable[Change] | Mapping[str, Any]
                    ) -> tuple[dict[str, Any], Lab]:
    """Copies of (verl, lab) with the changes applied as composing them would (module docstring); inputs untouched.
    `overrides`: Changes, Hydra override strings, or a {key: value} mapping."""
    items = _as_changes(overrides)
    v, lb = thaw(verl), copy.deepcopy(lab)  # verl's config may be a Run's read-only one
    # keys the config sets on their own (set_apart) follow neither their short key nor a key they once read
    apart = {k for keys in lab.set_apart.values() for k in keys}
    touched: set[str] = set(apart)
    old_lengths = [get(v, k) for k in LENGTHS]
    for key, value, delete in ((c.key, c.value, c.op == "~") for c in items):
        if key in groups():
            raise ValueError(f"{key}={value} picks a config group option: compose it (python run.py {key}={value}) "
                             f"instead of applying it to a resolved config")
        if key == "hydra.launcher.n_jobs":  # hydra/launcher=side_by_side: jobs at once (launch.side_by_side_jobs)
            lb.side_by_side_jobs = 1 if delete else jobs_at_once(value)
        elif key.startswith("hydra."):
            continue  # Hydra's own settings (run dirs, ...): nothing the preflight reads
        elif key.startswith(("lab.", "preflight.")):  # a field of the typed view (~: back to "not known")
            *path, leaf = key.removeprefix("lab.").split(".")
            node = functools.reduce(getattr, path, lb)
            if not hasattr(node, leaf):
                raise ValueError(f"{key}: grpo-lab's config has no such key (grpo_lab/labconf.py)")
            setattr(node, leaf, None if delete else copy.deepcopy(value))
        elif key in SHORT_KEYS:
            for t in short_key_targets(key):
                if t not in apart:
                    _set_following(v, t, value, delete, touched)
        else:
            _set_following(v, key, value, delete, touched)
    new_lengths = [get(v, k) for k in LENGTHS]
    # conf/config.yaml: prompt + response (null while a length is no number: grpo_lab's lab_sum)
    derived = sum(old_lengths) if all(isinstance(x, int) for x in old_lengths) else None
    if MAX_MODEL_LEN not in touched and new_lengths != old_lengths \
            and all(isinstance(x, int) for x in new_lengths) and get(verl, MAX_MODEL_LEN) == derived:
        put(v, MAX_MODEL_LEN, sum(new_lengths))
    return v, lb
