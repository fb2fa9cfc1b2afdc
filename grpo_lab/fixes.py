"""Fixes that fix: apply a printed fix's overrides to a copy of the config, run the rules again, keep what passes.

    checker = FixChecker(verl, lab, launching=False, environ={}, problems=first_run)
    checker.check(problem)      # rewrites problem.fix to the alternatives that pass; problem.checked says how
    checker.fix_all(errors)     # the overrides that clear every error together (re-checked), or None

A fix is one or more alternatives ("a=1 b=2  or  c=3"), each overrides as typed after `python run.py`. Applying one:
a short key (grpo_lab/knobs.py) sets every verl key that conf/config.yaml builds from it (`${ppo_mini_batch_size}`
...), `~key` deletes, `+key`/`++key` add; vLLM's max_model_len, derived from prompt + response, follows them unless it
was set apart. An alternative passes when its problem goes and no error appears that was not there. When it makes
new errors, their own fixes are added (at most 3 rounds, each re-checked); when nothing passes, the fix says so.
A config-group choice (model=..., hardware=...) or advice in words cannot be applied to a resolved config: it is
printed as it is and marked as not re-checked.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from grpo_lab.knobs import KNOBS, SHORT_KEYS
from grpo_lab.rules import ALT, Ctx, Problem, run_rules

ROOT = Path(__file__).resolve().parent.parent
MAX_ROUNDS = 3
GROUPS = frozenset(p.name for p in (ROOT / "conf").iterdir() if p.is_dir()) if (ROOT / "conf").is_dir() else frozenset()
_TOKEN = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w.\-@]*)(?:=(.*))?$", re.S)
MAX_MODEL_LEN = "actor_rollout_ref.rollout.max_model_len"
LENGTHS = ("data.max_prompt_length", "data.max_response_length")


@functools.lru_cache(maxsize=None)
def fed_by_short_key() -> dict[str, tuple[str, ...]]:
    """{short key: the verl keys conf/config.yaml sets to exactly `${short key}`} (+ the KNOBS table's verl key)."""
    out: dict[str, set[str]] = {k.key: {k.verl_key} for k in KNOBS}
    try:
        import yaml

        doc = yaml.load((ROOT / "conf" / "config.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except Exception:
        doc = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if path == "" and k in ("hydra", "defaults", "lab", "preflight"):
                    continue
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, str):
            m = re.fullmatch(r"\$\{(\w+)\}", node.strip())
            if m and m.group(1) in SHORT_KEYS and "." in path:
                out.setdefault(m.group(1), set()).add(path)

    walk(doc or {}, "")
    return {k: tuple(sorted(v)) for k, v in out.items()}


def parse_value(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("null", "~", "none"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def parse(alternative: str) -> list[tuple[str, str, Any]] | None:
    """[(op, key, value)] of one alternative; None when it is not all overrides (words, a config-group choice)."""
    try:
        tokens = shlex.split(alternative)
    except ValueError:
        return None
    out = []
    for tok in tokens:
        m = _TOKEN.match(tok)
        if not m:
            return None
        op, key, value = m.group(1) or "", m.group(2), m.group(3)
        if key.split(".")[0] in GROUPS and "." not in key:
            return None  # a config group: only Hydra can apply it
        if value is None and op != "~":
            return None
        out.append((op, key, parse_value(value) if value is not None else None))
    return out or None


def _copy(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_copy(v) for v in x]
    return x


def _put(d: dict, dotted: str, value: Any, delete: bool = False) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = d[p] = {}
        d = nxt
    if delete:
        d.pop(parts[-1], None)
    else:
        d[parts[-1]] = value


def _get(d: Mapping, dotted: str) -> Any:
    for p in dotted.split("."):
        if not isinstance(d, Mapping) or p not in d:
            return None
        d = d[p]
    return d


def apply(verl: Mapping, lab: Mapping, overrides: list[tuple[str, str, Any]]) -> tuple[dict, dict]:
    """Copies of (verl, lab) with the overrides applied and derived values derived again."""
    v, lb = _copy(verl), _copy(lab)
    touched: set[str] = set()
    fed = fed_by_short_key()
    for op, key, value in overrides:
        if key in fed:
            targets = [(v, k) for k in fed[key]]
        elif key.startswith("preflight."):
            targets = [(lb, key)]
        elif key.startswith("lab."):
            targets = [(lb, key[4:])]
        else:
            targets = [(v, key)]
        for d, k in targets:
            _put(d, k, value, delete=op == "~")
            touched.add(k)
    mml, old = _get(verl, MAX_MODEL_LEN), [_get(verl, k) for k in LENGTHS]
    if MAX_MODEL_LEN not in touched and touched & set(LENGTHS) and all(isinstance(x, int) for x in old) \
            and mml == sum(old):
        new = [_get(v, k) for k in LENGTHS]
        if all(isinstance(x, int) for x in new):
            _put(v, MAX_MODEL_LEN, sum(new))  # conf/config.yaml: max_model_len = prompt + response
    return v, lb


def merge(*alternatives: list[tuple[str, str, Any]]) -> list[tuple[str, str, Any]]:
    """Overrides of several alternatives, one per key (the later wins)."""
    out: dict[str, tuple[str, str, Any]] = {}
    for alt in alternatives:
        for o in alt:
            out[o[1]] = o
    return list(out.values())


def text(overrides: list[tuple[str, str, Any]]) -> str:
    from grpo_lab.rules.setup import override_value

    out = []
    for op, key, value in overrides:
        if op == "~":
            out.append(f"~{key}")
            continue
        s = override_value(value)
        if isinstance(value, str) and (value == "" or re.search(r"[\s'\"=,]", value) or
                                       parse_value(value) != value):
            s = '"' + value.replace('"', '\\"') + '"'
            out.append(shlex.quote(f"{op}{key}={s}"))
            continue
        out.append(f"{op}{key}={s}")
    return " ".join(out)


class FixChecker:
    def __init__(self, verl: Mapping, lab: Mapping, *, launching: bool, environ: Mapping[str, str],
                 problems: list[Problem]) -> None:
        self.verl, self.lab, self.launching, self.environ = verl, lab, launching, environ
        self.before = Counter(p.rule for p in problems if p.level == "error")
        self._memo: dict[tuple, list[Problem]] = {}
        self.runs = 0

    def evaluate(self, overrides: list[tuple[str, str, Any]], quick: bool = True) -> list[Problem]:
        key = (tuple((o, k, repr(v)) for o, k, v in overrides), quick)
        if key not in self._memo:
            v, lb = apply(self.verl, self.lab, overrides)
            self.runs += 1
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

    def settle(self, p: Problem, overrides: list[tuple[str, str, Any]]
               ) -> tuple[list[tuple[str, str, Any]] | None, list[Problem]]:
        """The overrides (grown by the fixes of what they cause) that clear p without new errors, or (None, why)."""
        cur = overrides
        for _ in range(MAX_ROUNDS):
            bad = self._verdict(p, self.evaluate(cur))
            if not bad:
                return cur, []
            full = self.evaluate(cur, quick=False)
            added = []
            for q in full:
                if q.level == "error" and any(b.rule == q.rule for b in bad):
                    for alt in q.alternatives:
                        parsed = parse(alt)
                        if parsed and not any(k == o[1] for o in cur for _, k, _ in parsed):
                            added.append(parsed)
                            break
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
            parsed = parse(alt)
            if parsed is None:
                unchecked.append(alt)
                continue
            good, bad = self.settle(p, parsed)
            if good is None:
                failures.append((alt, bad))
            else:
                t = text(good)
                if t not in kept:
                    kept.append(t)
        if kept:
            p.fix = ALT.join(kept + unchecked)
            p.checked = "re-checked: the preflight passes this rule with it" + (
                "; the words/config-group alternatives are not re-checked" if unchecked else "")
        elif unchecked:
            p.fix = ALT.join(unchecked)
            p.checked = "not re-checked (a config-group choice or advice in words)"
        elif failures:
            alt, bad = failures[0]
            why = "; ".join(f"[{q.rule}] {q.message[:160]}" for q in bad[:2])
            p.fix = (f"no single fix is known: {alt} still fails ({why}); change these values together so that "
                     f"every rule above holds")
            p.checked = "re-checked: no single fix passes"
        return p

    def fix_all(self, errors: list[Problem]) -> tuple[str, bool] | None:
        """The first passing alternative of every error, together, re-checked: (overrides, passes)."""
        parts = []
        for p in errors:
            for alt in p.alternatives:
                parsed = parse(alt)
                if parsed:
                    parts.append(parsed)
                    break
        if not parts:
            return None
        cur = merge(*parts)
        for _ in range(MAX_ROUNDS):
            errs = [q for q in self.evaluate(cur) if q.level == "error"]
            if not errs:
                return text(cur), True
            more = []
            for q in self.evaluate(cur, quick=False):
                if q.level != "error":
                    continue
                for alt in q.alternatives:
                    parsed = parse(alt)
                    if parsed:
                        more.append(parsed)
                        break
            if not more:
                break
            cur = merge(cur, *more)
        return text(cur), not [q for q in self.evaluate(cur) if q.level == "error"]
