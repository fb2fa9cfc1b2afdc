"""The plan's console text: short (phases, time plan, problems with fixes, verdict) or verbose (all of plan.json's
report); a sweep's plans: one line a job. What each form holds: docs/cli.md "make plan's console"."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from grpo_lab.checks.fixes import gist
from grpo_lab.checks.rules import memory_ids
from grpo_lab.checks.rules.batch import num as _num
from grpo_lab.memory import timeplan

PHASES = ("generation", "training", "weight_sync")
OK_LINES = 25  # an OK plan's console, at most (tests/test_plan_text.py)


def console(r: Any, job_dir: Path, changed: int, verbose: bool, sweep: bool) -> str:
    """What a job prints after its preflight (r: a PreflightReport): a sweep of plans one line a job unless verbose."""
    if sweep and not verbose:
        return job_line(r, job_dir)
    text = report_text(r, verbose)
    if verbose:
        text += (f"\ngrpo-lab: {changed} value(s) differ from verl's defaults, each with verl's value, ours and what "
                 f"set it: \"changed_defaults\" in {job_dir}/plan.json")
    return text + (f"\n{job_line(r, job_dir)}" if sweep else "")


def report_text(r: Any, verbose: bool = False) -> str:
    gap = [""] if verbose else []
    out = [f"grpo-lab preflight: {r.title}" if r.title else "grpo-lab preflight"]
    if not verbose:
        out[0] += " (all of it: preflight.verbose=true, plan.json)"
    if r.random_weights:
        out.append(f"  {r.random_weights}")
    if verbose and r.batch.get("train_batch_size"):
        out += ["", *_batch(r.batch)]
    if r.memory.get("phases"):
        out += gap + (_memory(r.memory) if verbose else _phases(r.memory))
    if r.time:
        out += gap + _time(r.time, verbose)
    for title, items in (("Errors", r.errors), ("Warnings", r.warnings)):
        if items:
            out += gap + [f"{title} ({len(items)})"]
            for p in items:
                short = not verbose and title == "Warnings"
                out += _item(p.rule, gist(p.message) if short else p.message, "fix", p.fix,
                             "" if short else p.checked, "" if short else p.caution)
    if verbose and r.notes:
        out += ["", "Notes", *(f"  - {n}" for n in r.notes)]
    if r.fix_all:  # set only when it passes (run_preflight)
        out += gap + [f"Fix all {len(r.errors)} errors together: {r.fix_all}",
                      "  (re-checked: the preflight passes with all of them)",
                      *(f"  {line}" for line in r.fix_all_caution.splitlines())]
    if r.not_ready:
        out += gap + [f"Not ready to launch here ({len(r.not_ready)})"]
        for n in r.not_ready:
            verb = "make it" if n.rule == "input_missing" else "fix"
            out += (_item(n.rule, n.message, verb, n.command, n.checked) if verbose
                    else [f"  [{n.rule}] {gist(n.message)}  ({verb}: {n.command})"])
    if r.no_fit:
        memory = any(p.rule in memory_ids() for p in r.errors)
        out += gap + [f"No fix above {'makes every phase fit' if memory else 'clears every error together'}: "
                      f"{r.no_fit}",
                      f"  Search settings that {'do' if memory else 'fit every phase'} (every phase below 80% of the "
                      f"card, re-checked): {fit_command(r.fit_args)}"]
    return "\n".join([*out, "", verdict(r)])


def verdict(r: Any) -> str:
    if not r.ok:
        missing = f", {len(r.not_ready)} missing here" if r.launching and r.not_ready else ""
        return f"preflight: REFUSED ({len(r.errors)} error(s){missing})"
    if r.not_ready:
        return "preflight: plan OK; not ready to launch here: " + "; ".join(n.short for n in r.not_ready)
    return "preflight: OK"


def job_line(r: Any, job_dir: Path) -> str:
    """A sweep job's plan in one line: verdict (with the refusing rules), largest phase, step and run, plan.json."""
    rules = " ".join(f"[{p.rule}]" for p in r.errors)
    parts = [verdict(r).removeprefix("preflight: ") + (f" {rules}" if rules else "")]
    phases = r.memory.get("phases") or {}
    if phases:
        top = max(PHASES, key=lambda k: phases[k]["peak_gb_per_gpu"])
        parts.append(f"peak {top.replace('_', ' ')} {phases[top]['peak_gb_per_gpu']} of {r.memory['card_gb']:g} GB "
                     f"({phases[top]['verdict']})")
    if r.time:
        parts.append(f"a step {r.time['step_s']:.0f} s" + (f", the run {timeplan.duration(r.time['run_s'])}"
                                                              if r.time["steps"] else ""))
    return f"grpo-lab {job_dir.name}: " + "; ".join(parts) + f": {job_dir}/plan.json"


