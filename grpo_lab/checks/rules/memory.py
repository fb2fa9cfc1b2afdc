"""Rules on the memory plan (grpo_lab/memory/memplan.py), and which model is planned.

The model planned is the one verl will load: a local folder's config.json, else the Hugging Face cache's copy of the
hub id, else the conf/model/ group whose model_path is that id (MODEL_PATH=Qwen/Qwen3-0.6B plans the 0.6B, whatever
the model group), else the model group's own facts (lab.model).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from grpo_lab.memory import calibration, engines, memplan

from grpo_lab import facts
from grpo_lab.labconf import Lab
from grpo_lab.checks.rules import A, Ctx, Problem, error, note, oom, rule, warn


@dataclass
class ModelFacts:
    arch: memplan.Arch | None
    info: dict[str, Any] = field(default_factory=dict)  # name, hub_id, thinking (a model group's lab.model)
    mismatch: str = ""  # model_path names no model we know, and the model group is another one
    notes: list[str] = field(default_factory=list)
    random_weights: str = ""  # the folder's mark: random weights, for memory and speed only (grpo_lab.tasks.qwen3_random)
    file_positions: int | None = None  # max_position_embeddings of the model's own config, when override_config raised it


def _from_config_json(path: Path, source: str) -> memplan.Arch:
    cfg = json.loads(path.read_text())
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    return memplan.Arch.from_mapping(cfg, source=source)


def position_override(c: Ctx) -> int | None:
    """actor_rollout_ref.model.override_config's max_position_embeddings (under its model_config when it has one), as
    verl 0.9.1 sets it on the model's config before the rollout checks max_model_len against it
    (verl/workers/config/model.py HFModelConfig.__post_init__ -> verl/utils/model.py update_model_config)."""
    ov = c.get(A + "model.override_config", {}) or {}
    ov = ov.get("model_config", ov) if isinstance(ov, Mapping) else {}
    v = ov.get("max_position_embeddings") if isinstance(ov, Mapping) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def resolve_model(c: Ctx) -> ModelFacts:
    """The model verl will load (module docstring), with the positions override_config gives it."""
    m = _model_files(c)
    positions = position_override(c)
    if m.arch is not None and positions is not None:
        m.file_positions = m.arch.max_position_embeddings
        m.arch = replace(m.arch, max_position_embeddings=positions)
    return m


def _model_files(c: Ctx) -> ModelFacts:
    path = str(c.get(A + "model.hf_config_path") or c.get(A + "model.path") or "")
    group = asdict(c.lab.model)
    groups = facts.model_groups()
    known = groups.get(path)
    info = dict(known) if known else group
    local = Path(os.path.expanduser(path)) if path else None
    notes: list[str] = []
    if local is not None and (local / "config.json").is_file():
        try:
            return ModelFacts(_from_config_json(local / "config.json", str(local / "config.json")), info,
                              random_weights=facts.random_weights_mark(local / "config.json"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"could not read {local / 'config.json'} ({e}); planning the model group's facts")
    elif local is not None and local.is_dir():  # a folder with no model in it is no model: not the group's either
        return ModelFacts(None, {}, notes=[f"memory plan skipped: {path} holds no config.json, so there is no model "
                                           f"to plan (the model option's {group.get('name')} is not planned in its "
                                           f"place)"])
    cached = facts.hf_cached_config(path, c.environ) if path and not (local and local.exists()) else None
    if cached is not None:
        try:
            return ModelFacts(_from_config_json(cached, str(cached)), info, notes=notes)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if known and all(known.get(k) is not None for k in memplan.Arch.FIELDS):
        return ModelFacts(memplan.Arch.from_mapping(known, source=f"conf/model ({known.get('name')}: {path})"),
                          info, notes=notes)
    if all(group.get(k) is not None for k in memplan.Arch.FIELDS):
        hub = group.get("hub_id")
        mismatch = ""
        if path and hub and path != hub and not (local and local.exists()):
            mismatch = path
        return ModelFacts(memplan.Arch.from_mapping(group, source=f"lab.model ({group.get('name')})"), group,
                          mismatch, notes)
    return ModelFacts(None, info, notes=notes + [
        "no architecture facts (no local config.json, no known model, no lab.model): memory plan skipped"])


def plan_memory(c: Ctx) -> dict[str, Any]:
    m = c.model
    c.notes.extend(m.notes)
    if m.arch is None:
        return {}
    from grpo_lab.checks.rules.values import wrong_types

    nulls = [key for key, v, *_ in wrong_types(c) if v is None]  # the plan would read verl's default in their place
    if nulls:
        c.notes.append(f"memory plan skipped until the values named above are numbers ({', '.join(nulls)}: null)")
        return {}
    try:
        s = memplan.settings_from_verl(c.verl, c.lab)
    except (TypeError, ValueError) as e:
        c.notes.append(f"memory plan skipped until the values named above are numbers ({e})")
        return {}
    engine = str(s.rollout_engine or "vllm").lower()
    if engine not in engines.ENGINES:  # verl may know it (trtllm); the plan has not been measured with it
        why = (f"rollout engine {s.rollout_engine!r} not measured: the memory plan knows how "
               f"{' and '.join(engines.ENGINES)} use gpu_memory_utilization (grpo_lab/memory/engines.py), not this one, so "
               f"it gives no memory verdict for this job (weights, KV cache and the phases unchecked)")
        c.notes.append(why)
        return {"params": m.arch.params(), "architecture_source": m.arch.source, "rollout_engine": s.rollout_engine,
                "verdict": {"overall": "not measured"}, "not_measured": why}
    if s.card_gb <= 0:  # card_memory_unknown refuses it
        return {"params": m.arch.params(), "architecture_source": m.arch.source}
    util = s.gpu_memory_utilization
    if not 0.0 < util <= 1.0 or (util == 1.0 and engine == "vllm"):
        # refused by gpu_memory_utilization_range (out of (0, 1], or 1.0 on vLLM); plan with the guide's 0.4
        s = replace(s, gpu_memory_utilization=0.4)
        c.notes.append("memory plan made with gpu_memory_utilization 0.4 (the configured value is refused)")
    if m.arch.is_moe:
        a = m.arch
        c.notes.append(f"mixture of experts: {a.num_experts} experts, {a.num_experts_per_tok} per token in "
                       f"{a.sparse_layers} layers: planned with all {a.params() / 1e9:.1f}B parameters for weights, "
                       f"gradients, optimizer and vLLM, {a.active_params() / 1e9:.1f}B active for activations")
    plan = memplan.memory_plan(m.arch, s, remedies=not c.quick)
    plan["_settings"] = s
    for phase, opts in list(plan.get("remedies", {}).items()):  # once some remedy ends the OOM, drop those that do not
        if any(o["verdict"] != "oom" for o in opts):
            plan["remedies"][phase] = [o for o in opts if o["verdict"] != "oom"]
    return plan


def _fix_for(plan: dict[str, Any], phase: str) -> str:
    opts = plan.get("remedies", {}).get(phase, [])
    good = [r for r in opts if r["verdict"] == "fits"] or [r for r in opts if r["verdict"] == "tight"]
    return good[0]["override"] if good else (opts[0]["override"] if opts else "")


def _alternatives(plan: dict[str, Any], phase: str) -> str:
    opts = plan.get("remedies", {}).get(phase, [])
    if not opts:
        return ""
    return " Remedies (guide's order), predicted peak after each: " + "; ".join(
        f"{r['override']} -> {r['peak_gb_per_gpu']} GB {r['verdict']}" for r in opts) + "."


def card_gb(lab: Lab) -> float | None:
    """One card's memory from lab.hardware.gpu_memory_gb when it is a positive number; else None."""
    v = lab.hardware.gpu_memory_gb  # typed: a number or None (grpo_lab/labconf.py)
    return float(v) if v is not None and v > 0 else None


