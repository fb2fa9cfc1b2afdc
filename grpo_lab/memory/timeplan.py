"""Time plan: how long a GRPO step of verl 0.9.1 takes per phase, the first step, start-up and the whole run.

Each phase is a sum of terms over what drives it (tokens, decode steps, micro-batches, FLOPs, bytes moved): the
physics at assumed shares of the card's peak, plus fixed costs per count fitted to the recorded solo runs
(benchmarks/calibrate_timeplan.py writes TABLE); other cards are scaled by their published bf16 FLOP/s and memory
bandwidth. The model, its terms and its accuracy: docs/time_plan.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from grpo_lab import facts
from grpo_lab.memory.memplan_arch import Arch, Settings
from grpo_lab.memory.memplan_phases import FUSED_CHUNK, answer_rounds, param_bytes

TABLE = facts.ROOT / "benchmarks" / "gpu" / "timeplan_calibration.json"
TABLE_MD = "benchmarks/gpu/timeplan_calibration.md"
STATED = 0.25  # the goal: every recorded solo run's steady step within 25% (issue 27)
# the card the fixed costs were measured on (NVIDIA H200 datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s)
MEASURED = {"name": "H200", "bf16_tflops": 989.0, "memory_gb_s": 4800.0}
MFU = 0.35       # share of peak bf16 FLOP/s a pass's matrix products reach (assumed: docs/time_plan.md)
BW_SHARE = 0.7   # share of the memory bandwidth weight and optimizer-state reads reach (assumed)
DISK_GB_S = 2.0  # model loading at start-up, three times (actor, reference, vLLM) (assumed)
PCIE_GB_S = {"pcie3": 12.0, "pcie4": 25.0, "pcie5": 50.0}  # host<->card per x16 link, pinned memory
PCIE_DEFAULT = ("pcie4", 25.0)
ALLREDUCE_S = {True: 10e-6, False: 50e-6}  # one small all-reduce over NVLink / PCIe (vLLM's TP, per layer) (assumed)
NVLINK_GB_S = 300.0  # card to card over NVLink (A100: 600 GB/s both ways) (assumed)
# seconds per count for terms no recorded run has measured yet (said as "not measured" where they count)
UNMEASURED = {"fused_chunks": 0.002, "fused_chunks_flash_attn": 0.002}
NOT_MEASURED = {k: f"verl's fused log-prob (use_fused_kernels){' with flash-attn' if 'flash' in k else ''}: "
                   f"{v * 1e3:g} ms per chunk of {FUSED_CHUNK} tokens assumed" for k, v in UNMEASURED.items()}
# fused_chunks replaces the per-token loop (no flash-attn): its seconds come from the training passes measured alone
# (calibrate_timeplan.py, fused_from_passes), said so until a recorded full step checks them (full_steps_with);
# with flash-attn there is no loop to compare it with
PASS_LEVEL = {"fused_chunks": "verl's fused log-prob (use_fused_kernels): its saving measured on the training passes "
                              "alone (benchmarks/gpu/pass_bench.py), not yet in a full step"}
PHASES = ("generation", "old_log_prob", "reference", "update", "weight_sync", "other")
TIMERS = {"generation": "gen", "old_log_prob": "old_log_prob", "reference": "ref", "update": "update_actor",
          "weight_sync": "update_weights"}  # verl's timing_s/* in metrics.jsonl


def pcie_gb_s(hw: Any) -> tuple[float, str]:
    """Host<->card GB/s of the typed lab.hardware: its pcie_gb_s, else assumed from its interconnect."""
    link = str(hw.interconnect or "")
    if hw.pcie_gb_s:
        return float(hw.pcie_gb_s), f"lab.hardware.pcie_gb_s={hw.pcie_gb_s:g}"
    if link in PCIE_GB_S:
        return PCIE_GB_S[link], (f"assumed for {link.upper()} x16 with pinned memory; set lab.hardware.pcie_gb_s "
                                 f"to yours")
    return PCIE_DEFAULT[1], "assumed (PCIe 4.0 x16, pinned memory); set lab.hardware.pcie_gb_s to yours"


@dataclass(frozen=True)
class Card:
    name: str
    bf16_tflops: float
    memory_gb_s: float
    pcie_gb_s: float
    link_gb_s: float  # card to card: NVLink, else the host's PCIe
    allreduce_s: float  # one small all-reduce between the cards
    scaled: str = ""  # how the prediction was carried from the measured card ("" on it)

    @classmethod
    def of(cls, hw: Any) -> Card:
        """From the typed lab.hardware (grpo_lab/labconf.py); a card without speeds is planned at the H200's."""
        name, pcie = str(hw.gpu_name or hw.name or "?"), pcie_gb_s(hw)[0]
        link, ar = (NVLINK_GB_S if hw.nvlink else pcie), ALLREDUCE_S[bool(hw.nvlink)]
        flops, bw = hw.bf16_tflops, hw.memory_gb_s
        if not flops or not bw:
            flops, bw = MEASURED["bf16_tflops"], MEASURED["memory_gb_s"]
            scaled = ("" if "H200" in name else
                      "card speed unknown (lab.hardware.bf16_tflops, memory_gb_s): planned as an H200")
        elif abs(flops - MEASURED["bf16_tflops"]) < 1 and abs(bw - MEASURED["memory_gb_s"]) < 1:
            scaled = ""
        elif runs := sum(n for card, n in recorded_cards().items() if card in name):
            scaled = (f"the {name}'s published bf16 FLOP/s ({flops:g}) and memory bandwidth ({bw:g} GB/s), fixed "
                      f"costs fitted with {runs} recorded solo run(s) on it ({TABLE_MD})")
        else:
            scaled = (f"scaled from the H200 by published bf16 FLOP/s ({flops:g} vs 989 TFLOP/s) and memory bandwidth "
                      f"({bw:g} vs 4800 GB/s): not measured")
        return cls(name, float(flops), float(bw), pcie, link, ar, scaled)


