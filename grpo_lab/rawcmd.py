"""The raw verl command that a grpo-lab config amounts to: `python3 -m verl.trainer.main_ppo key=value ...`.

    python -m grpo_lab.rawcmd experiment=smoke_tiny hardware=h200x1
    python -m grpo_lab.rawcmd --list experiment=smoke     (one override a line)

Composes grpo-lab's config and verl's bare ppo_trainer, and prints every value that differs from verl's default
(`+key=value` where verl has no such key). Useful to see what a preset changes, to file a bug against verl without
grpo-lab in the way, and as the baseline in benchmarks/gpu/ (the same job through raw verl).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any, Iterator

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from grpo_lab.config import split
from grpo_lab.verl_cache import tree_if_needed
from grpo_lab.verl_paths import verl_config_dir

_MISSING = object()


def _flatten(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, dict) and d:
        for k, v in d.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], d


def _lookup(d: dict, dotted: str) -> tuple[Any, bool]:
    """(value, whether every parent exists)."""
    cur: Any = d
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if not isinstance(cur, dict):
            return _MISSING, False
        if part not in cur:
            return _MISSING, i == len(parts) - 1
        cur = cur[part]
    return cur, True


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, str) and re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?|true|false|null|inf|nan", value, re.I):
        return f"'{value}'"  # a string that Hydra would read as a number or bool (Ray env vars must stay strings)
    return str(value)


def raw_overrides(overrides: list[str], conf_dir: str) -> list[str]:
    GlobalHydra.instance().clear()
    with tree_if_needed(overrides, conf_dir), initialize_config_dir(config_dir=conf_dir, version_base=None):
        ours_cfg = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(ours_cfg)
        ours, _ = split(ours_cfg)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        base, _ = split(compose("ppo_trainer"))
    out = []
    for key, value in _flatten(ours):
        if key.endswith("_target_"):
            continue
        default, parent_ok = _lookup(base, key)
        if default is _MISSING:
            out.append(f"+{key}={_fmt(value)}" if parent_ok else f"++{key}={_fmt(value)}")
        elif default != value:
            out.append(f"{key}={_fmt(value)}")
    return out


def main(argv: list[str]) -> int:
    import os

    conf_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
    as_list = "--list" in argv  # one argument a line, for `mapfile -t args < <(python -m grpo_lab.rawcmd --list ...)`
    args = raw_overrides([a for a in argv if a != "--list"], conf_dir)
    if as_list:
        print("\n".join(args))
        return 0
    print("python3 -m verl.trainer.main_ppo \\\n  " + " \\\n  ".join(shlex.quote(a) for a in args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
