"""Where `ray.init()` connects, found the way Ray 2.60 finds it, without importing Ray.

    t = ray_target(address, environ, temp_dir=None, read_file=True)
    t.joins        # what ray.init connects to, in words ("RAY_ADDRESS=10.0.0.1:6379"), or None
    t.fails        # ray.init raises (address "auto", nothing found): why, in words; else ""
    t.looked_at    # what was looked at, in words (for messages)

Ray's lookup, step by step: docs/preflight.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RAY_ADDRESS = "RAY_ADDRESS"


@dataclass(frozen=True)
class RayTarget:
    joins: str | None  # the cluster ray.init connects to, named as the user set it; None: it starts one (or fails)
    fails: str  # ray.init raises: why ("" when it does not)
    looked_at: str  # the places looked at, in Ray's order, in words


def address_file(environ: Mapping[str, str], temp_dir: str | None = None) -> str:
    """Where `ray start` records this node's cluster, as ray.init reads it (ray/_common/utils.py)."""
    if temp_dir:
        return os.path.join(temp_dir, "ray_current_cluster")
    # RAY_TMPDIR, else TMPDIR (Ray on Linux), as Ray reads them: set at all, even empty
    base = next((environ[k] for k in ("RAY_TMPDIR", "TMPDIR") if k in environ), os.path.join(os.sep, "tmp"))
    return os.path.join(base, "ray", "ray_current_cluster")


def ray_target(address: Any, environ: Mapping[str, str], *, temp_dir: str | None = None,
               read_file: bool = True) -> RayTarget:
    """Where ray.init(address=address) connects on this machine (module docstring: Ray's order)."""
    addr = None if address in (None, "") else str(address)
    if addr is not None and addr != "auto":
        if addr == "local":
            return RayTarget(None, "", "ray_kwargs.ray_init.address=local (a new Ray of this machine)")
        return RayTarget(f"ray_kwargs.ray_init.address={addr}", "", f"ray_kwargs.ray_init.address={addr}")
    given = "ray_kwargs.ray_init.address=auto" if addr == "auto" else "ray_kwargs.ray_init.address is null"
    env = environ.get(RAY_ADDRESS)
    if env:
        if env == "local":
            return RayTarget(None, "", f"{given}, RAY_ADDRESS=local (a new Ray of this machine)")
        return RayTarget(f"RAY_ADDRESS={env}", "", f"{given}, RAY_ADDRESS={env}")
    looked = f"{given}, RAY_ADDRESS is not set"
    if read_file:
        path = address_file(environ, temp_dir)
        try:  # the address `ray start` recorded there (Ray strips it)
            with open(path, encoding="utf-8") as f:
                recorded = f.read().strip()
        except OSError:
            recorded = ""
        if recorded:
            return RayTarget(f"the cluster the latest `ray start` on this node recorded ({recorded}, in {path})", "",
                             f"{looked}, {path} names {recorded}")
        looked += f", no `ray start` has recorded a cluster on this node ({path} is absent)"
    elif addr == "auto":  # "auto" never starts a Ray: it joins what it finds where it runs, or raises there
        return RayTarget("ray_kwargs.ray_init.address=auto (the cluster ray.init finds where the job runs)", "",
                         f"{looked}, the `ray start` record of the machine that runs it not read here")
    if addr == "auto":
        return RayTarget(None, "ray.init(address='auto') raises ConnectionError: 'Could not find any running Ray "
                               "instance'", looked)
    return RayTarget(None, "", looked)