def fit_command(args: list[str] | None) -> str:
    """`make fit ARGS="..."` with the user's own arguments (the fit search of grpo_lab/checks/fit.py on the same
    command)."""
    if args is None:
        return 'make fit ARGS="<your overrides>"'
    joined = " ".join(shlex.quote(a) for a in args)
    if '"' in joined or "$" in joined or "`" in joined:
        return f"make fit ARGS={shlex.quote(joined)}"
    return f'make fit ARGS="{joined}"'


def _item(rule: str, message: str, label: str, fix: str, checked: str, caution: str = "") -> list[str]:
    """One problem (or missing thing): its line, what fixes it, what the re-check found, what the fix changes."""
    lines = [f"  [{rule}] {message}"]
    if fix:
        lines.append(f"      {label}: {fix}")
        if checked:
            lines.append(f"           ({checked})")
        lines += [f"      {line}" for line in caution.splitlines()]
    return lines


def _phases(m: dict[str, Any]) -> list[str]:
    """Each phase's peak against the card, and host RAM."""
    card, kv, h = m["card_gb"], m["kv_cache"], m["host_ram"]
    out = [f"Memory plan per GPU ({card:g} GB cards, {m['n_gpus']} GPU(s)): {m['verdict']['overall']}"]
    for phase in PHASES:
        ph = m["phases"][phase]
        what = (f"; KV cache {kv['tokens']} tokens ({kv['sequences']} sequences of {kv['sequence_length']})"
                if phase == "generation" else f"; {ph['peak_of']}" if ph.get("peak_of") else "")
        out.append(f"  {phase.replace('_', ' '):<12} {ph['peak_gb_per_gpu']:>8} GB  {ph['verdict']:<6} "
                   f"{ph['peak_gb_per_gpu'] / card:4.0%} of the card{what}")
    cap = h.get("capacity_gb")
    share = f"{h['total_gb'] / cap:4.0%} of {cap:g} GB" if cap else "capacity unknown"
    out.append(f"  {'host RAM':<12} {h['total_gb']:>8} GB  {h['verdict']:<6} {share}")
    return out


def _batch(b: dict[str, Any]) -> list[str]:
    dp = b["data_parallel_size"]
    out = ["Batch arithmetic",
           f"  {b['train_batch_size']} prompts x {b['rollout_n']} answers = {b['trajectories_per_step']} "
           f"trajectories per step ({_num(b['trajectories_per_gpu_per_step'])} per GPU over {dp} data-parallel GPUs)"]
    if b.get("ppo_mini_batch_size"):
        out.append(f"  mini-batch {b['ppo_mini_batch_size']} x {b['rollout_n']} = {b['mini_batch_trajectories']} "
                   f"trajectories -> {_num(b['updates_per_step'] or 0)} actor update(s) per step"
                   + (f" x {b['ppo_epochs']} epochs" if b.get("ppo_epochs", 1) != 1 else ""))
        out.append(f"  {b['mini_batch_trajectories']} / {dp} GPUs = {_num(b['trajectories_per_gpu'])} "
                   f"trajectories per GPU per mini-batch (algorithm sizes are global, micro-batch and token "
                   f"budgets are per GPU)")
    pad = b.get("padding")
    if pad and pad.get("samples"):
        out.append(f"  verl's V1 trainer pads each step with {pad['samples']} no-op samples to "
                   f"{pad['padded_trajectories']} (a multiple of {pad['multiple']}): {pad['fraction']:.0%} of the "
                   f"step is padding, {pad['updates_per_step']} actor update(s)")
    if b.get("token_budgets", {}).get("actor"):
        out.append(f"  actor token budget {b['token_budgets']['actor']} per micro-batch on each GPU; sequences up "
                   f"to {b['sequence_length']} tokens"
                   + (f"; up to {b['micro_batches_per_update_max']} micro-batches per update"
                      if b.get("micro_batches_per_update_max") else ""))
    if b.get("rollout_replicas"):
        out.append(f"  {b['rollout_replicas']} vLLM replica(s): {b['trajectories_per_replica']} trajectories each "
                   f"per step")
    if b.get("steps_per_epoch") is not None:
        out.append(f"  {b['train_rows']} train rows / {b['train_batch_size']} = {b['steps_per_epoch']} steps per "
                   f"epoch (last partial batch dropped) x {b['total_epochs']} epochs -> "
                   f"{b['total_training_steps']} steps")
    rc = b.get("ray_cpus")
    if rc:
        node = " per node" if rc.get("per_node") else ""
        have = rc["available"] if rc["available"] is not None else "not checked"
        out.append(f"  Ray CPUs{node}: {rc['needed']} needed, {have} available ({rc['source']})")
    return out


