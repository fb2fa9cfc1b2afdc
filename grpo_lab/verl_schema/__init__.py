"""verl's schema, read once per verl version: one home for what grpo-lab knows about the installed verl; its modules
and `schema()`'s attributes: docs/verl_schema.md."""

from grpo_lab.verl_schema.api import schema

__all__ = ["schema"]
