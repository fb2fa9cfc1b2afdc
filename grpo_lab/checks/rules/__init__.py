"""The preflight's rules: one function per rule id, registered with `@rule("id", kind=..., phase=...)`, run over one
read-only context.

    @rule("batch_divisibility", kind="batch", phase="update")
    def batch_divisibility(c: Ctx) -> Iterable[Problem]:
        if ...: yield error("what is wrong, with the numbers", "the_override=that_fixes_it")

The rule modules: rules.batch (arithmetic of batches, tokens, data), rules.setup (Ray, keys, recipes, the model, the
machine), rules.values (values verl takes but cannot use, and the memory plan's verdicts), rules.late (what verl
finds out late or never: keys it never reads, docs/verl_unread_keys.md; an emulated card; the custom reward file,
imported and called as verl will in a child process, grpo_lab/checks/reward_probe.py; configurations verl's issue
tracker reported failing late, docs/verl_issues.md).

What a rule reads and yields, fixes, kinds and phases: docs/preflight.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from grpo_lab.labconf import Lab
from grpo_lab.memory.planned_model import PlannedModel
from grpo_lab.memory.run import Run
from grpo_lab.memory.verl_view import VerlView
from grpo_lab.registry import Entry, Registry
from grpo_lab.verl_keys import A  # noqa: F401 (A: for the rule modules)

ALT = "  or  "  # between the alternatives of one fix


@dataclass
class Problem:
    """One thing wrong: its rule id, what is wrong with the numbers, and the override(s) that fix it."""

    rule: str
    message: str
    fix: str = ""
    level: str = "error"  # error | warn | oom | note
    checked: str = ""  # what re-running the rules on the fix found (grpo_lab.checks.fixes)
    caution: str = ""  # what the fix changes besides numbers: a switch to LoRA (grpo_lab.checks.preflight)

    @property
    def alternatives(self) -> list[str]:
        return [a.strip() for a in self.fix.split(ALT) if a.strip()]

    def to_json(self) -> dict[str, str]:
        extra = {"checked": self.checked, "caution": self.caution}
        return {"rule": self.rule, "message": self.message, "fix": self.fix, **{k: v for k, v in extra.items() if v}}


# a rule's problems: error(message, fix=""), warn(...), oom(...) (error or warning: preflight.strict), note(message)
error = partial(Problem, "", level="error")
warn = partial(Problem, "", level="warn")
oom = partial(Problem, "", level="oom")
note = partial(Problem, "", fix="", level="note")


RuleFn = Callable[["Ctx"], Iterable[Problem]]


# what a rule can be about
RULE_KINDS = {
    "batch": "the arithmetic of batches, tokens and data (rules.batch)",
    "values": "values verl takes but cannot use (rules.values)",
    "setup": "Ray, config keys, recipes, the rollout engine, the machine (rules.setup)",
    "memory": "a phase that does not fit the cards or the host's RAM: what make fit (grpo_lab/checks/fit.py) is "
              "there to clear, and what the preflight's fix all must leave fitting",
    "plan": "which model the memory plan planned, and what it skipped (rules.values)",
    "reward": "the custom reward file, imported and called as verl will (rules.late)",
    "emulation": "a smaller card rehearsed on a bigger one (rules.late)",
    "verl_issue": "configurations verl's issue tracker reported failing late (rules.late)",
}


@dataclass(frozen=True)
class Rule(Entry):
    fn: RuleFn
    launching_only: bool = False


RULES: Registry[Rule] = Registry("rule", RULE_KINDS, "RULE_KINDS in grpo_lab/checks/rules/__init__.py")


def rule(rule_id: str, *, kind: str, phase: str, launching_only: bool = False) -> Callable[[RuleFn], RuleFn]:
    """Register a rule function under its id, kind and phase (ids are unique; the report's order: RULE_MODULES)."""
    return lambda fn: RULES.add(Rule(rule_id, kind, phase, fn, launching_only)).fn


@dataclass
class Ctx:
    """What every rule reads: the job's Run (grpo_lab/memory/run.py) and where it is checked."""

    run: Run
    launching: bool
    environ: Mapping[str, str]
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, verl: Mapping[str, Any], lab: Lab | None, *, launching: bool, environ: Mapping[str, str],
           quick: bool = False) -> Ctx:
        """A context on a Run built here (a fix's re-check: `quick`, the memory plan without its remedies)."""
        return cls.on(Run.build(verl, lab, environ, quick=quick), launching=launching)

    @classmethod
    def on(cls, run: Run, *, launching: bool) -> Ctx:
        return cls(run, launching, run.environ, list(run.notes))

    @property
    def verl(self) -> Mapping[str, Any]:
        return self.run.verl

    @property
    def cfg(self) -> VerlView:
        return self.run.cfg

    @property
    def lab(self) -> Lab:
        return self.run.lab

    @property
    def model(self) -> PlannedModel:
        return self.run.model

    @property
    def plan(self) -> Mapping[str, Any]:
        return self.run.memory

    @cached_property
    def batch(self) -> dict[str, Any]:
        """The Run's batch arithmetic, with what the rules add for the report (token budgets, Ray's CPUs)."""
        return dict(self.run.batch)


# the rule modules in the preflight's report order (a module's rules in the order of its file)
RULE_MODULES = ("batch", "setup", "values", "late")


def _load() -> None:
    # the rule modules register themselves when imported, whoever imports one first: RULES complete, in report order
    for name in RULE_MODULES:
        importlib.import_module(f"{__name__}.{name}")
    RULES.sort(lambda r: RULE_MODULES.index(r.fn.__module__.rpartition(".")[2]))


def run_rules(c: Ctx, only: Iterable[str] | None = None) -> list[Problem]:
    """Every rule (or those named) on this context; a rule that fails is reported as a note, never raised."""
    _load()
    wanted = set(only) if only is not None else None
    strict = bool(c.lab.preflight.strict)
    out: list[Problem] = []
    for r in RULES.values():
        if (wanted is not None and r.id not in wanted) or (r.launching_only and not c.launching):
            continue
        try:
            for p in r.fn(c) or ():
                p.rule = p.rule or r.id
                if p.level == "oom":
                    p.level = "error" if strict else "warn"
                    if strict:
                        p.message += " (preflight.strict=false makes this a warning)"
                out.append(p)
        except Exception as e:  # a check must never take the launcher down; say what was skipped
            out.append(Problem(r.id, f"{r.id}: check skipped after an internal error ({type(e).__name__}: {e})",
                               level="note"))
    return out


def ids(kind: str | None = None) -> list[str]:
    """Every rule id, or those of one kind (RULE_KINDS), in the report's order."""
    _load()
    return RULES.ids(kind)


def memory_ids() -> list[str]:
    """The memory rules (kind "memory"): what make fit clears, and what the preflight's fix all must leave fitting."""
    return ids("memory")


def launching_only_ids() -> list[str]:
    """The environment rules: run only where Ray is about to start (a plan runs them too: preflight.not_ready_here)."""
    _load()
    return [r.id for r in RULES.values() if r.launching_only]
