"""Rules on the values: single values verl accepts without a word and then fails on, or trains nothing with; and what
they add up to on the cards: the memory plan of the job's Run (grpo_lab/memory/run.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from grpo_lab import facts
from grpo_lab.checks.rules import ALT, A, Ctx, Problem, error, note, oom, rule, warn
from grpo_lab.cli.apply import text
from grpo_lab.cli.config import safe_name, unsafe_name
from grpo_lab.cli.knobs import KNOBS
from grpo_lab.facts import preset_learning_rates
from grpo_lab.memory import calibration, memplan
from grpo_lab.memory.run import planned_kv_bytes
from grpo_lab.memory.verl_view import KV_PIN, below_range, is_kind, wrong_types

# --------------------------------------------------------------------------------- values verl takes but cannot use


_SHORT = {k.verl_key: k.key for k in KNOBS}

# verl 0.9.1's estimators that compare the answers of one prompt (verl/trainer/ppo/core_algos.py, grouped by the
# prompt `index`), and what each does with a group of one answer (rollout.n=1): grpo_passk raises; the others run.
GROUP_ESTIMATORS: dict[str, str] = {
    "grpo": "the raw score as the advantage, no baseline (mean 0, std 1: compute_grpo_outcome_advantage)",
    "gdpo": "the raw scores, no baseline, whitened over the batch (compute_gdpo_outcome_advantage via GRPO's)",
    "grpo_vectorized": "the raw score as the advantage, no baseline (verl/utils/groupwise.py group_mean_std: a "
                       "singleton group gets mean 0, std 1)",
    "rloo": "the raw score as the advantage, no leave-one-out baseline (compute_rloo_outcome_advantage)",
    "rloo_vectorized": "zero advantages for every answer ((c > 1) mask: compute_rloo_vectorized_outcome_advantage): "
                       "no policy gradient at all, only the KL and entropy terms move the actor",
    "opo": "the raw score as the advantage, no baseline (compute_opo_outcome_advantage)",
    "gpg": "the raw score as the advantage, no baseline (compute_gpg_outcome_advantage)",
    "reinforce_plus_plus_baseline": "the raw score, no group baseline, whitened over the batch "
                                    "(compute_reinforce_plus_plus_baseline_outcome_advantage)",
    "optimal_token_baseline": "the return as the advantage, no baseline (compute_optimal_token_baseline_advantage: "
                              "'Single trajectory - no baseline')",
    "tir_optimal_token_baseline": "the return as the advantage, no baseline (its N == 1 branch)",
    "grpo_passk": "",  # raises: group_size's error
}


def override_key(verl_key: str) -> str:
    """The key a user types for this verl key: its short knob when there is one."""
    return _SHORT.get(verl_key, verl_key)


# a learning rate from here up is warned: GRPO fine-tunes a pretrained model with rates around 1e-6 to 1e-5
LR_WARN = 1e-3


@rule("value_types", kind="values", phase="compose")
def value_types(c: Ctx) -> Iterable[Problem]:
    """A number verl needs given as text (train_batch_size=abc) or null: named, not read as 0."""
    for key, v, default, what, fix, why in wrong_types(c.cfg):
        given = (f"{key}=null is not {what} (verl's own default is {default})" if v is None else
                 f"{key}={v!r} is not {what} (a {type(v).__name__})")
        yield error(f"{given}: verl would fail on it, or {why}", f"{override_key(key)}={fix}")


@rule("value_range", kind="values", phase="compose")
def value_range(c: Ctx) -> Iterable[Problem]:
    """Numbers below what verl can use (ngpus_per_node=0, actor_lr=-1e-6, total_epochs=-1, max_response_length=0)."""
    for key, v, lo, fix, why in below_range(c.cfg):
        if key == "trainer.n_gpus_per_node" and c.launching:
            fix = max(1, facts.visible_gpus(c.environ)[0])
        yield error(f"{key}={v!r} must be at least {lo:g}: {why}", f"{override_key(key)}={fix}")


@rule("lora_rank_negative", kind="values", phase="compose")
def lora_rank_negative(c: Ctx) -> Iterable[Problem]:
    """verl 0.9.1 turns LoRA on for lora_rank > 0 only (workers/engine/fsdp/transformer_impl.py: _is_lora)."""
    key = A + "model.lora_rank"
    if is_kind(v := c.cfg.model.lora_rank, int) and v < 0:
        yield error(f"{key}={v}: verl 0.9.1 turns LoRA on only when lora_rank > 0, so a negative rank trains the "
                    f"whole model without a word. 0 says that (whole model); a positive rank is LoRA",
                    ALT.join([f"{key}=0", f"{key}=64"]))


@rule("learning_rate_zero", kind="values", phase="update")
def learning_rate_zero(c: Ctx) -> Iterable[Problem]:
    """actor_lr=0: torch's AdamW takes it (it refuses only a negative rate) and verl runs every step, generation,
    rewards and all, but each update moves every weight by lr x (its Adam step + weight decay) = 0: nothing is
    learned, at the full cost of the run."""
    key, v = A + "actor.optim.lr", c.cfg.actor.optim.lr
    if is_kind(v, float) and v == 0:
        yield warn(f"{key}=0: verl 0.9.1 runs it (torch.optim.AdamW accepts a rate of 0), but every actor update then "
                   f"moves no weight, so the run generates and scores answers at full cost and the actor never changes "
                   f"(the rewards stay where they start)", f"{override_key(key)}=1e-06")


@rule("group_size", kind="values", phase="update")
def group_size(c: Ctx) -> Iterable[Problem]:
    """rollout.n=1 with an estimator that compares the answers of one prompt: grpo_passk raises in verl 0.9.1, the
    others run with no baseline (GROUP_ESTIMATORS says what each does)."""
    est, n = str(c.cfg.algorithm.adv_estimator), c.cfg.rollout.n
    if est not in GROUP_ESTIMATORS or not is_kind(n, int) or n != 1:
        return
    what = (f"algorithm.adv_estimator={est} compares the answers of one prompt with each other, and rollout.n=1 gives "
            f"each prompt one answer: there is no group")
    if est == "grpo_passk":
        yield error(f"{what}, and verl 0.9.1 raises 'ValueError: Pass@k requires at least 2 samples per group. Got 1 "
                    f"for group ...' at the first advantage computation, after the first generation "
                    f"(verl/trainer/ppo/core_algos.py compute_grpo_passk_outcome_advantage). The guide's group is 5 "
                    f"answers", "rollout_n=5")
    else:
        yield warn(f"{what}. verl 0.9.1 runs it (verl/trainer/ppo/core_algos.py) with {GROUP_ESTIMATORS[est]}: not "
                   f"the group-relative signal {est} is for. The guide's group is 5 answers", "rollout_n=5")


@rule("learning_rate_high", kind="values", phase="update")
def learning_rate_high(c: Ctx) -> Iterable[Problem]:
    """actor_lr=1.0 or 1e-3 (a typo of 1e-6, a supervised fine-tuning habit): AdamW moves every weight by about the
    learning rate each step, so the pretrained model is overwritten within a few steps. The presets' rates: conf/."""
    key, v = A + "actor.optim.lr", c.cfg.actor.optim.lr
    if not is_kind(v, float) or v < LR_WARN:
        return
    presets = preset_learning_rates()
    used = "; ".join(f"{lr:g} ({f})" for lr, f in presets) or "none found under conf/"
    yield warn(f"{key}={v:g} is {LR_WARN:g} or more: AdamW moves every weight by about the learning rate at each "
               f"update, {v / max(lr for lr, _ in presets or ((1e-6, ''),)):.0f}x the largest rate of the presets, "
               f"and a pretrained model is overwritten within a few steps (its answers turn to noise, the rewards "
               f"fall to the floor). The presets use {used}",
               # verl's key: it wins over actor_lr, ACTOR_LR and a config file's value, however the rate was given
               ALT.join(dict.fromkeys(f"{key}={lr:g}" for lr, _ in presets)))


