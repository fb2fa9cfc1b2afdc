"""One job, described once: `Run.build` reads the composed verl config and grpo-lab's typed `lab` into a frozen `Run`
that every stage reads (the rules, make fit, the side-by-side KV pin, make report): the settings verl will use, the
batch arithmetic, the model planned, and the memory and time plans, each computed once. docs/launch.md."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_lab import facts
from grpo_lab.labconf import Lab
from grpo_lab.memory import engines, memplan, timeplan
from grpo_lab.memory.memplan_arch import Settings
from grpo_lab.memory.planned_model import PlannedModel, resolve_model
from grpo_lab.memory.settings import batch_facts, settings_from_verl
from grpo_lab.memory.verl_view import VerlView, wrong_types
from grpo_lab.verl_keys import freeze


@dataclass(frozen=True)
class Run:
    verl: Mapping[str, Any]  # the composed verl config as planned (read-only)
    cfg: VerlView  # the same, typed: verl's sections and field names (grpo_lab/memory/verl_view.py)
    lab: Lab
    environ: Mapping[str, str]
    model: PlannedModel
    batch: Mapping[str, Any]  # the batch arithmetic (settings.batch_facts)
    settings: Settings | None  # as read from verl's config; None: a number it needs is none
    planned: Settings | None  # what the plans planned (gpu_memory_utilization 0.4 for a refused one); None: no plan
    memory: Mapping[str, Any]  # the memory plan (memplan.memory_plan), {} when not made
    shape: timeplan.RunShape | None
    time: Mapping[str, Any]  # the time plan (timeplan.time_plan), {} when not made
    notes: tuple[str, ...] = ()  # what planning found: what was planned from where, what was skipped
    quick: bool = False  # a fix's re-check: the memory plan without its remedies
    layers: Any = field(default=None, compare=False)  # what set each value (grpo_lab/cli/provenance.py Layers)

    @property
    def batch_shape(self) -> dict[str, Any]:
        """The batch arithmetic that make fit leaves as it is (what is trained per step and per update)."""
        keys = ("train_batch_size", "rollout_n", "ppo_mini_batch_size", "updates_per_step", "sequence_length",
                "trajectories_per_step")
        return {k: self.batch.get(k) for k in keys}

    @classmethod
    def build(cls, verl: Mapping[str, Any], lab: Lab | None = None, environ: Mapping[str, str] | None = None, *,
              quick: bool = False, layers: Any = None, verl_defaults: bool = True) -> Run:
        """The job's Run; verl_defaults=False: a key the config lacks reads None, not verl's default."""
        lab, environ = lab or Lab(), os.environ if environ is None else environ
        verl = freeze(verl or {})
        cfg = VerlView.of(verl, defaults=verl_defaults)
        model = resolve_model(cfg, lab, environ)
        batch = batch_facts(cfg)
        notes = list(model.notes)
        s, planned, memory = plan_memory(cfg, lab, model, notes, quick)
        shape = run_shape(cfg, lab, batch, planned) if planned is not None else None
        time = (timeplan.time_plan(model.arch, planned, timeplan.Card.of(lab.hardware), shape, memory["kv_cache"])
                if shape else {})
        return cls(verl, cfg, lab, environ, model, batch, s, planned, memory, shape, time, tuple(notes), quick,
                   layers)


def plan_memory(cfg: VerlView, lab: Lab, m: PlannedModel, notes: list[str],
                quick: bool) -> tuple[Settings | None, Settings | None, dict[str, Any]]:
    """(the settings as read, as planned, the memory plan); what was skipped, and why, goes to `notes`."""
    nulls = [key for key, v, *_ in wrong_types(cfg) if v is None]  # verl's own default is a number: no plan on null
    try:
        s, why = (None, f"{', '.join(nulls)}: null") if nulls else (settings_from_verl(cfg, lab), "")
    except (TypeError, ValueError) as e:
        s, why = None, str(e)
    if m.arch is None:
        return s, None, {}
    if s is None:
        notes.append(f"memory plan skipped until the values named above are numbers ({why})")
        return None, None, {}
    engine = str(s.rollout_engine or "vllm").lower()
    if engine not in engines.ENGINES:  # verl may know it (trtllm); the plan has not been measured with it
        why = (f"rollout engine {s.rollout_engine!r} not measured: the memory plan knows how "
               f"{' and '.join(engines.ENGINES)} use gpu_memory_utilization (grpo_lab/memory/engines.py), not this "
               f"one, so it gives no memory verdict for this job (weights, KV cache and the phases unchecked)")
        notes.append(why)
        return s, None, {"params": m.arch.params, "architecture_source": m.arch.source, "rollout_engine":
                         s.rollout_engine, "verdict": {"overall": "not measured"}, "not_measured": why}
    if s.card_gb <= 0:  # card_memory_unknown refuses it
        return s, None, {"params": m.arch.params, "architecture_source": m.arch.source}
    read, util = s, s.gpu_memory_utilization
    if not 0.0 < util <= 1.0 or (util == 1.0 and engine == "vllm"):
        # refused by gpu_memory_utilization_range (out of (0, 1], or 1.0 on vLLM); plan with the guide's 0.4
        s = replace(s, gpu_memory_utilization=0.4)
        notes.append("memory plan made with gpu_memory_utilization 0.4 (the configured value is refused)")
    if m.arch.is_moe:
        a = m.arch
        notes.append(f"mixture of experts: {a.num_experts} experts, {a.num_experts_per_tok} per token in "
                     f"{a.sparse_layers} layers: planned with all {a.params / 1e9:.1f}B parameters for weights, "
                     f"gradients, optimizer and vLLM, {a.active_params / 1e9:.1f}B active for activations")
    plan = memplan.memory_plan(m.arch, s, remedies=not quick)
    for phase, opts in list(plan.get("remedies", {}).items()):  # once some remedy ends the OOM, drop those that do not
        plan["remedies"][phase] = [o for o in opts if o["verdict"] != "oom"] or opts
    return read, s, plan


def run_shape(cfg: VerlView, lab: Lab, batch: Mapping[str, Any], s: Settings) -> timeplan.RunShape:
    """The run's steps, validations and planned prompt length."""
    ds = lab.dataset
    steps = batch.get("total_training_steps")
    if steps is None and ds.train_rows:  # the train file is not here yet: the dataset option's published size
        steps = ds.train_rows // max(1, s.train_batch_size) * timeplan.int_or(batch.get("total_epochs"), 1)
    val_rows, vf = ds.test_rows, cfg.data.val_files
    # the validation file when it is here (verl validates all of it)
    with contextlib.suppress(OSError, ValueError, TypeError):
        val_rows = facts.parquet_num_rows(vf[0] if isinstance(vf, (list, tuple)) and vf else vf)
    if ds.prompt_tokens:
        prompt, source = float(ds.prompt_tokens), f"lab.dataset.prompt_tokens of {ds.name}"
    else:
        prompt, source = s.max_prompt_length / 2, "half of max_prompt_length (lab.dataset.prompt_tokens not set)"
    return timeplan.RunShape(steps=timeplan.int_or(steps, 0), prompt_tokens=prompt, prompt_source=source,
                             val_rows=val_rows, val_n=timeplan.int_or(cfg.rollout.val_kwargs.n, 1),
                             test_freq=timeplan.int_or(cfg.trainer.test_freq, -1),
                             val_before_train=bool(cfg.trainer.val_before_train),
                             jobs_on_card=timeplan.int_or(lab.side_by_side_jobs, 1))


def planned_kv_bytes(memory: Mapping[str, Any]) -> int | None:
    """A memory plan's vLLM KV cache per GPU in bytes, or None (no plan, not vLLM, no room for a cache)."""
    kv = memory.get("kv_cache") or {}
    gb = float(kv.get("kv_cache_gb") or 0)
    if kv.get("engine") != "vllm" or gb <= 0 or int(kv.get("tokens") or 0) <= 0:
        return None
    return int(gb * 1e9)
