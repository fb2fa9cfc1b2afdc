"""A run's folders and name: hydra.run.dir's resolver (one folder per run) and the safe folder name a run name must
be. (Resolving the composed config and splitting off grpo-lab's own keys: grpo_lab/launch/prepare.py.)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def safe_name(name: str) -> str:
    """`name` as a safe folder name: letters, digits, '.', '_' and '-' (a run of other characters: one '_', none at
    the ends), neither starting nor ending with '.' or '-'."""
    inner = re.sub(r"^[^A-Za-z0-9._-]+|[^A-Za-z0-9._-]+$", "", name)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", inner).strip(".-") or "run"


def unsafe_name(key: str, name: Any, fix_key: str) -> str:
    """Why a run name (experiment_name: it names the run's folders) is refused, with the override that fixes it;
    "" when it is a safe folder name."""
    name = str(name)
    if name == safe_name(name):
        return ""
    odd = sorted(set(re.sub(r"[A-Za-z0-9._-]", "", name)))
    what = (f"its {', '.join(map(repr, odd))} cannot be part of a folder name (a '/' nests the folders, a space splits "
            f"`make report RUN=<folder>`)" if odd else "a folder name cannot start or end with '.' or '-'")
    return (f"{key}={name!r} names the run's folders (outputs/runs/<time>_<name>, "
            f"outputs/checkpoints/<project>/<name>), and {what}. Write {fix_key}={safe_name(name)} instead")


def use_run_dirs(create: bool = True) -> None:
    """Register `lab_unique_dir`, hydra.run.dir's resolver (create=False: Hydra only prints; docs/cli.md)."""
    OmegaConf.register_new_resolver("lab_unique_dir", lambda path: unique_dir(path, create=create), use_cache=True,
                                    replace=True)


def unique_dir(path: str, create: bool = True) -> str:
    """`path`, created now; `path_2`, `path_3`, ... when it exists (create=False: the name, nothing made)."""
    if create and os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    for n in itertools.count(1):
        candidate = f"{path}_{n}" if n > 1 else path
        if not create and not os.path.exists(candidate):
            return candidate
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(candidate)
                return candidate


def unwritable_run_dir(cli: Any) -> str:
    """Why the job's folder (hydra.run.dir, or hydra.sweep.dir with -m; default under outputs/) cannot be made, with
    the fix; "" when its nearest existing folder is writable (or the folder is an interpolation Hydra resolves)."""
    key = "hydra.sweep.dir" if getattr(cli.flags, "multirun", False) else "hydra.run.dir"
    given = [o.value() for o in cli.overrides if o.key_or_group == key and not o.is_delete()]
    where = str(given[-1]) if given else "outputs/"
    if where.startswith("${"):
        return ""
    p = Path(os.path.abspath(where.split("${")[0] or "."))
    while not p.exists():
        p = p.parent
    if p.is_dir() and os.access(p, os.W_OK | os.X_OK):
        return ""
    import shlex

    what = "is not a folder" if not p.is_dir() else "is a folder you cannot write"
    kind = "sweep" if "sweep" in key else "run"
    new = f"{key}=/tmp/grpo-lab/{kind} lab.checkpoint_root=/tmp/grpo-lab/checkpoints"
    return (f"{p} {what}, and the {kind}'s folder goes under it ({where if given else f'outputs/{kind}s/'}); make it a "
            f"writable folder, or write the run elsewhere: python run.py {shlex.join([*cli.args, *new.split()])}")
