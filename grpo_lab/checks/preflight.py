"""Preflight: refuse configs that will fail, explain the batch arithmetic and the memory plan, before Ray starts.

    from grpo_lab.checks.preflight import run_preflight
    run = Run.build(verl_cfg, lab_cfg, os.environ)                # grpo_lab/memory/run.py
    report = run_preflight(run, launching=True)
    print(report.format()); json.dump(report.to_json(), f)      # plan.json
    if not report.ok: sys.exit(1)
    report.not_ready = not_ready_here(run, plan_only=True)       # what this machine lacks

The rules, the fix re-check and why it is fast: docs/preflight.md. What this machine lacks to launch (its input files,
grpo_lab/checks/inputs.py; for a plan, the environment rules a launch runs as refusals, each fix re-checked) does not
refuse a plan: its verdict is then "plan OK; not ready to launch here: ..." (exit code 3, README); a launch refuses.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from grpo_lab.checks.fixes import FixChecker, gist, lora_rank_set
from grpo_lab.checks.inputs import INPUT_KEYS, missing_inputs
from grpo_lab.checks.rules import ALT, A, Ctx, Problem, ids, launching_only_ids, run_rules
from grpo_lab.checks.rules.batch import num as _num
from grpo_lab.checks.rules.setup import THINKING_MIN_RESPONSE  # noqa: F401 (re-exported)
from grpo_lab.facts import machine_cpus, parquet_num_rows, visible_gpus  # noqa: F401 (re-exported)
from grpo_lab.memory import calibration, timeplan
from grpo_lab.memory.run import Run

__all__ = ["Problem", "PreflightReport", "run_preflight", "rule_ids", "parquet_num_rows", "visible_gpus",
           "machine_cpus"]


def rule_ids() -> list[str]:
    return ids()


@dataclass
class NotReady:
    rule: str  # input_missing, or the environment rule's id
    message: str
    command: str = ""  # what makes this machine ready: the command that makes a file, or the fix (overrides)
    checked: str = ""  # for a fix: what re-running the rules on it found
    short: str = ""  # for the verdict line

    def to_json(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message, "command": self.command}
        if self.checked:
            out["checked"] = self.checked
        return out


@dataclass
class PreflightReport:
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    batch: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    time: dict[str, Any] = field(default_factory=dict)  # the time plan (grpo_lab/memory/timeplan.py)
    title: str = ""
    random_weights: str = ""  # the model folder's mark (grpo_lab.tasks.qwen3_random): "random weights: memory and ..."
    fix_all: str = ""  # the overrides that clear every error together ("" with one error or none, or when none do)
    fix_all_passes: bool = False
    fix_all_caution: str = ""  # the fix all switches to LoRA: the warning make fit gives
    launching: bool = True
    # what this machine lacks to launch it (not_ready_here; set by the launcher, None: not checked): refusals
    # when launching, the plan's "not ready to launch here" when planning
    not_ready: list[NotReady] | None = None
    # memory refused and no offered fix fits every phase (the plan's "fits": below 80% of the card), or the fixes of
    # several errors together leave one: why; then the report points at `make fit ARGS="<fit_args>"` (fit_args: the
    # user's own arguments, set by the launcher)
    no_fit: str = ""
    fit_args: list[str] | None = None

    @property
    def ok(self) -> bool:
        """Nothing refuses it (a plan that is not ready here is OK as a plan)."""
        return not self.errors and not (self.launching and self.not_ready)

    @property
    def ready(self) -> bool:
        """OK, and this machine has what it needs: the command would start."""
        return self.ok and not self.not_ready

    def to_json(self) -> dict[str, Any]:
        errors = [p.to_json() for p in self.errors]
        if self.launching:  # refusals: the doctor and the sweep summary read them here
            errors += [n.to_json() for n in self.not_ready or ()]
        out = {"batch": self.batch, "memory": self.memory, "time": self.time, "errors": errors,
               "warnings": [p.to_json() for p in self.warnings], "notes": list(self.notes)}
        if self.random_weights:
            out["random_weights"] = self.random_weights
        if self.not_ready is not None:
            out["ready_here"] = self.ready
        if self.not_ready:
            out["not_ready_here"] = [n.to_json() for n in self.not_ready]
        if self.fix_all:
            out["fix_all"] = {"overrides": self.fix_all, "passes": self.fix_all_passes}
            if self.fix_all_caution:
                out["fix_all"]["caution"] = self.fix_all_caution
        if self.no_fit:
            out["fit"] = {"why": self.no_fit, "command": fit_command(self.fit_args)}
        return out

    def format(self) -> str:
        return _format(self)


def run_preflight(run: Run, *, launching: bool, check_fixes: bool = True) -> PreflightReport:
    """Check a job's Run (grpo_lab/memory/run.py); collect every problem.

    launching=True: Ray is about to start here, so the environment checks run too (flash-attn importable, visible
    GPUs, the machine's CPUs when ray num_cpus is null); launching=False (preflight.only on any machine) skips
    them and says so in the notes. check_fixes=False prints the fixes as the rules made them (not re-checked).
    """
    c = Ctx.on(run, launching=launching)
    problems = run_rules(c)
    report = PreflightReport(launching=launching)
    name = (c.model.info or {}).get("name")
    report.title = f"{name or c.get(A + 'model.path', '?')} on {run.lab.hardware.name or '?'}, variant " \
                   f"{run.lab.variant or '?'}"
    report.random_weights = c.model.random_weights
    report.batch = c.batch
    report.memory = copy.deepcopy(dict(run.memory))
    report.time = dict(run.time)
    report.errors = [p for p in problems if p.level == "error"]
    report.warnings = [p for p in problems if p.level == "warn"]
    report.notes = [p.message for p in problems if p.level == "note"]
    if check_fixes:
        checker = FixChecker(run, launching=launching, problems=problems)
        for p in report.errors + report.warnings:
            checker.check(p)
            p.caution = _lora_caution(c, p.fix)
        for opts in (report.memory.get("remedies") or {}).values():  # in the spelling that wins, as the fixes
            for o in opts:
                o["override"] = checker.spelled(o["override"])
        tried = checker.fix_all(report.errors) if len(report.errors) > 1 else None
        if tried and tried[1]:  # printed only when the re-check passes every error
            report.fix_all, report.fix_all_passes = tried
            report.fix_all_caution = _lora_caution(c, tried[0])
        report.no_fit = _no_fit(checker, report, tried)
        if report.no_fit and report.fix_all:  # a "fix all" that leaves a phase tight or out of memory is no fix
            report.fix_all, report.fix_all_passes, report.fix_all_caution = "", False, ""
    return report


def not_ready_here(run: Run, *, plan_only: bool) -> list[NotReady]:
    """What this machine lacks to launch the job: missing inputs; with plan_only, the environment rules too (those a
    launch runs as refusals: flash-attn importable, visible GPUs), each with its fix re-checked."""
    inputs = {key: run.get(key) for key in INPUT_KEYS}
    out = [NotReady("input_missing", m.message, m.command, short=m.short())
           for m in missing_inputs(inputs, run.lab.dataset.name, run.lab.model, run.environ)]
    if not plan_only:
        return out
    c = Ctx.on(run, launching=True)
    problems = [p for p in run_rules(c, only=launching_only_ids()) if p.level == "error"]
    if any(p.fix for p in problems):
        # the fix is re-checked as a launch here would check it: every rule, with this machine's environment
        checker = FixChecker(run, launching=True, problems=run_rules(Ctx.on(run, launching=True)))
        for p in problems:
            checker.check(p)
    for p in problems:
        # advice to plan without launching is what this is already (visible_gpus with no GPU here)
        alts = [a for a in p.alternatives if "preflight.only" not in a]
        fix = ALT.join(alts) if alts else "launch it on the machine it is planned for"
        out.append(NotReady(p.rule, p.message, fix, p.checked if alts else "", short=f"[{p.rule}]"))
    return out


def _lora_caution(c: Ctx, fix: str) -> str:
    """The warning make fit gives over a LoRA command, for a fix that switches this config to LoRA ("" otherwise)."""
    from grpo_lab.checks.fit_text import lora_banner, lora_words

    rank = lora_rank_set(fix, c.verl)
    if not rank:
        return ""
    arch = c.model.arch
    words = lora_words(arch, rank, c.get(A + "model.target_modules", "all-linear")) if arch else ""
    return lora_banner("fix") + (f"\nLoRA: {words}" if words else "")  # make fit's banner, and its words for LoRA


def _no_fit(checker: FixChecker, report: PreflightReport, tried: tuple[str, bool] | None) -> str:
    """Why make fit is the way on: the fixes of several errors together leave an error (`tried`: the fix all and
    whether it passed); with memory errors, the offered fix (`fix all`, or the one error's fix) leaves a phase of
    the memory plan not fitting (a memory rule left, even a tight warning: make fit's "fits"). "" when neither."""
    from grpo_lab.checks.rules import memory_ids
    from grpo_lab.cli.apply import parse

    if tried and not tried[1]:
        left = [q for q in checker.evaluate(parse(tried[0]) or []) if q.level == "error"][:1]
        return (f"with all of them ({tried[0]}) the preflight still says: "
                + "".join(f"[{q.rule}] {gist(q.message)}" for q in left))
    memory_rules = set(memory_ids())
    if not any(p.rule in memory_rules for p in report.errors):
        return ""
    if len(report.errors) > 1:
        offered, what = (report.fix_all if report.fix_all_passes else ""), "with the fixes above together"
    else:
        p = report.errors[0]
        offered = p.alternatives[0] if p.fix and p.checked.startswith("re-checked: the preflight passes") else ""
        what = "with the fix above"
    parsed = parse(offered) if offered else None
    if not parsed:
        return "no set of overrides above clears them"
    left = [q for q in checker.evaluate(parsed) if q.rule in memory_rules and q.level != "note"]
    if not left:
        return ""
    return f"{what} ({offered}) the memory plan still says: [{left[0].rule}] {gist(left[0].message)}"


def fit_command(args: list[str] | None) -> str:
    """`make fit ARGS="..."` with the user's own arguments (the fit search of grpo_lab/checks/fit.py on the same
    command)."""
    import shlex

    if args is None:
        return 'make fit ARGS="<your overrides>"'
    joined = " ".join(shlex.quote(a) for a in args)
    if '"' in joined or "$" in joined or "`" in joined:
        return f"make fit ARGS={shlex.quote(joined)}"
    return f'make fit ARGS="{joined}"'


# ---------------------------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------------------------

def _item(rule: str, message: str, label: str, fix: str, checked: str, caution: str = "") -> list[str]:
    """One problem (or missing thing) of the report: its line, what fixes it, what the re-check found, and what the
    fix changes besides numbers."""
    lines = [f"  [{rule}] {message}"]
    if fix:
        lines.append(f"      {label}: {fix}")
        if checked:
            lines.append(f"           ({checked})")
        lines += [f"      {line}" for line in caution.splitlines()]
    return lines


def _format_time(t: dict[str, Any]) -> list[str]:
    if not t:
        return []
    ph, a = t["phases_s"], t["assumed"]
    card = t["card"]["scaled"] or "measured on this card"
    out = ["", f"Time plan ({t['card']['name']}: {card})",
           f"  steady step {t['step_s']:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in ph.items()),
           f"  first step {t['first_step_s']:.0f} s (warm-up), start-up {timeplan.duration(t['startup_s'])}"
           + (f", {t['validations']} validation(s) of {t['validation_s']:.0f} s" if t["validations"] else "")]
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


def _format(r: PreflightReport) -> str:
    out = [f"grpo-lab preflight: {r.title}" if r.title else "grpo-lab preflight"]
    if r.random_weights:
        out.append(f"  {r.random_weights}")
    b = r.batch
    if b.get("train_batch_size"):
        out.append("")
        out.append("Batch arithmetic")
        dp = b["data_parallel_size"]
        out.append(f"  {b['train_batch_size']} prompts x {b['rollout_n']} answers = {b['trajectories_per_step']} "
                   f"trajectories per step ({_num(b['trajectories_per_gpu_per_step'])} per GPU over {dp} "
                   f"data-parallel GPUs)")
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
    m = r.memory
    if m.get("phases"):
        out.append("")
        size = f"{m['params_b']}B" if m["params"] >= 1e8 else f"{m['params'] / 1e6:.1f}M"
        out.append(f"Memory plan per GPU ({m['card_gb']:g} GB cards, {m['n_gpus']} GPU(s), FSDP over {m['fsdp_size']}; "
                   f"{size} params from {m['architecture_source']})")
        if m.get("moe"):
            out.append(f"  mixture of experts: {m['moe']['num_experts']} experts, "
                       f"{m['moe']['num_experts_per_tok']} per token: all {m['params_b']}B parameters in the state "
                       f"and vLLM, {m['moe']['active_params_b']}B active for activations")
        out.append(f"  actor state {m['actor_state_gb_per_gpu']} GB per GPU (16 B per trained parameter / "
                   f"{m['fsdp_size']}, minus offloaded)")
        out.append(f"  {'phase':<12} {'peak GB':>8}  {'verdict':<7}  what")
        for phase in ("generation", "training", "weight_sync"):
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
        regime = ((m.get("calibration") or {}).get("training") or {}).get("regime")
        if regime:
            out.extend(f"  plan vs recorded runs: {line}" for line in calibration.accuracy_lines(regime))
        for phase, opts in (m.get("remedies") or {}).items():
            if opts:
                out.append(f"  remedies for {phase.replace('_', ' ')}:")
                for o in opts:
                    out.append(f"    {o['override']}  -> {o['peak_gb_per_gpu']} GB {o['verdict']}")
    out += _format_time(r.time)
    for title, items in (("Errors", r.errors), ("Warnings", r.warnings)):
        if items:
            out.append("")
            out.append(f"{title} ({len(items)})")
            for p in items:
                out.extend(_item(p.rule, p.message, "fix", p.fix, p.checked, p.caution))
    if r.notes:
        out.append("")
        out.append("Notes")
        out.extend(f"  - {n}" for n in r.notes)
    if r.fix_all:  # set only when it passes (run_preflight)
        out.append("")
        out.append(f"Fix all {len(r.errors)} errors together: {r.fix_all}")
        out.append("  (re-checked: the preflight passes with all of them)")
        out += [f"  {line}" for line in r.fix_all_caution.splitlines()]
    if r.not_ready:
        out.append("")
        out.append(f"Not ready to launch here ({len(r.not_ready)})")
        for n in r.not_ready:
            verb = "make it" if n.rule == "input_missing" else "fix"
            out.extend(_item(n.rule, n.message, verb, n.command, n.checked))
    if r.no_fit:
        from grpo_lab.checks.rules import memory_ids

        out.append("")
        memory = any(p.rule in memory_ids() for p in r.errors)
        out.append(f"No fix above {'makes every phase fit' if memory else 'clears every error together'}: {r.no_fit}")
        out.append(f"  Search settings that {'do' if memory else 'fit every phase'} (every phase below 80% of the "
                   f"card, re-checked): {fit_command(r.fit_args)}")
    out.append("")
    if not r.ok:
        missing = f", {len(r.not_ready)} missing here" if r.launching and r.not_ready else ""
        out.append(f"preflight: REFUSED ({len(r.errors)} error(s){missing})")
    elif r.not_ready:
        out.append("preflight: plan OK; not ready to launch here: " + "; ".join(n.short for n in r.not_ready))
    else:
        out.append("preflight: OK")
    return "\n".join(out)