@dataclass(frozen=True)
class Work:
    """What one step does on one GPU: trajectories and their mean lengths (planned, or a run's measured)."""

    trajectories: float  # per GPU per step
    prompt: float        # mean prompt tokens
    response: float      # mean response tokens
    decode_steps: float  # the longest answer: generation's sequential steps

    @property
    def tokens(self) -> float:
        return self.trajectories * (self.prompt + self.response)


def per_token_loop(s: Settings) -> bool:
    """verl 0.9.1 takes log-probs in a Python loop over the tokens (logprobs_from_logits_v2) unless flash-attn's
    cross-entropy is there (attn_implementation=flash_attention_2 is taken as its sign) or use_fused_kernels."""
    return not s.use_fused_kernels and s.attn_implementation != "flash_attention_2"


def packed_attention_tflop(arch: Arch, s: Settings, tokens: float, budget: int) -> float:
    """TFLOP of the attention a pass spends across answers: packed micro-batches without flash-attn attend over the
    whole micro-batch under a block-diagonal mask (4 x T^2 x heads x head_dim per layer, forward), padded ones and
    flash-attn's varlen kernel only within each answer (benchmarks/gpu/results/2026-12-06-h100-padded)."""
    if not s.packed_attention:
        return 0.0
    m = max(1, math.ceil(tokens / max(1, budget)))
    return m * 4.0 * (tokens / m) ** 2 * arch.num_attention_heads * arch.head_dim * arch.num_hidden_layers / 1e12


def generation_waves(s: Settings, w: Work, kv: Mapping[str, Any]) -> int:
    """How many rounds of answers vLLM's KV cache (the memory plan's `kv`) holds a step's in, at the step's own
    lengths: vLLM takes cache blocks as a sequence grows, so answers shorter than max_response_length share the cache
    among more sequences."""
    per_replica = math.ceil(s.train_batch_size * s.rollout_n / max(1, kv["replicas"]))
    _, rounds = answer_rounds(per_replica, kv["tokens"], max(1.0, w.prompt + w.response), s.max_num_seqs)
    return rounds or 1


