"""verl's schema, read once per verl version: one home for what grpo-lab knows about the installed verl.

    from grpo_lab.verl_schema import schema
    schema().tree / .defaults / .fields(target) / .model_keys / .rollout_engines / .data_sources ...

api.py         the public API: schema() and VerlSchema (what each attribute holds)
verl_cache.py  the cache file per verl version, and the child process that builds it (`enabled()`/`off()`: whether
               Hydra gets ppo_trainer from it)
build.py       the child: imports verl and reads its objects (never its source text)
hydra_internals.py  Hydra's private APIs, all in one place
verl_paths.py  where the installed verl keeps its config folder, found without importing verl

Nothing here imports grpo_lab's cli stage (the cli imports this).
"""

from grpo_lab.verl_schema.api import VerlSchema, cache_clear, schema

__all__ = ["VerlSchema", "cache_clear", "schema"]
