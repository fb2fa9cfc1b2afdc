"""Ready to launch here? What this machine lacks for the run: its input files, and (for a plan) the environment.

    items = not_ready_here(verl, lab, os.environ, plan_only=True)
    report.not_ready = items           # the preflight report prints them and its verdict (grpo_lab/checks/preflight.py)

A plan (preflight.only=true, make plan) may be made on another machine than the one that runs it: what is not here
does not refuse the plan. Its verdict is then "plan OK; not ready to launch here: ..." (exit code 3, README), with
each missing thing named, and the command that starts the run (`next:`) is printed only when nothing is missing.
What is checked:
  - the input files (grpo_lab/checks/inputs.py): train/validation files, the model folder, a hub id when the hub is off;
    each with the command that makes it;
  - for a plan only: the environment rules that a launch runs as refusals (launching_only: flash-attn importable,
    visible GPUs), here as readiness, each with its fix re-checked (grpo_lab/checks/fixes.py).
A launch (no preflight.only) refuses on a missing input; the environment rules are part of its own preflight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from grpo_lab.checks.inputs import missing_inputs
from grpo_lab.labconf import Lab


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


def not_ready_here(verl: Mapping[str, Any], lab: Lab, environ: Mapping[str, str], *,
                   plan_only: bool) -> list[NotReady]:
    """What this machine lacks to launch the job: missing inputs; with plan_only, the environment rules too."""
    out = [NotReady("input_missing", m.message, m.command, short=m.short()) for m in missing_inputs(verl, lab, environ)]
    if plan_only:
        out += _environment(verl, lab, environ)
    return out


def _environment(verl: Mapping[str, Any], lab: Lab, environ: Mapping[str, str]) -> list[NotReady]:
    from grpo_lab.checks.fixes import FixChecker
    from grpo_lab.checks.rules import ALT, Ctx, launching_only_ids, run_rules

    problems = [p for p in run_rules(Ctx.of(verl, lab, launching=True, environ=environ), only=launching_only_ids())
                if p.level == "error"]
    if any(p.fix for p in problems):
        # the fix is re-checked as a launch here would check it: every rule, with this machine's environment
        every = run_rules(Ctx.of(verl, lab, launching=True, environ=environ, quick=True))
        checker = FixChecker(verl, lab, launching=True, environ=environ, problems=every)
        for p in problems:
            checker.check(p)
    out = []
    for p in problems:
        # advice to plan without launching is what this is already (visible_gpus with no GPU here)
        alts = [a for a in p.alternatives if "preflight.only" not in a]
        fix = ALT.join(alts) if alts else "launch it on the machine it is planned for"
        out.append(NotReady(p.rule, p.message, fix, p.checked if alts else "", short=f"[{p.rule}]"))
    return out
