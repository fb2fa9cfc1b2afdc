"""Memory plan: what one GRPO step of verl 0.9.1 (FSDP actor + colocated vLLM) puts on each GPU and in host RAM.

Its inputs, where each part lives, and the model phase by phase: docs/memory_plan.md."""

from __future__ import annotations

from typing import Any

from grpo_lab.memory.calibration import accuracy_lines, calibration_of
from grpo_lab.memory.memplan_arch import Arch, Settings
from grpo_lab.memory.memplan_phases import (
    CARD_UNIT_BYTES,
    CUBLAS_WORKSPACE_GB,
    ENTROPY_BYTES,
    ENTROPY_EAGER_BYTES,
    GB,
    HOST_BASE_GB,
    HOST_PER_GPU_WORKER_GB,
    HOST_PER_VLLM_WORKER_GB,
    LOGITS_FORWARD_BYTES,
    LOGITS_UPDATE_BYTES,
    TIGHT_FRACTION,
    TRAINER_CUDA_CONTEXT_GB,
    VLLM_CUDA_CONTEXT_GB,
    VLLM_CUDAGRAPH_GB,
    Phases,
    actor_state,
    card_bytes,
    host_ram,
    kv_cache,
    optimizer_step_bytes,
    resident_between_phases,
    training_subphases,
    update_breakdown,
    update_peak_at,
    vllm_max_model_len,
)
from grpo_lab.memory.memplan_remedies import find_remedies, lora_changes
from grpo_lab.memory.memplan_verdicts import PHASES, assess, judge, verdict_of

# the plan's names that its users take from `from grpo_lab.memory import memplan` (preflight rules, fit, benchmarks,
# tests; the benchmark records every upper-case number); the rest from the memplan_* modules themselves
__all__ = [
    "Arch", "Settings",
    "GB", "CARD_UNIT_BYTES", "CUBLAS_WORKSPACE_GB", "ENTROPY_BYTES", "ENTROPY_EAGER_BYTES", "HOST_BASE_GB",
    "HOST_PER_GPU_WORKER_GB", "HOST_PER_VLLM_WORKER_GB", "LOGITS_FORWARD_BYTES", "LOGITS_UPDATE_BYTES",
    "TIGHT_FRACTION", "TRAINER_CUDA_CONTEXT_GB", "VLLM_CUDA_CONTEXT_GB", "VLLM_CUDAGRAPH_GB",
    "actor_state", "card_bytes", "host_ram", "kv_cache", "optimizer_step_bytes", "resident_between_phases",
    "training_subphases", "update_breakdown", "update_peak_at", "verdict_of", "vllm_max_model_len",
    "lora_changes", "assess", "memory_plan",
]


def memory_plan(arch: Arch, s: Settings, *, remedies: bool = True) -> dict[str, Any]:
    """The `memory` section of plan.json."""
    cal = calibration_of(arch, s)
    # what `make plan` and `make fit` print about the plan's accuracy in the training phase's regime
    accuracy = accuracy_lines(cal["training"]["regime"]) if (cal.get("training") or {}).get("regime") else []
    ph = Phases(arch, s)
    verdict = judge(ph, cal)
    for name in ("generation", "training", "weight_sync"):
        getattr(ph, name)["verdict"] = verdict[name]
    ph.host["verdict"] = verdict["host_ram"]
    plan: dict[str, Any] = {
        "card_gb": s.card_gb,
        "n_gpus": s.n_gpus,
        "fsdp_size": s.fsdp,
        "params": arch.params,
        "params_b": round(arch.params / 1e9, 3),
        "active_params": arch.active_params,
        "moe": ({"num_experts": arch.num_experts, "num_experts_per_tok": arch.num_experts_per_tok,
                 "sparse_layers": arch.sparse_layers, "active_params_b": round(arch.active_params / 1e9, 3)}
                if arch.is_moe else None),
        "trainable_params": actor_state(arch, s).trainable,
        "architecture_source": arch.source,
        "actor_state_gb_per_gpu": round(ph.actor_state_gb, 2),
        "actor_state_full_gb_per_gpu": ph.actor_state_full_gb,
        "phases": {"generation": ph.generation, "training": ph.training, "weight_sync": ph.weight_sync},
        "trainer_allocator": ph.trainer_allocator,
        "kv_cache": ph.kv,
        "host_ram_gb": ph.host["total_gb"],
        "host_ram": ph.host,
        "verdict": verdict,
        "calibration": cal,
        "accuracy": accuracy,
    }
    if remedies:
        plan["remedies"] = {p: find_remedies(arch, s, p) for p in PHASES if verdict[p] in ("tight", "oom")}
    return plan