def updates_per_step(s: Settings) -> int:
    mini = s.ppo_mini_batch_size or s.train_batch_size
    return max(1, s.train_batch_size // max(1, mini)) * max(1, s.ppo_epochs)


def features(arch: Arch, s: Settings, w: Work, card: Card, kv: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per phase: the counts the fit weighs ("count") and the physics in seconds on `card` ("physics_s"); `kv`: the
    memory plan's KV cache for these settings."""
    flop_s = 1.0 / (card.bf16_tflops * 1e12 * MFU)
    byte_s = 1.0 / (card.memory_gb_s * 1e9 * BW_SHARE)
    pcie_s = 1.0 / (card.pcie_gb_s * 1e9)
    t, n = w.tokens, max(1, s.n_gpus)
    loop = t if per_token_loop(s) else 0.0
    fused = math.ceil(t / FUSED_CHUNK) if s.use_fused_kernels else 0.0
    fused_key = "fused_chunks_flash_attn" if s.attn_implementation == "flash_attention_2" else "fused_chunks"
    waves = generation_waves(s, w, kv)
    eager = 1.0 if s.enforce_eager else 0.0
    layer_steps = w.decode_steps * waves * arch.num_hidden_layers
    gen_s = layer_steps / arch.num_hidden_layers * 2.0 * arch.params / s.tp * byte_s  # a decode step reads weights
    gen_s += layer_steps * 2 * card.allreduce_s if s.tp > 1 else 0.0  # vLLM's TP: two all-reduces per layer and step
    fwd_s = 2.0 * arch.active_params * t * flop_s
    updates = updates_per_step(s)
    bwd = 1.0 if s.lora_rank > 0 else 2.0  # backward in forwards: activations' gradients, and the weights' unless LoRA
    recompute = 1.0 if s.gradient_checkpointing else 0.0
    gather_s = 2.0 * arch.params * (s.fsdp - 1) / s.fsdp / (card.link_gb_s * 1e9)  # one FSDP all-gather
    mb_lp = (math.ceil(t / max(1, s.log_prob_tokens)) if s.log_prob_use_dynamic_bsz
             else math.ceil(w.trajectories / max(1, s.log_prob_micro_batch_size_per_gpu or 1)))
    mb_upd = updates * math.ceil(t / updates / max(1, s.update_tokens))
    trained = arch.lora_params(s.lora_rank, s.lora_targets) if s.lora_rank > 0 else arch.params / s.fsdp
    opt_s = updates * 16.0 * trained * (3 * byte_s + (2 * pcie_s if s.optimizer_offload else 0.0))
    # verl's actor param_offload: the shards go to host RAM between phases and come back for each (a round trip)
    shard_s = 2 * param_bytes(s) * arch.params / s.fsdp * pcie_s if s.param_offload else 0.0
    per_layer = arch.hidden_size * 2 if s.gradient_checkpointing else arch.layer_activation_bytes_per_token
    act_s = 2 * t * arch.num_hidden_layers * per_layer * pcie_s if s.activation_offload else 0.0  # out and back
    ref = {"fixed": 1.0, "loop_tokens": loop, fused_key: fused, "micro_batches": mb_lp,
           "packed_attention_tflop": packed_attention_tflop(arch, s, t, s.log_prob_tokens)}
    packed_upd = updates * packed_attention_tflop(arch, s, t / updates, s.update_tokens)
    return {
        "generation": {"count": {"fixed": 1.0, "eager_layer_steps": eager * layer_steps,
                                 "graph_layer_steps": (1 - eager) * layer_steps},
                       "physics_s": gen_s + 2.0 * arch.active_params * w.trajectories * w.prompt * flop_s,
                       "waves": waves},  # said in plan.json's time.assumed
        "old_log_prob": {"count": dict(ref), "physics_s": fwd_s + mb_lp * gather_s + shard_s},
        "reference": {"count": ref if s.ref_used else {},
                      "physics_s": fwd_s + mb_lp * gather_s + (2.0 * arch.params * pcie_s if s.ref_param_offload
                                                              else 0.0) if s.ref_used else 0.0},
        "update": {"count": {"fixed": 1.0, "loop_tokens": loop, fused_key: fused, "updates": updates,
                             "micro_batches": mb_upd, "packed_attention_tflop": packed_upd},
                   "physics_s": fwd_s * (1 + bwd + recompute) + opt_s + mb_upd * gather_s * (1 + bwd) + shard_s
                   + act_s},
        "weight_sync": {"count": {"fixed": 1.0}, "physics_s": 2.0 * arch.params / n * byte_s + shard_s},
        "other": {"count": {"fixed": 1.0, "trajectories": w.trajectories}, "physics_s": 0.0},
    }


def phase_seconds(feats: dict[str, dict[str, Any]], coef: dict[str, dict[str, float]]) -> dict[str, float]:
    """Seconds per phase: the physics plus the fitted seconds per count (UNMEASURED's where nothing was fitted)."""
    return {phase: f["physics_s"] + sum((coef.get(phase) or {}).get(k, UNMEASURED.get(k, 0.0)) * v
                                        for k, v in f["count"].items())
            for phase, f in feats.items()}


def recorded_cards() -> dict[str, int]:
    """The cards the calibration table's fitted solo runs ran on, and how many runs each."""
    return dict(Counter(j["card"] for j in table().get("jobs", []) if "ratio" in j and j.get("card")))


def table() -> dict[str, Any]:
    return facts.load_json_or(TABLE, {})


@dataclass(frozen=True)
class RunShape:
    """What the whole run's length needs besides a step: steps, validations, the planned lengths."""

    steps: int
    prompt_tokens: float  # mean prompt the plan assumes
    prompt_source: str
    val_rows: int | None = None
    val_n: int = 1
    test_freq: int = -1
    val_before_train: bool = True
    jobs_on_card: int = 1  # hydra/launcher=side_by_side: jobs sharing the card at once (lab.side_by_side_jobs)


def sharing(jobs: int, cal: dict[str, Any]) -> dict[str, Any] | None:
    """Jobs sharing the card: a step's growth, 1 + the calibration's fitted growth per extra job x the other jobs."""
    if jobs <= 1:
        return None
    fit = cal.get("sharing") or {}
    k = float(fit.get("per_extra_job") or 0.0)
    return {"jobs_on_card": jobs, "factor": round(1 + k * (jobs - 1), 3), "per_extra_job": k,
            "source": f"+{k:g} a step per extra job: the median over {len(fit.get('jobs') or [])} recorded runs that "
                      f"shared the card ({TABLE_MD})"}


def time_plan(arch: Arch, s: Settings, card: Card, shape: RunShape, kv: Mapping[str, Any]) -> dict[str, Any]:
    """The `time` section of plan.json: a steady step per phase, the first step, start-up and the run; `kv`: the
    memory plan's KV cache for these settings."""
    cal = table()
    coef = cal.get("coefficients") or {}
    n = max(1, s.n_gpus)
    resp = float(s.max_response_length)
    w = Work(s.train_batch_size * s.rollout_n / n, shape.prompt_tokens, resp, resp)
    feats = features(arch, s, w, card, kv)
    shared = sharing(shape.jobs_on_card, cal)
    factor = shared["factor"] if shared else 1.0
    phases = {k: v * factor for k, v in phase_seconds(feats, coef).items()}
    step = sum(phases.values())
    first = step + float(cal.get("first_step_extra_s", 0.0))
    load_s = 3 * 2.0 * arch.params / (DISK_GB_S * 1e9)
    startup = float(cal.get("startup_fixed_s", 0.0)) + load_s
    validations, val_s = 0, 0.0
    if shape.val_rows:
        sv = replace(s, train_batch_size=shape.val_rows, rollout_n=shape.val_n)  # verl validates the whole file
        vw = Work(shape.val_rows * shape.val_n / n, shape.prompt_tokens, resp, resp)
        val_s = phase_seconds({"generation": features(arch, sv, vw, card, kv)["generation"]}, coef)["generation"]
        val_s = val_s * factor + float(cal.get("validation_extra_s", 0.0))
        if shape.test_freq and shape.test_freq > 0:
            validations = shape.steps // shape.test_freq
        validations += 1 if shape.val_before_train else 0
    run = startup + first + max(0, shape.steps - 1) * step + validations * val_s
    if validations:
        run += float(cal.get("first_validation_extra_s", 0.0))
    counted = {k: [ph for ph, f in feats.items() if f["count"].get(k)] for k in UNMEASURED}
    fitted = {k for k, phs in counted.items() if phs and all(k in (coef.get(ph) or {}) for ph in phs)}
    checked = {k for k in fitted if (cal.get("full_steps_with") or {}).get(k)}
    unmeasured = [PASS_LEVEL[k] if k in fitted and k in PASS_LEVEL else NOT_MEASURED[k]
                  for k, phs in counted.items() if phs and k not in checked]
    lo_hi = (cal.get("measured_range") or {}).get("update_tokens")
    if lo_hi and s.update_tokens > lo_hi[1]:
        unmeasured.append(f"update micro-batches of {s.update_tokens} tokens (the recorded runs': "
                          f"{lo_hi[0]}-{lo_hi[1]}): the fitted seconds per micro-batch carried beyond them")
    if not per_token_loop(s) and not s.use_fused_kernels:
        unmeasured.append("log-probs through flash-attn's cross-entropy (no recorded run had flash-attn): the passes' "
                          "fixed costs without the per-token loop")
    if n > 1:
        unmeasured.append(f"{n} GPUs: FSDP's all-gathers over the cards' link at {card.link_gb_s:g} GB/s")
    return {
        "step_s": round(step, 1),
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "first_step_s": round(first, 1),
        "startup_s": round(startup, 1),
        "validation_s": round(val_s, 1) if validations else None,
        "validations": validations,
        "steps": shape.steps,
        "run_s": round(run, 1),
        "assumed": {"prompt_tokens": round(shape.prompt_tokens, 1), "prompt_source": shape.prompt_source,
                    "response_tokens": int(resp), "tokens_per_gpu_per_step": int(w.tokens),
                    "generation_waves": feats["generation"]["waves"], "per_token_log_prob_loop": per_token_loop(s)},
        "card": {"name": card.name, "scaled": card.scaled},
        "sharing": shared,  # None alone on the card
        "not_measured": unmeasured,
        "accuracy": cal.get("accuracy") or {},
    }


def int_or(v: Any, default: int) -> int:
    """A value the rules refuse when it is no whole number (the plan is made all the same)."""
    try:
        return int(v) if v is not None else default
    except (TypeError, ValueError):
        return default


def duration(sec: float | None) -> str:
    """Seconds as a person reads them: 45 s, 18 min, 5.2 h."""
    if sec is None:
        return "-"
    return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.0f} min" if sec < 5400 else f"{sec / 3600:.1f} h"
