"""Memory plan: what one GRPO step of verl 0.9.1 (FSDP actor + colocated vLLM) puts on each GPU and in host RAM.

Pure functions on plain data: no torch, no verl, no I/O. `grpo_lab.checks.preflight` feeds it the composed config;
`benchmarks/gpu/memplan_bench.py` compares it with torch's allocator on a real GPU.

Where it lives: this module assembles plan.json's `memory` (`memory_plan`) and is where the rest of grpo-lab and the
benchmarks import the plan's names from; the model's shapes and the run's knobs are grpo_lab/memory/memplan_arch.py,
the bytes of each phase and its constants grpo_lab/memory/memplan_phases.py, each phase's verdict with its margin
grpo_lab/memory/memplan_verdicts.py, and what would make a phase fit grpo_lab/memory/memplan_remedies.py.

The model phase by phase (what verl does, what the plan assumes), its units and verdicts: docs/memory_plan.md.
"""

from __future__ import annotations

from typing import Any

from grpo_lab.memory.memplan_arch import LINEAR_NAMES, Arch, Settings
from grpo_lab.memory.memplan_phases import (
    CARD_UNIT_BYTES, CUBLAS_WORKSPACE_GB, ENTROPY_BYTES, ENTROPY_EAGER_BYTES, GB, HOST_BASE_GB, HOST_PER_GPU_WORKER_GB,
    HOST_PER_VLLM_WORKER_GB, LOGITS_FORWARD_BYTES, LOGITS_UPDATE_BYTES, MiB, TIGHT_FRACTION, TRAINER_CUDA_CONTEXT_GB,
    VLLM_CUDA_CONTEXT_GB, VLLM_CUDAGRAPH_GB, ActorState, activations, actor_state, actor_state_gb_per_gpu,
    attention_extra, card_bytes, engine_budget, fsdp_gathered, generation_phase, host_ram, kv_cache, logits_peak,
    optimizer_step_bytes, param_bytes, reference_on_card_at_start, resident_at_generation, resident_between_phases,
    round_gb, sync_copies, sync_trainer_side, trainer_allocator, training_phase, training_subphases, update_breakdown,
    update_peak_at, update_peaks, verdict_of, vllm_activation, vllm_batched_tokens, vllm_max_model_len, vllm_weights,
    weight_sync_phase)
from grpo_lab.memory.memplan_remedies import LORA_OVERRIDES, OFFLOAD_OVERRIDES, candidates, find_remedies
from grpo_lab.memory.memplan_verdicts import VERDICT_ORDER, calibration_of, generation_verdict, phase_result, worst

# the plan's names, for `from grpo_lab.memory import memplan` users (preflight rules, fit, benchmarks, tests)
__all__ = [
    "Arch", "Settings", "LINEAR_NAMES",
    "GB", "MiB", "CARD_UNIT_BYTES", "CUBLAS_WORKSPACE_GB", "ENTROPY_BYTES", "ENTROPY_EAGER_BYTES", "HOST_BASE_GB",
    "HOST_PER_GPU_WORKER_GB", "HOST_PER_VLLM_WORKER_GB", "LOGITS_FORWARD_BYTES", "LOGITS_UPDATE_BYTES",
    "TIGHT_FRACTION", "TRAINER_CUDA_CONTEXT_GB", "VLLM_CUDA_CONTEXT_GB", "VLLM_CUDAGRAPH_GB",
    "ActorState", "activations", "actor_state", "actor_state_gb_per_gpu", "attention_extra", "card_bytes",
    "engine_budget", "fsdp_gathered", "generation_phase", "host_ram", "kv_cache", "logits_peak", "optimizer_step_bytes",
    "param_bytes", "reference_on_card_at_start", "resident_at_generation", "resident_between_phases", "round_gb",
    "sync_copies", "sync_trainer_side", "trainer_allocator", "training_phase", "training_subphases",
    "update_breakdown", "update_peak_at", "update_peaks", "verdict_of", "vllm_activation", "vllm_batched_tokens",
    "vllm_max_model_len", "vllm_weights", "weight_sync_phase",
    "VERDICT_ORDER", "calibration_of", "generation_verdict", "phase_result", "worst",
    "LORA_OVERRIDES", "OFFLOAD_OVERRIDES", "candidates", "find_remedies",
    "memory_plan",
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