@rule("experiment_name_folder", kind="values", phase="compose")
def experiment_name_folder(c: Ctx) -> Iterable[Problem]:
    """trainer.experiment_name names the run's folder and its checkpoints': a safe folder name (the command line's
    own value is refused before composing: grpo_lab/cli/overrides.py)."""
    key, name = "trainer.experiment_name", c.cfg.trainer.experiment_name
    why = unsafe_name(key, name, override_key(key)) if isinstance(name, str) else ""
    if why:
        yield error(why, f"{override_key(key)}={safe_name(name)}")


# ---------------------------------------------------------------------- the memory plan, and which model is planned


def _fix_for(plan: dict[str, Any], phase: str) -> str:
    opts = plan.get("remedies", {}).get(phase, [])
    good = [r for r in opts if r["verdict"] == "fits"] or [r for r in opts if r["verdict"] == "tight"]
    return good[0]["override"] if good else (opts[0]["override"] if opts else "")


def _pin_fix(c: Ctx) -> str:
    """The user's vLLM KV-cache pin set to the cache the plan gives vLLM without it, where that is smaller; else ""."""
    s = c.run.planned
    pin = s.vllm_kv_cache_bytes if s else None
    n = planned_kv_bytes(memplan.memory_plan(c.model.arch, replace(s, vllm_kv_cache_bytes=None), remedies=False)) \
        if pin else None
    return f"+{KV_PIN}={n}" if n and n < pin else ""


