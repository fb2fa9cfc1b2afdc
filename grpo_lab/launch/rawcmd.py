"""The raw verl command that a grpo-lab config amounts to: `python3 -m verl.trainer.main_ppo key=value ...`.

    python -m grpo_lab.launch.rawcmd experiment=smoke_tiny hardware=h200x1
    python -m grpo_lab.launch.rawcmd --list experiment=smoke     (one override a line)
    python -m grpo_lab.launch.rawcmd --help

The overrides are read as run.py reads them (grpo_lab/cli/overrides.py: the same checks, the environment's knobs added).

Composes grpo-lab's config and prints every value that differs from verl's default (verl's bare ppo_trainer resolved:
grpo_lab.verl_schema's schema().defaults; `+key=value` where verl has no such key). Useful to see what a preset
changes, to file a bug against verl without grpo-lab in the way, and as the baseline in benchmarks/gpu/ (the same job
through raw verl).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from grpo_lab import facts
from grpo_lab.cli.overrides import OverrideError, check, parse, quote, tree_if_needed
from grpo_lab.launch.prepare import split
from grpo_lab.verl_keys import flatten
from grpo_lab.verl_schema import schema

_MISSING = object()


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


def raw_overrides(overrides: list[str], conf_dir: str) -> list[str]:
    GlobalHydra.instance().clear()
    with tree_if_needed(overrides, conf_dir), initialize_config_dir(config_dir=conf_dir, version_base=None):
        ours_cfg = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(ours_cfg)
        ours, lab = split(ours_cfg)
    # emulation (grpo_lab/memory/emulate.py): raw verl gets the scaled utilizations and the torch cap run.py hands it
    from grpo_lab.memory.emulate import emulate

    ours = emulate(ours, lab, os.environ).verl
    base = schema().defaults  # verl's ppo_trainer resolved: what raw verl runs with given nothing
    out = []
    for key, value in flatten(ours):
        if key.endswith("_target_"):
            continue
        default, parent_ok = _lookup(base, key)
        if default is _MISSING:
            out.append(f"+{key}={quote(value)}" if parent_ok else f"++{key}={quote(value)}")
        elif default != value:
            out.append(f"{key}={quote(value)}")
    return out


USAGE = """usage: python -m grpo_lab.launch.rawcmd [--list] [OVERRIDE ...]

Prints the raw `python3 -m verl.trainer.main_ppo ...` command that gives verl the config `python run.py OVERRIDE ...`
gives it: every value that differs from verl's default. --list: one override a line. The overrides (and the
environment's knobs, MODEL_PATH=...) are read as run.py reads them.
"""


def main(argv: list[str], environ: dict[str, str] | None = None) -> int:
    if "--help" in argv or "-h" in argv:
        print(USAGE, end="")
        return 0
    conf_dir = str(facts.ROOT / "conf")
    from grpo_lab.memory.emulate import EmulationError

    # one argument a line, for `mapfile -t args < <(python -m grpo_lab.launch.rawcmd --list ...)`
    as_list = "--list" in argv
    try:
        cli = parse([a for a in argv if a != "--list"], os.environ if environ is None else environ, flags=False)
        check(cli, conf_dir)
        args = raw_overrides(cli.argv, conf_dir)
    except (OverrideError, EmulationError) as e:
        print(f"grpo-lab: error: {e}", file=sys.stderr)
        return 2
    if as_list:
        print("\n".join(args))
        return 0
    print("python3 -m verl.trainer.main_ppo \\\n  " + " \\\n  ".join(shlex.quote(a) for a in args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
