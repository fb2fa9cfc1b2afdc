"""Preflight: refuse configs that will fail, explain the batch arithmetic and the memory plan, before Ray starts.

    from grpo_lab.checks.preflight import run_preflight
    run = Run.build(verl_cfg, lab_cfg, os.environ)                # grpo_lab/memory/run.py
    report = run_preflight(run, launching=True)
    print(report.format()); json.dump(report.to_json(), f)      # plan.json
    if not report.ok: sys.exit(1)
    report.not_ready = not_ready_here(run, plan_only=True)       # what this machine lacks

The rules, the fix re-check and why it is fast: docs/preflight.md. What this machine lacks to launch (its input files,
grpo_lab/checks/inputs.py; for a plan, the environment rules a launch runs as refusals, each fix re-checked) does not
refuse a plan: its verdict is then "plan OK; not ready to launch here: ..." (exit code 3, docs/launch.md); a launch
refuses.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from grpo_lab.checks.fixes import FixChecker, gist, lora_rank_set
from grpo_lab.checks.inputs import missing_inputs
from grpo_lab.checks.plan_text import fit_command, report_text
from grpo_lab.checks.rules import ALT, Ctx, Problem, launching_only_ids, memory_ids, run_rules
from grpo_lab.cli.apply import parse
from grpo_lab.memory.run import Run


@dataclass
class NotReady:
    rule: str  # input_missing, or the environment rule's id
    message: str
    command: str = ""  # what makes this machine ready: the command that makes a file, or the fix (overrides)
    checked: str = ""  # for a fix: what re-running the rules on it found
    short: str = ""  # for the verdict line

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message, "command": self.command,
                **({"checked": self.checked} if self.checked else {})}


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
            out["fix_all"] = {"overrides": self.fix_all, "passes": self.fix_all_passes,
                              **({"caution": self.fix_all_caution} if self.fix_all_caution else {})}
        if self.no_fit:
            out["fit"] = {"why": self.no_fit, "command": fit_command(self.fit_args)}
        return out

    def format(self, verbose: bool = False) -> str:
        return report_text(self, verbose)


def run_preflight(run: Run, *, launching: bool, check_fixes: bool = True) -> PreflightReport:
    """Check a job's Run (grpo_lab/memory/run.py); collect every problem.

    launching=True: Ray is about to start here, so the environment checks run too (flash-attn importable, visible
    GPUs, the machine's CPUs when ray num_cpus is null); launching=False (preflight.only on any machine) skips
    them and says so in the notes. check_fixes=False prints the fixes as the rules made them (not re-checked).
    """
    c = Ctx.on(run, launching=launching)
    problems = run_rules(c)
    report = PreflightReport(launching=launching)
    name = c.model.info.get("name")
    report.title = f"{name or c.cfg.model.path or '?'} on {run.lab.hardware.name or '?'}, variant " \
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
    launch runs as refusals: flash-attn, the rollout engine and loggers importable, visible GPUs), each with its fix
    re-checked."""
    out = [NotReady("input_missing", m.message, m.command, short=m.short())
           for m in missing_inputs(run.cfg, run.lab.dataset.name, run.lab.model, run.environ)]
    if not plan_only:
        return out
    problems = [p for p in run_rules(Ctx.on(run, launching=True), only=launching_only_ids()) if p.level == "error"]
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

    rank = lora_rank_set(fix, c.cfg)
    if not rank:
        return ""
    arch = c.model.arch
    words = lora_words(arch, rank, c.cfg.model.target_modules) if arch else ""
    return lora_banner("fix") + (f"\nLoRA: {words}" if words else "")  # make fit's banner, and its words for LoRA


def _no_fit(checker: FixChecker, report: PreflightReport, tried: tuple[str, bool] | None) -> str:
    """Why make fit is the way on: the fixes of several errors together leave an error (`tried`: the fix all and
    whether it passed); with memory errors, the offered fix (`fix all`, or the one error's fix) leaves a phase of
    the memory plan not fitting (a memory rule left, even a tight warning: make fit's "fits"). "" when neither."""
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
    return f"{what} ({offered}) the memory plan still says: [{left[0].rule}] {gist(left[0].message)}" if left else ""
