"""Memory plan: what one GRPO step of verl 0.9.1 (FSDP actor + colocated vLLM) puts on each GPU and in host RAM.

Its inputs, where each part lives, and the model phase by phase: docs/memory_plan.md."""

from __future__ import annotations

from typing import Any

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
    activations,
    actor_state,
    actor_state_gb_per_gpu,
    card_bytes,
    generation_phase,
    host_ram,
    kv_cache,
    optimizer_step_bytes,
    resident_between_phases,
    round_gb,
    trainer_allocator,
    training_phase,
    training_subphases,
    update_breakdown,
    update_peak_at,
    verdict_of,
    vllm_activation,
    vllm_max_model_len,
    vllm_weights,
    weight_sync_phase,
)
from grpo_lab.memory.memplan_remedies import LORA_OVERRIDES, OFFLOAD_OVERRIDES, find_remedies
from grpo_lab.memory.memplan_verdicts import calibration_of, generation_verdict, phase_result, worst

# the plan's names that its users take from `from grpo_lab.memory import memplan` (preflight rules, fit, benchmarks,
# tests; the benchmark records every upper-case number); the rest from the memplan_* modules themselves
__all__ = [
    "Arch", "Settings",
    "GB", "CARD_UNIT_BYTES", "CUBLAS_WORKSPACE_GB", "ENTROPY_BYTES", "ENTROPY_EAGER_BYTES", "HOST_BASE_GB",
    "HOST_PER_GPU_WORKER_GB", "HOST_PER_VLLM_WORKER_GB", "LOGITS_FORWARD_BYTES", "LOGITS_UPDATE_BYTES",
    "TIGHT_FRACTION", "TRAINER_CUDA_CONTEXT_GB", "VLLM_CUDA_CONTEXT_GB", "VLLM_CUDAGRAPH_GB",
    "activations", "actor_state", "actor_state_gb_per_gpu", "card_bytes", "host_ram", "kv_cache",
    "optimizer_step_bytes", "resident_between_phases", "training_phase", "training_subphases", "update_breakdown",
    "update_peak_at", "verdict_of", "vllm_activation", "vllm_max_model_len", "vllm_weights",
    "LORA_OVERRIDES", "OFFLOAD_OVERRIDES", "phase_result", "memory_plan",
]


def memory_plan(arch: Arch, s: Settings, *, remedies: bool = True) -> dict[str, Any]:
    """The `memory` section of plan.json."""
    card = s.card_gb
    cal = calibration_of(arch, s)
    gen = generation_phase(arch, s)
    kv = kv_cache(arch, s)
    gen["verdict"] = generation_verdict(arch, s, cal["generation"]["margin"])
    train = training_phase(arch, s)
    train["verdict"] = verdict_of(train["peak_gb_per_gpu"], card, cal["training"]["margin"])
    sync = weight_sync_phase(arch, s)
    sync["verdict"] = verdict_of(sync["peak_gb_per_gpu"], card, cal["weight_sync"]["margin"])
    host = host_ram(arch, s)
    overall = worst(gen["verdict"], train["verdict"], sync["verdict"], host["verdict"])
    n_lora = arch.lora_params(s.lora_rank, s.lora_targets)
    plan: dict[str, Any] = {
        "card_gb": card,
        "n_gpus": s.n_gpus,
        "fsdp_size": s.fsdp,
        "params": arch.params(),
        "params_b": round(arch.params() / 1e9, 3),
        "active_params": arch.active_params(),
        "moe": ({"num_experts": arch.num_experts, "num_experts_per_tok": arch.num_experts_per_tok,
                 "sparse_layers": arch.sparse_layers, "active_params_b": round(arch.active_params() / 1e9, 3)}
                if arch.is_moe else None),
        "trainable_params": n_lora if s.lora_rank > 0 else arch.params(),
        "architecture_source": arch.source,
        "actor_state_gb_per_gpu": round(actor_state_gb_per_gpu(arch, s), 2),
        "actor_state_full_gb_per_gpu": round_gb(actor_state(arch, s).total),
        "phases": {"generation": gen, "training": train, "weight_sync": sync},
        "trainer_allocator": trainer_allocator(arch, s),
        "kv_cache": kv,
        "host_ram_gb": host["total_gb"],
        "host_ram": host,
        "verdict": {"generation": gen["verdict"], "training": train["verdict"], "weight_sync": sync["verdict"],
                    "host_ram": host["verdict"], "overall": overall},
        "calibration": cal,
    }
    if remedies:
        plan["remedies"] = {ph: find_remedies(arch, s, ph)
                            for ph in ("generation", "training", "weight_sync", "host_ram")
                            if plan["verdict"][ph] in ("tight", "oom")}
    return plan