def _alternatives(plan: dict[str, Any], phase: str) -> str:
    opts = plan.get("remedies", {}).get(phase, [])
    return (" Remedies (guide's order), predicted peak after each: " + "; ".join(
        f"{r['override']} -> {r['peak_gb_per_gpu']} GB {r['verdict']}" for r in opts) + ".") if opts else ""


@rule("card_memory_unknown", kind="plan", phase="preflight")
def card_memory_unknown(c: Ctx) -> Iterable[Problem]:
    """No card size (lab.hardware.gpu_memory_gb 0, negative, null or no number): the plan gives no phase a verdict,
    so it refuses instead of passing as "OK" (the fix: the hardware option's own size)."""
    raw, name = c.lab.hardware.gpu_memory_gb, str(c.lab.hardware.name or "")
    if raw is not None and raw > 0:  # a card size (typed: a number or None, grpo_lab/labconf.py)
        return
    size = facts.hardware_card_gb(name) if name else None
    what = c.model.info.get("name") or "the model"
    yield error(f"lab.hardware.gpu_memory_gb={'null' if raw is None else f'{raw:g}'} is no card size: it must be one "
                f"card's memory in GB as CUDA reports it (32 for the guide's RTX 4080 32 GB, 139.8 for an H200). "
                f"Without it the memory plan gives no phase a verdict, so nothing says whether {what} fits the cards"
                + (f"; the hardware option {name} says {size:g}" if size else ""),
                f"lab.hardware.gpu_memory_gb={size:g}" if size else
                "set lab.hardware.gpu_memory_gb to one card's memory in GB (nvidia-smi --query-gpu=memory.total "
                "--format=csv), or pick a hardware option: hardware=rtx4080x4")


@rule("model_arch_mismatch", kind="plan", phase="preflight")
def model_arch_mismatch(c: Ctx) -> Iterable[Problem]:
    m = c.model
    if m.mismatch:
        yield warn(f"model_path is {m.mismatch!r}, which is none of conf/model's models, has no local config.json and "
                   f"is not in the Hugging Face cache; the memory plan and the thinking-mode check use the model "
                   f"group {m.info.get('name')!r} ({m.info.get('hub_id')})",
                   "pick the model group that matches (e.g. model=qwen3_4b), or point model_path at a local folder "
                   "with its config.json")


@rule("rollout_tp_heads", kind="setup", phase="start-up")
def rollout_tp_heads(c: Ctx) -> Iterable[Problem]:
    """vLLM splits attention heads over tensor-parallel ranks: it refuses a TP that does not divide the model's
    attention heads (SmolLM2-135M has 9: TP 2 cannot serve it)."""
    arch = c.model.arch
    tp = c.cfg.rollout.tensor_model_parallel_size
    if arch is None or not isinstance(tp, int) or tp <= 1:
        return
    heads = arch.num_attention_heads
    if heads % tp:
        ok = [d for d in (1, 2, 4, 8) if heads % d == 0 and d < tp]
        yield error(f"rollout tensor parallel size {tp} does not divide the model's {heads} attention heads: vLLM "
                    f"refuses to start ({arch.source})", f"rollout_tp={max(ok)}" if ok else "")


