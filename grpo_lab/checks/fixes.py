"""Fixes that fix: apply a printed fix's overrides to a copy of the config, run the rules again, keep what passes.

    checker = FixChecker(verl, lab, launching=False, environ={}, problems=first_run)
    checker.check(problem)      # rewrites problem.fix to the alternatives that pass; problem.checked says how
    checker.fix_all(errors)     # the overrides that clear every error together (re-checked), or None

How a fix is applied, re-checked and spelled: docs/preflight.md.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from grpo_lab.checks.rules import ALT, Ctx, Problem, run_rules
from grpo_lab.cli.apply import Change, apply_overrides, parse, text
from grpo_lab.cli.knobs import SHORT_KEYS, short_key_targets
from grpo_lab.memory.run import Run
from grpo_lab.memory.settings import as_int
from grpo_lab.memory.verl_view import VerlView
from grpo_lab.verl_keys import MISSING, lookup

MAX_ROUNDS = 3


apply = apply_overrides  # copies of (verl, lab) with the overrides applied, derived values derived again


def merge(*alternatives: list[Change]) -> list[Change]:
    """Changes of several alternatives, one per key (the later wins)."""
    return list({c.key: c for alt in alternatives for c in alt}.values())


def respell(changes: list[Change], apart: Mapping[str, Iterable[str]]) -> list[Change]:
    """Changes in the spelling that wins where `apart` (set_apart) keys no longer follow their short key."""
    if not apart:
        return changes
    out: dict[str, Change] = {}
    for c in changes:
        keys = list(apart.get(c.key) or ()) if c.op == "" and c.key in SHORT_KEYS else []
        if not keys or any(t not in keys for t in short_key_targets(c.key)):
            out[c.key] = c
        for k in keys:
            out[k] = replace(c, key=k)
    return list(out.values())


def gist(message: str) -> str:
    """A message's first sentence, whole (its parentheses closed): what a fix's verdict quotes of another problem."""
    depth = 0
    for i, ch in enumerate(message):
        depth += (ch == "(") - (ch == ")")
        if ch == "." and depth == 0 and re.match(r"\s+[A-Z]", message[i + 1:]):
            return message[:i + 1]
    return message


def lora_rank_set(fix: str, cfg: VerlView) -> int:
    """The LoRA rank an alternative of `fix` sets where the config trains the whole model; 0 when none does."""
    key = "actor_rollout_ref.model.lora_rank"
    if as_int(cfg.model.lora_rank) > 0:
        return 0
    ranks = [c.value for alt in fix.split(ALT) for c in (parse(alt) or ()) if c.key == key]
    return next((int(v) for v in ranks if isinstance(v, int) and v > 0), 0)


def _first_appliable(problems: Iterable[Problem], parse_fn, taken: Iterable[Change] = ()) -> list[list[Change]]:
    """Of each problem, its first alternative that is overrides (not words, not a config-group choice) and sets no
    key of `taken`, parsed."""
    keys = {c.key for c in taken}
    out = []
    for p in problems:
        parsed = next((x for x in map(parse_fn, p.alternatives) if x and not any(c.key in keys for c in x)), None)
        if parsed:
            out.append(parsed)
    return out


class FixChecker:
    def __init__(self, run: Run, *, launching: bool, problems: list[Problem]) -> None:
        self.verl, self.lab, self.launching, self.environ = run.verl, run.lab, launching, run.environ
        self.before = Counter(p.rule for p in problems if p.level == "error")
        self.apart = run.lab.set_apart
        self._memo: dict[tuple, list[Problem]] = {}

    def parse(self, alt: str) -> list[Change] | None:
        """One alternative's overrides, in the spelling that wins in this config (module docstring)."""
        parsed = parse(alt)
        if not parsed:
            return parsed
        # a key the config already has (the user's own `+key`): Hydra's `+` cannot add it again, `++` sets it
        parsed = [replace(c, op="++") if c.op == "+" and lookup(self.verl, c.key) is not MISSING else c for c in parsed]
        return respell(parsed, self.apart)

    def spelled(self, alt: str) -> str:
        """An override text (a memory remedy) in the spelling that wins; words are left as they are."""
        parsed = self.parse(alt) if self.apart else None
        return text(parsed) if parsed else alt

    def evaluate(self, overrides: list[Change], quick: bool = True) -> list[Problem]:
        key = (tuple((c.op, c.key, repr(c.value)) for c in overrides), quick)
        if key not in self._memo:
            v, lb = apply(self.verl, self.lab, overrides)
            self._memo[key] = run_rules(Ctx.of(v, lb, launching=self.launching, environ=self.environ, quick=quick))
        return self._memo[key]

    def _verdict(self, p: Problem, after: list[Problem]) -> list[Problem]:
        """The errors the alternative leaves that it should not: new ones, and p itself when it is still there."""
        errs = [q for q in after if q.level == "error"]
        count = Counter(q.rule for q in errs)
        bad = [q for q in errs if q.rule != p.rule and count[q.rule] > self.before.get(q.rule, 0)]
        mine_before = self.before.get(p.rule, 0) if p.level == "error" else 0
        still = [q for q in after if q.rule == p.rule and q.level == p.level]
        if p.level == "error" and count[p.rule] >= mine_before:
            bad += [q for q in errs if q.rule == p.rule][:1]
        elif p.level != "error" and len(still) >= 1 and still[0].message == p.message:
            bad += still[:1]
        return bad

    def settle(self, p: Problem, cur: list[Change]) -> tuple[list[Change] | None, list[Problem]]:
        """The overrides (grown by the fixes of what they cause) that clear p without new errors, or (None, why)."""
        for _ in range(MAX_ROUNDS):
            bad = self._verdict(p, self.evaluate(cur))
            if not bad:
                return cur, []
            rules = {b.rule for b in bad}
            full = self.evaluate(cur, quick=False)
            added = _first_appliable((q for q in full if q.level == "error" and q.rule in rules), self.parse, cur)
            if not added:
                return None, bad
            cur = merge(cur, *added)
        bad = self._verdict(p, self.evaluate(cur))
        return (cur, []) if not bad else (None, bad)

    def check(self, p: Problem) -> Problem:
        if not p.fix:
            return p
        kept, unchecked, failures = [], [], []
        for alt in p.alternatives:
            parsed = self.parse(alt)
            if parsed is None:
                unchecked.append(alt)
                continue
            good, bad = self.settle(p, parsed)
            if good is None:
                failures.append((text(parsed), bad))
            elif text(good) not in kept:
                kept.append(text(good))
        if kept:
            p.fix = ALT.join(kept + unchecked)
            p.checked = "re-checked: the preflight passes this rule with it" + (
                "; the words/config-group alternatives are not re-checked" if unchecked else "")
        elif unchecked:
            p.fix = ALT.join(unchecked)
            p.checked = "not re-checked (a config-group choice or advice in words)"
        elif failures:
            alt, bad = failures[0]
            why = "; ".join(f"[{q.rule}] {gist(q.message)}" for q in bad[:2])
            p.fix = (f"no single fix is known: {alt} still fails ({why}); change these values together so that "
                     f"every rule above holds")
            p.checked = "re-checked: no single fix passes"
        return p

    def fix_all(self, errors: list[Problem]) -> tuple[str, bool] | None:
        """The first passing alternative of every error, together, re-checked: (overrides, passes)."""
        parts = _first_appliable(errors, self.parse)
        if not parts:
            return None
        cur = merge(*parts)
        for _ in range(MAX_ROUNDS):
            errs = [q for q in self.evaluate(cur) if q.level == "error"]
            if not errs:
                return text(cur), True
            more = _first_appliable((q for q in self.evaluate(cur, quick=False) if q.level == "error"), self.parse)
            if not more:
                break
            cur = merge(cur, *more)
        return text(cur), not [q for q in self.evaluate(cur) if q.level == "error"]
