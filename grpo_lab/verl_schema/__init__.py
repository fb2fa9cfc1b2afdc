"""verl's schema, read once per verl version: one home for what grpo-lab knows about the installed verl.

    from grpo_lab.verl_schema import schema
    schema().tree / .defaults / .fields(target) / .model_keys / .rollout_engines / .data_sources ...

Its modules: docs/verl_schema.md."""

from grpo_lab.verl_schema.api import VerlSchema, cache_clear, schema

__all__ = ["VerlSchema", "cache_clear", "schema"]
