"""Jobs side by side get vLLM's KV cache pinned to the plan's size, without typing it.

vLLM sizes its KV cache from the card's free memory while it profiles; a job starting beside it at that moment takes
from it (on the GPU test machine one of three got 1.09 GiB instead of ~26, another -17.95 GiB and refused to start;
benchmarks/gpu/README.md). Under hydra/launcher=side_by_side (more than one job at once) each job's vLLM therefore
gets `engine_kwargs.vllm.kv_cache_memory_bytes` = the memory plan's KV cache for that job (vLLM then sets the cache to
that size instead of measuring). A value the user set (`+actor_rollout_ref.rollout.engine_kwargs.vllm.
kv_cache_memory_bytes=N`, or in a config file) wins. The rule side_by_side_jobs says which one the job runs with.

    verl, pin = pin_side_by_side(planned, verl, lab, environ)  # launch.py, before verl_config.yaml is written
    mark_changed(plan["changed_defaults"], pin)          # plan.json: what set the key
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from grpo_lab.labconf import Lab
from grpo_lab.verl_keys import get, put

KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
OVERRIDE = "+" + KEY
SET_BY = "hydra/launcher=side_by_side: the memory plan's KV cache (grpo_lab/checks/kv_pin.py)"


def planned_kv_bytes(verl: Mapping[str, Any], lab: Lab, environ: Mapping[str, str]) -> int | None:
    """The memory plan's vLLM KV cache per GPU in bytes, or None (no plan, not vLLM, no room for a cache)."""
    from grpo_lab.checks.rules import Ctx

    plan = Ctx.of(verl, lab, launching=False, environ=environ, quick=True).plan or {}
    kv = plan.get("kv_cache") or {}
    gb = float(kv.get("kv_cache_gb") or 0)
    if kv.get("engine") != "vllm" or gb <= 0 or int(kv.get("tokens") or 0) <= 0:
        return None
    return int(gb * 1e9)


def pin_side_by_side(planned: dict[str, Any], verl: dict[str, Any], lab: Lab,
                     environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Under side by side (lab.side_by_side_jobs > 1): (the config verl gets, the pin). The user's own pin is
    kept; else the plan's KV cache goes into verl's config only (a copy when it is the planned one): the preflight
    plans the config as the user wrote it, so a fix that changes vLLM's share is re-checked with the cache it
    sizes. The pin is recorded in lab.side_by_side_kv_pin for the rule side_by_side_jobs."""
    if lab.side_by_side_jobs <= 1:
        return verl, None
    own = get(planned, KEY)
    if own is not None:
        pin = {"bytes": own, "by": "user"}
    else:
        n = planned_kv_bytes(planned, lab, environ)
        if n is None:
            return verl, None
        if verl is planned:
            verl = copy.deepcopy(planned)
        put(verl, KEY, n)
        pin = {"bytes": n, "by": "launcher"}
    lab.side_by_side_kv_pin = pin
    return verl, pin


def mark_changed(changed: list[dict[str, Any]], pin: dict[str, Any] | None) -> None:
    """plan.json's changed_defaults: the launcher's pin says what set it."""
    if pin and pin["by"] == "launcher":
        for item in changed:
            if item["key"] == KEY:
                item["set_by"] = SET_BY