@rule("full_finetune_too_big", kind="memory", phase="any")
def full_finetune_too_big(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    s, arch = c.run.planned, c.model.arch
    state_full = plan["actor_state_full_gb_per_gpu"]
    if s.lora_rank == 0 and state_full > memplan.TIGHT_FRACTION * s.card_gb:
        yield oom(f"full fine-tuning of a {arch.params / 1e9:.1f}B-parameter model needs 16 B per parameter for its "
                  f"weights, gradients and Adam state: {state_full:.1f} GB per GPU over {s.fsdp} GPUs, against "
                  f"{s.card_gb:g} GB cards, before any activation. verl loads all of it for the update even with "
                  f"offload. The guide: 8B and above only with LoRA (plus offload)"
                  + (" (model=qwen3_8b_lora is that recipe for Qwen3-8B)" if arch.params > 6e9 else ""),
                  text(memplan.lora_changes(arch, s)))


@rule("vllm_kv_cache", kind="memory", phase="start-up")
def vllm_kv_cache(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    s, kv = c.run.planned, plan["kv_cache"]
    if kv["tokens"] <= 0:
        yield oom(f"vLLM's budget gpu_memory_utilization {s.gpu_memory_utilization} x {s.card_gb:g} GB = "
                  f"{kv['budget_gb']} GB cannot hold its own weights ({kv['vllm_weights_gb']} GB at TP {s.tp}) and "
                  f"activations ({kv['vllm_activation_gb']} GB): no room for a KV cache, vLLM refuses to start",
                  _fix_for(plan, "generation"))
    elif not kv["fits_max_model_len"]:
        yield oom(f"vLLM's KV cache ({kv['kv_cache_gb']} GB = {kv['tokens']} tokens) cannot hold one sequence of "
                  f"max_model_len={kv['max_model_len']} tokens, and vLLM refuses to start. rollout.max_model_len is "
                  f"null, so verl uses the model's max_position_embeddings; GRPO here never generates past prompt + "
                  f"response = {kv['sequence_length']}",
                  f"actor_rollout_ref.rollout.max_model_len={kv['sequence_length']}")


def _phase_rule(phase: str, job_phase: str):
    label = phase.replace("_", "-")  # weight-sync

    def check(c: Ctx) -> Iterable[Problem]:
        plan = c.plan
        if not plan.get("phases"):
            return
        card = c.run.planned.card_gb
        ph, v = plan["phases"][phase], plan["verdict"][phase]
        peak = ph["peak_gb_per_gpu"]
        parts = " + ".join(f"{k.replace('_', ' ')} {val}" for k, val in ph["components_gb"].items() if val)
        if phase == "training":
            parts = f"{ph['peak_of']}: {parts}"
        cal = (plan.get("calibration") or {}).get(phase) or {}
        margin = float(cal.get("margin", 0.0))
        how_sure = calibration.describe(cal) if cal else "not calibrated"
        fix = (phase == "generation" and v != "fits" and _pin_fix(c)) or _fix_for(plan, phase)
        if v == "oom":
            comps = ph["components_gb"]
            exact = float(comps.get("vllm_budget", comps.get("sglang_static", 0.0))) if phase == "generation" else 0.0
            if phase == "generation" and memplan.verdict_of(peak, card, margin, exact) != "oom":
                return  # the engine cannot start (no KV cache for one sequence): vllm_kv_cache says why
            of = " on what is not the engine's exact budget" if exact else ""
            yield oom(f"{label} phase: predicted peak {peak} GB per GPU on {card:g} GB cards, {peak / card - 1:.0%} "
                      f"above the card ({parts}); beyond the plan's margin of {margin:.0%}{of} "
                      f"({how_sure}).{_alternatives(plan, phase)}", fix)
        elif v == "tight" and peak > card:
            yield warn(f"{label} phase may not fit: predicted peak {peak} GB per GPU, {peak / card - 1:.0%} above the "
                       f"{card:g} GB card, within the plan's margin of {margin:.0%} for this regime, so not refused "
                       f"({how_sure}) ({parts}). If it runs out of memory, apply the fix."
                       f"{_alternatives(plan, phase)}", fix)
        elif v == "tight":
            yield warn(f"{label} phase is tight: predicted peak {peak} GB of {card:g} GB ({peak / card:.0%}, above "
                       f"{int(memplan.TIGHT_FRACTION * 100)}%; {how_sure}) ({parts})."
                       f"{_alternatives(plan, phase)}", fix)

    check.__name__ = f"memory_{phase}"
    return rule(f"memory_{phase}", kind="memory", phase=job_phase)(check)


# the memory plan's phase, the job's phase (grpo_lab/registry.py PHASES)
for _phase, _job_phase in (("generation", "rollout"), ("training", "update"), ("weight_sync", "weight sync")):
    _phase_rule(_phase, _job_phase)


@rule("memory_host_ram", kind="memory", phase="any")
def memory_host_ram(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    host = plan["host_ram"]
    node = " per node" if host.get("per_node") else ""
    if host["verdict"] == "oom":
        fix = _fix_for(plan, "host_ram")
        if not fix:  # no override of the model's settings helps: each GPU's processes take ~6 GB of the node's RAM
            s = c.run.planned
            per_gpu = memplan.HOST_PER_GPU_WORKER_GB + memplan.HOST_PER_VLLM_WORKER_GB
            per_node = s.n_gpus // max(1, s.nnodes)
            fixed = max(host["total_gb"] - per_node * per_gpu, memplan.HOST_BASE_GB)
            k = int((host["capacity_gb"] - fixed) // per_gpu)
            fix = (f"ngpus_per_node={k}" if 1 <= k < per_node else
                   f"run where a node has at least {host['total_gb']:.0f} GB of RAM (lab.hardware.host_ram_gb is "
                   f"what the hardware file assumes)")
        yield oom(f"host RAM{node}: predicted {host['total_gb']} GB of {host['capacity_gb']} GB "
                  f"({', '.join(f'{k} {v}' for k, v in host['components_gb'].items() if v)})."
                  f"{_alternatives(plan, 'host_ram')}", fix)
    elif host["verdict"] == "tight":
        yield warn(f"host RAM{node} is tight: predicted {host['total_gb']} GB of {host['capacity_gb']} GB",
                   _fix_for(plan, "host_ram"))


@rule("memory_notes", kind="plan", phase="preflight")
def memory_notes(c: Ctx) -> Iterable[Problem]:
    """The plan's own notes (what was planned from where, what was skipped)."""
    for n in c.notes:
        yield note(n)
    c.notes.clear()