def _memory(m: dict[str, Any]) -> list[str]:
    size = f"{m['params_b']}B" if m["params"] >= 1e8 else f"{m['params'] / 1e6:.1f}M"
    out = [f"Memory plan per GPU ({m['card_gb']:g} GB cards, {m['n_gpus']} GPU(s), FSDP over {m['fsdp_size']}; "
           f"{size} params from {m['architecture_source']})"]
    if m.get("moe"):
        out.append(f"  mixture of experts: {m['moe']['num_experts']} experts, "
                   f"{m['moe']['num_experts_per_tok']} per token: all {m['params_b']}B parameters in the state "
                   f"and vLLM, {m['moe']['active_params_b']}B active for activations")
    out.append(f"  actor state {m['actor_state_gb_per_gpu']} GB per GPU (16 B per trained parameter / "
               f"{m['fsdp_size']}, minus offloaded)")
    out.append(f"  {'phase':<12} {'peak GB':>8}  {'verdict':<7}  what")
    for phase in PHASES:
        ph = m["phases"][phase]
        parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ph["components_gb"].items() if v)
        if phase == "training":
            parts = f"{ph['peak_of']}: {parts}"
        out.append(f"  {phase.replace('_', ' '):<12} {ph['peak_gb_per_gpu']:>8}  {ph['verdict']:<7}  {parts}")
    ta = m.get("trainer_allocator")
    if ta:
        out.append(f"  trainer's torch allocator peak {ta['peak_gb']} GB ({ta['peak_of']}): what verl will log as "
                   f"actor/perf/max_memory_allocated_gb (in GiB)")
    kv = m["kv_cache"]
    waves = kv["waves"] if kv["waves"] is not None else "-"
    out.append(f"  KV cache {kv['kv_cache_gb']} GB = {kv['tokens']} tokens = {kv['sequences']} sequences of "
               f"{kv['sequence_length']}; {kv['trajectories_per_replica']} trajectories per replica -> {waves} "
               f"wave(s); max_model_len {kv['max_model_len']}")
    h = m["host_ram"]
    cap = f" of {h['capacity_gb']:g} GB" if h.get("capacity_gb") else ""
    out.append(f"  host RAM{' per node' if h.get('per_node') else ''} {h['total_gb']} GB{cap}: {h['verdict']}")
    out.append(f"  overall: {m['verdict']['overall']}")
    out.extend(f"  plan vs recorded runs: {line}" for line in m.get("accuracy") or ())
    for phase, opts in (m.get("remedies") or {}).items():
        if opts:
            out.append(f"  remedies for {phase.replace('_', ' ')}:")
            out += [f"    {o['override']}  -> {o['peak_gb_per_gpu']} GB {o['verdict']}" for o in opts]
    return out


def _time(t: dict[str, Any], verbose: bool) -> list[str]:
    ph, a = t["phases_s"], t["assumed"]
    out = [f"Time plan ({t['card']['name']}: {t['card']['scaled'] or 'measured on this card'})",
           f"  steady step {t['step_s']:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in ph.items())]
    if t.get("sharing"):
        sh = t["sharing"]
        out.append(f"  shared by {sh['jobs_on_card']} jobs at once on the card (hydra/launcher=side_by_side): steps "
                   f"and validations x{sh['factor']:g} of alone ({sh['source']})")
    validations = f", {t['validations']} validation(s) of {t['validation_s']:.0f} s" if t["validations"] else ""
    if not verbose:
        run = (f"{t['steps']} steps -> {timeplan.duration(t['run_s'])}" if t["steps"] else "steps unknown")
        return out + [f"  run: {run} (start-up {timeplan.duration(t['startup_s'])}, first step "
                      f"{t['first_step_s']:.0f} s{validations})"]
    out.append(f"  first step {t['first_step_s']:.0f} s (warm-up), start-up {timeplan.duration(t['startup_s'])}"
               + validations)
    if t["steps"]:
        out.append(f"  run: {t['steps']} steps -> {timeplan.duration(t['run_s'])} (start-up, first step, "
                   f"{t['steps'] - 1} x step, validations)")
    else:
        out.append("  run: steps unknown (no train file here and no trainer.total_training_steps): step times only")
    out.append(f"  assumed: prompts of {a['prompt_tokens']:g} tokens ({a['prompt_source']}), every answer "
               f"{a['response_tokens']} tokens (the limit: an upper bound), {a['tokens_per_gpu_per_step']} tokens per "
               f"GPU per step" + ("; verl's per-token log-prob loop (no flash-attn, use_fused_kernels off)"
                                  if a["per_token_log_prob_loop"] else ""))
    acc = t.get("accuracy") or {}
    if acc:
        out.append(f"  plan vs recorded runs: steady step {acc['step_ratio_min']:.2f}-{acc['step_ratio_max']:.2f} of "
                   f"measured on {acc['runs']} solo run(s) at their own lengths ({timeplan.TABLE_MD})")
    if t["not_measured"]:
        out += [f"  not measured: {m}" for m in t["not_measured"]]
        out.append("  (how each term is modelled: docs/time_plan.md)")
    return out
