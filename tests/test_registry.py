"""grpo_lab/registry.py, the one shape of the preflight's rules and the doctor's signatures: what it refuses at
registration, the memory rules chosen by kind (as fit.py listed them by hand), and the doctor's match order.

(The checks that every rule id and every signature id is tested are in tests/test_preflight_rules.py and
tests/test_doctor.py; this file names ids, so it is not counted there.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpo_lab.checks.rules import RULES, ids, memory_ids
from grpo_lab.registry import PHASES, Entry, Registry


def fresh() -> Registry[Entry]:
    return Registry("rule", {"batch": "batches", "memory": "memory"}, "RULE_KINDS in somewhere.py")


def test_a_registry_keeps_the_order_and_chooses_by_kind():
    r = fresh()
    for i, k in (("b", "memory"), ("a", "batch"), ("c", "memory")):
        r.add(Entry(i, k, "update"))
    assert list(r) == r.ids() == ["b", "a", "c"]
    assert r.ids("memory") == ["b", "c"] and r.kind_of("a") == "batch" and r.kind_of("zzz") is None


@pytest.mark.parametrize("entry, says", [
    (Entry("x", "batch", "update"), "rule 'x' is registered twice"),
    (Entry("y", "memroy", "update"),
     "rule 'y': kind 'memroy' is not one of batch, memory (RULE_KINDS in somewhere.py)"),
    (Entry("y", "batch", "training"), "rule 'y': phase 'training' is not one of compose, preflight, start-up"),
    (Entry("Bad-id", "batch", "update"), "rule id 'Bad-id': use lower-case letters, digits and underscores"),
])
def test_a_registry_refuses_what_no_list_would_find(entry, says):
    r = fresh()
    r.add(Entry("x", "batch", "update"))
    with pytest.raises(ValueError) as e:
        r.add(entry)
    assert says in str(e.value)
    assert r.ids() == ["x"]
    with pytest.raises(ValueError, match="kind 'memroy' is not one of batch, memory"):
        r.ids("memroy")


def test_the_memory_rules_are_the_hand_list_fit_had():
    """fit.py and the preflight choose the memory rules by kind: the kind holds exactly the ids fit.py once listed by
    hand (until issue 21), so no rule became fixable or unfixable by the change."""
    assert set(memory_ids()) == {
        "memory_generation", "memory_training", "memory_weight_sync", "memory_host_ram", "vllm_kv_cache",
        "full_finetune_too_big", "gpu_memory_utilization_range", "rollout_parallel"}
    assert len(memory_ids()) == 8 and memory_ids() == ids("memory")


def test_the_report_order_is_the_module_list():
    """The preflight reports its rules in one explicit order (RULE_MODULES, then each module's file order), not in
    the order its modules happened to be imported: every rule module is in the list, every rule in its place."""
    from grpo_lab.checks import rules

    in_folder = {f.stem for f in Path(rules.__file__).parent.glob("*.py")} - {"__init__"}
    assert sorted(rules.RULE_MODULES) == sorted(in_folder)
    modules = [RULES[r].fn.__module__.rpartition(".")[2] for r in ids()]
    assert set(modules) <= set(rules.RULE_MODULES) and len(ids()) == len(RULES)
    assert modules == sorted(modules, key=rules.RULE_MODULES.index)
    assert ids()[:3] == ["train_batch_vs_mini_batch", "updates_per_step_integer", "batch_divisibility"]


def test_a_rules_kind_is_its_own_not_its_modules():
    """A rule's kind is given with it, not taken from its module: the memory plan's fixes clear rollout_parallel
    (rules.batch) and gpu_memory_utilization_range (rules.setup), kind memory; rules.values holds the values' rules and
    the memory plan's (its notes on what it planned and a card of no size are kind plan, rollout_tp_heads setup);
    rules.late's keys verl never reads are config keys, kind setup."""
    from grpo_lab.checks import rules

    def module(r: str) -> str:
        return RULES[r].fn.__module__.rpartition(".")[2]

    kinds = {m: {RULES[r].kind for r in ids() if module(r) == m} for m in rules.RULE_MODULES}
    assert kinds == {"batch": {"batch", "memory"}, "setup": {"setup", "memory"},
                     "values": {"values", "memory", "plan", "setup"},
                     "late": {"setup", "emulation", "reward", "verl_issue"}}
    assert [r for r in ids() if RULES[r].kind == "memory" and module(r) != "values"] == [
        "rollout_parallel", "gpu_memory_utilization_range"]
    assert [r for r in ids() if RULES[r].kind == "setup" and module(r) not in ("setup",)] == [
        "rollout_tp_heads", "key_unread"]
    assert [RULES[f"memory_{p}"].phase for p in ("generation", "training", "weight_sync")] == [
        "rollout", "update", "weight sync"]
    assert {RULES[r].phase for r in ids()} <= set(PHASES)


def test_the_doctors_match_order_is_the_order_of_its_file():
    """diagnose() runs the matchers in registration order and keeps it for diagnoses on one line: the order of the
    `@signature` functions in signatures.py (read from its source, so a new signature needs no list here)."""
    from grpo_lab.after_run.doctor import signatures
    from grpo_lab.after_run.doctor.signatures import SIGNATURES, matchers

    tree = ast.parse(Path(signatures.__file__).read_text())
    in_file = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and getattr(d.func, "id", "") == "signature" for d in f.decorator_list)]
    assert len(in_file) >= 14 and [m.__name__ for m in matchers()] == in_file
    assert {s.phase for s in SIGNATURES.values()} <= set(PHASES)


def test_the_out_of_memory_kind_is_the_old_prefix_test():
    """The sweep summary's "OOM in ..." (doctor.failure_class) is chosen by kind now, no longer by id prefix; the kind
    holds the same ids the prefix test matched."""
    from grpo_lab.after_run import doctor
    from grpo_lab.after_run.doctor.signatures import SIGNATURES

    by_prefix = {s for s in SIGNATURES if s.startswith(("oom_", "vllm_kv")) or s == "vllm_startup_free_memory"}
    assert set(SIGNATURES.ids("gpu memory")) == by_prefix and len(by_prefix) == 5
    for s in SIGNATURES:
        d = doctor.Diagnosis(s, "t", "e", "r", phase="training")
        assert (doctor.failure_class([d]) == "OOM in training") == (s in by_prefix), s
