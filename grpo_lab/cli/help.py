"""`python run.py --help`: grpo-lab's own page, Hydra's help template (conf/hydra/help/grpo_lab.yaml). Its lists come
from here through the `${lab_help:...}` resolver (grpo_lab/__init__.py), so they follow conf/ and the knob table
(docs/cli.md)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.cli.knobs import KNOBS

THIS_PAGE = "hydra/help"  # the group of this page itself: not an option to pick
WIDTH = 118


def our_groups(conf: Path = facts.CONF) -> dict[str, list[str]]:
    """{group: options} for every folder under conf/ that holds option files (`hydra/launcher` for the nested)."""
    out = {}
    for folder in sorted(p for p in conf.rglob("*") if p.is_dir()):
        group = folder.relative_to(conf).as_posix()
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        if options and group != THIS_PAGE:
            out[group] = options
    return out


def _groups(choices: Mapping[str, Any] | None) -> str:
    choices = choices or {}
    width = max(len(g) for g in our_groups()) + 1
    lines = []
    for group, options in our_groups().items():
        chosen = choices.get(group)
        listed = ", ".join(f"*{o}" if o == chosen else o for o in options)
        now = "" if chosen in options else " (none chosen)" if chosen is None else f" (now: Hydra's {chosen})"
        lines += textwrap.wrap(listed + now, WIDTH, initial_indent=f"  {group + ':':<{width}} ",
                               subsequent_indent=" " * (width + 3), break_on_hyphens=False)
    return "\n".join(lines)


def _short_keys() -> str:
    width = max(len(k.key) for k in KNOBS)
    return "\n".join(f"  {k.key:<{width}}  {k.verl_key}" for k in KNOBS)


def section(part: str, choices: Any = None) -> str:
    """One generated part of the help page."""
    parts = {"groups": lambda: _groups(choices), "short_keys": _short_keys}
    if part not in parts:
        raise ValueError(f"lab_help: no part {part!r} (groups, short_keys)")
    return parts[part]()