@rule("card_memory_unknown", kind="plan", phase="preflight")
def card_memory_unknown(c: Ctx) -> Iterable[Problem]:
    """No card size (lab.hardware.gpu_memory_gb 0, negative, null or no number): the plan gives no phase a verdict,
    so it refuses instead of passing as "OK" (the fix: the hardware option's own size)."""
    if card_gb(c.lab) is not None:
        return
    raw, name = c.lab.hardware.gpu_memory_gb, str(c.lab.hardware.name or "")
    size = facts.hardware_card_gb(name) if name else None
    what = f"{c.model.info.get('name') or 'the model'}" if c.model else "the model"
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
    tp = c.get(A + "rollout.tensor_model_parallel_size", 1)
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
    s, arch = plan["_settings"], c.model.arch
    state_full = plan["actor_state_full_gb_per_gpu"]
    if s.lora_rank == 0 and state_full > memplan.TIGHT_FRACTION * s.card_gb:
        big = arch.params() > 6e9
        pointer = memplan.LORA_OVERRIDES + (" " + memplan.OFFLOAD_OVERRIDES if big else "")
        yield oom(f"full fine-tuning of a {arch.params() / 1e9:.1f}B-parameter model needs 16 B per parameter for its "
                  f"weights, gradients and Adam state: {state_full:.1f} GB per GPU over {s.fsdp} GPUs, against "
                  f"{s.card_gb:g} GB cards, before any activation. verl loads all of it for the update even with "
                  f"offload. The guide: 8B and above only with LoRA (plus offload)"
                  + (" (model=qwen3_8b_lora is that recipe for Qwen3-8B)" if big else ""), pointer)


