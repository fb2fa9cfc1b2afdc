"""Where the installed verl keeps its Hydra configs, found without importing verl."""

from __future__ import annotations

import functools
import importlib.util
import os


@functools.cache  # once per process: the rules ask ~300 times per command
def verl_config_dir() -> str | None:
    """Path of verl/trainer/config of the installed verl, or None when verl is not installed."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "trainer", "config")
        if os.path.isfile(os.path.join(path, "ppo_trainer.yaml")):
            return path
    return None
