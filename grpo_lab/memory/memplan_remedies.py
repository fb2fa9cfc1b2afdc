"""What would make a phase fit: the remedies plan.json lists under `remedies` for a phase that is tight or out of
memory, each with the phase's peak and verdict after it, and a combination of them when no single one ends an `oom`.

Their order: docs/memory_plan.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from grpo_lab.cli.apply import Change, text
from grpo_lab.memory import calibration
from grpo_lab.memory.memplan_arch import Arch, Settings
from grpo_lab.memory.memplan_phases import Phases
from grpo_lab.memory.memplan_verdicts import VERDICT_ORDER, verdict
from grpo_lab.memory.settings import settings_after
from grpo_lab.verl_keys import A

# verl's LoRA example (and conf/model/qwen3_8b_lora.yaml): rank 64 on all linear layers, safetensors loading for vLLM;
# for models above 6B also the frozen base and the adapters' Adam state to RAM; FSDP2 where the actor is FSDP1 (with
# FSDP1 and peft >= 0.21 verl 0.9.1 sends vLLM an empty adapter: rule lora_fsdp1_adapter)
LORA = {A + "model.lora_rank": 64, A + "model.lora_alpha": 32, A + "rollout.load_format": "safetensors"}
OFFLOAD = {A + "actor.fsdp_config.param_offload": True, A + "actor.fsdp_config.optimizer_offload": True}
FSDP2 = {A + "actor.strategy": "fsdp2"}
UTILS = tuple(round(k * 0.05, 2) for k in range(19, 1, -1))  # the gpu_memory_utilization values tried, highest first


def lora_changes(arch: Arch, s: Settings) -> list[Change]:
    """verl's LoRA example as changes, with offload for a model above 6B and FSDP2 for an FSDP1 actor."""
    return [Change(k, v) for k, v in (LORA | (OFFLOAD if arch.params > 6e9 else {})
                                      | (FSDP2 if s.strategy == "fsdp" else {})).items()]


def phase_result(arch: Arch, s: Settings, phase: str) -> tuple[float, str]:
    """(peak GB, verdict) of one phase ("generation", "training", "weight_sync", "host_ram"), planning only it."""
    ph = Phases(arch, s)
    cal = {phase: calibration.phase_calibration(calibration.regime_of(arch, s), phase)} if phase != "host_ram" else {}
    return ph.peak_gb(phase), verdict(ph, phase, cal)


def _best_util(arch: Arch, s: Settings) -> float | None:
    """The highest gpu_memory_utilization (0.05 steps) whose generation phase fits, else the lowest that can start
    (vLLM gets a KV cache for one max_model_len sequence): among the tight ones, the most headroom."""
    fits, tight = [], []
    for u in UTILS:
        v = phase_result(arch, replace(s, gpu_memory_utilization=u), "generation")[1]
        (fits if v == "fits" else tight if v == "tight" else []).append(u)
    return max(fits) if fits else min(tight, default=None)


def halvings(value: int, floor: int) -> list[int]:
    """`value` halved again and again, never below `floor`, until it reaches it (none when it is there already)."""
    out = []
    while value > floor:
        value = max(floor, value // 2)
        out.append(value)
    return out


def _best_token_budget(arch: Arch, s: Settings) -> int | None:
    """The largest actor token budget (halving from the current, not below one sequence) whose training phase fits;
    else one sequence."""
    budgets = halvings(s.ppo_max_token_len_per_gpu, s.seq_len)
    fits = (t for t in budgets if phase_result(arch, settings_after(s, budget_changes(s, t)), "training")[1] == "fits")
    return next(fits, budgets[-1] if budgets else None)


def budget_changes(s: Settings, t: int) -> list[Change]:
    """The actor's token budget `t` (first), the log-prob passes' at most twice it (never below one sequence)."""
    passes = (("rollout.", s.log_prob_max_token_len_per_gpu), ("ref.", s.ref_log_prob_max_token_len_per_gpu))
    return [Change("ppo_max_token_len_per_gpu", t), *(Change(A + pre + "log_prob_max_token_len_per_gpu",
                                                             max(s.seq_len, min(now, 2 * t))) for pre, now in passes)]


def candidates(arch: Arch, s: Settings) -> list[tuple[list[Change], Settings]]:
    """(changes, settings after them) for each remedy that applies to this configuration, in order."""
    out: list[list[Change]] = []
    seq = s.seq_len
    if not s.max_model_len and (arch.max_position_embeddings or 0) > seq:
        out.append([Change(A + "rollout.max_model_len", seq)])
    if s.use_dynamic_bsz:
        t = _best_token_budget(arch, s)
        if t is not None:
            out.append(budget_changes(s, t))
    elif (s.ppo_micro_batch_size_per_gpu or 1) > 1:
        out.append([Change("ppo_micro_batch_size_per_gpu", max(1, (s.ppo_micro_batch_size_per_gpu or 1) // 2))])
    u = _best_util(arch, s)
    if u is not None and abs(u - s.gpu_memory_utilization) > 1e-6:
        out.append([Change("rollout_gpu_mem_util", u)])
    if not s.optimizer_offload:
        out.append([Change(A + "actor.fsdp_config.optimizer_offload", True)])
    if s.lora_rank == 0:
        out.append(lora_changes(arch, s))
    tp2 = s.tp * 2
    if s.n_gpus % tp2 == 0 and arch.num_attention_heads % tp2 == 0:
        out.append([Change("rollout_tp", tp2)])
    if not s.param_offload:
        out.append([Change(A + "actor.fsdp_config.param_offload", True)])
    if s.bucket_mb > 512:
        bucket = max(512, s.bucket_mb // 4)
        out.append([Change(A + "rollout.checkpoint_engine.update_weights_bucket_megabytes", bucket)])
    return [(changes, settings_after(s, changes)) for changes in out]


def _improves(before: tuple[float, str], after: tuple[float, str]) -> bool:
    return VERDICT_ORDER[after[1]] < VERDICT_ORDER[before[1]] or (after[1] == before[1] and after[0] < before[0] - 0.05)


_FREE = A + "rollout.max_model_len"  # costs nothing (GRPO never generates past prompt + response)


def find_remedies(arch: Arch, s: Settings, phase: str) -> list[dict[str, Any]]:
    """Remedies that improve this phase (better verdict, or a lower peak), each with the peak and verdict after it;
    when no single one ends an `oom`, a last entry (combined: true) applies them in order until one does."""
    before = phase_result(arch, s, phase)
    out = []
    for changes, s2 in candidates(arch, s):
        after = phase_result(arch, s2, phase)
        if _improves(before, after):
            out.append({"override": text(changes), "peak_gb_per_gpu": after[0], "verdict": after[1]})
    if before[1] == "oom" and not any(r["verdict"] != "oom" for r in out):
        combo: list[list[Change]] = []
        cur, cur_s = before, s
        for _ in range(8):
            step = next(((o, s2) for o, s2 in candidates(arch, cur_s)
                         if o[0].key not in {c[0].key for c in combo}
                         and (o[0].key == _FREE or _improves(cur, phase_result(arch, s2, phase)))),
                        None)
            if step is None:
                break
            combo.append(step[0])
            cur_s = step[1]
            cur = phase_result(arch, cur_s, phase)
            if cur[1] != "oom":
                break
        if len(combo) > 1:
            out.append({"override": " ".join(map(text, combo)), "peak_gb_per_gpu": cur[0], "verdict": cur[1],
                        "combined": True})
    return out