@rule("vllm_kv_cache", kind="memory", phase="start-up")
def vllm_kv_cache(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    s, kv = plan["_settings"], plan["kv_cache"]
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


def _how_sure(plan: dict[str, Any], phase: str) -> str:
    cal = (plan.get("calibration") or {}).get(phase)
    return calibration.describe(cal) if cal else "not calibrated"


def _phase_rule(phase: str, label: str, job_phase: str):
    def check(c: Ctx) -> Iterable[Problem]:
        plan = c.plan
        if not plan.get("phases"):
            return
        card = plan["_settings"].card_gb
        ph, v = plan["phases"][phase], plan["verdict"][phase]
        peak = ph["peak_gb_per_gpu"]
        parts = " + ".join(f"{k.replace('_', ' ')} {val}" for k, val in ph["components_gb"].items() if val)
        if phase == "training":
            parts = f"{ph['peak_of']}: {parts}"
        margin = float(((plan.get("calibration") or {}).get(phase) or {}).get("margin", 0.0))
        if v == "oom":
            comps = ph["components_gb"]
            exact = float(comps.get("vllm_budget", comps.get("sglang_static", 0.0))) if phase == "generation" else 0.0
            if phase == "generation" and memplan.verdict_of(peak, card, margin, exact) != "oom":
                return  # the engine cannot start (no KV cache for one sequence): vllm_kv_cache says why
            of = " on what is not the engine's exact budget" if exact else ""
            yield oom(f"{label} phase: predicted peak {peak} GB per GPU on {card:g} GB cards, {peak / card - 1:.0%} "
                      f"above the card ({parts}); beyond the plan's margin of {margin:.0%}{of} "
                      f"({_how_sure(plan, phase)}).{_alternatives(plan, phase)}", _fix_for(plan, phase))
        elif v == "tight" and peak > card:
            yield warn(f"{label} phase may not fit: predicted peak {peak} GB per GPU, {peak / card - 1:.0%} above the "
                       f"{card:g} GB card, within the plan's margin of {margin:.0%} for this regime, so not refused "
                       f"({_how_sure(plan, phase)}) ({parts}). If it runs out of memory, apply the fix."
                       f"{_alternatives(plan, phase)}", _fix_for(plan, phase))
        elif v == "tight":
            yield warn(f"{label} phase is tight: predicted peak {peak} GB of {card:g} GB ({peak / card:.0%}, above "
                       f"{int(memplan.TIGHT_FRACTION * 100)}%; {_how_sure(plan, phase)}) ({parts})."
                       f"{_alternatives(plan, phase)}", _fix_for(plan, phase))

    check.__name__ = f"memory_{phase}"
    return rule(f"memory_{phase}", kind="memory", phase=job_phase)(check)


# the memory plan's phase, how the message names it, the job's phase (grpo_lab/registry.py PHASES)
for _phase, _label, _job_phase in (("generation", "generation", "rollout"), ("training", "training", "update"),
                                   ("weight_sync", "weight-sync", "weight sync")):
    _phase_rule(_phase, _label, _job_phase)


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
            s = plan["_settings"]
            per_gpu = memplan.HOST_PER_GPU_WORKER_GB + memplan.HOST_PER_VLLM_WORKER_GB
            fixed = max(host["total_gb"] - s.n_gpus // max(1, s.nnodes) * per_gpu, memplan.HOST_BASE_GB)
            k = int((host["capacity_gb"] - fixed) // per_gpu)
            per_node = s.n_gpus // max(1, s.nnodes)
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
    c.plan  # noqa: B018 (plans once, fills c.notes)
    for n in c.notes:
        yield note(n)
    c.notes.clear()
