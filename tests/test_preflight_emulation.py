"""The preflight's emulation rules (grpo_lab/checks/rules/late.py) on composed configs; through run.py:
tests/test_emulate.py."""

from __future__ import annotations

from conftest import composed

from grpo_lab.checks.preflight import run_preflight
from grpo_lab.memory import emulate
from grpo_lab.memory.run import Run

EMU = "hardware=h200x4_as_rtx4080x4"


def _rules(r, rule):
    return [p for p in r.errors + r.warnings if p.rule == rule]


def test_emulation_says_what_vllm_and_torch_get():
    r = run_preflight(Run.build(*composed(EMU), {}), launching=False, check_fixes=False)
    (text,) = [n for n in r.notes if n.startswith("EMULATED")]
    assert "rollout.gpu_memory_utilization 0.4 of 32 GB = 12.80 GB -> 0.091559 of 139.8 GB" in text
    assert "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.228898 = 32.00 GB per process" in text
    assert r.memory["card_gb"] == 32 and not _rules(r, "emulation")
    # without emulation the rule is silent
    r = run_preflight(Run.build(*composed("hardware=rtx4080x4"), {}), launching=False, check_fixes=False)
    assert not [n for n in r.notes if "EMULATED" in n]


def test_emulation_refuses_a_bigger_card_than_the_real_one():
    verl, lab = composed(EMU)
    lab.hardware.emulate.real_gpu_memory_gb = 24
    r = run_preflight(Run.build(verl, lab, {}), launching=False, check_fixes=False)
    (e,) = _rules(r, "emulation")
    assert "cannot emulate a 32 GB card on 24 GB cards" in e.message


def test_emulation_torch_refuses_a_torch_without_the_key(monkeypatch):
    verl, lab = composed(EMU)
    monkeypatch.setattr(emulate, "torch_knows_fraction_key", lambda: False)
    r = run_preflight(Run.build(verl, lab, {}), launching=True, check_fixes=False)
    (e,) = _rules(r, "emulation_torch")
    assert "does not know that key" in e.message and "lab.hardware.emulate.real_gpu_memory_gb=null" in e.message
    monkeypatch.setattr(emulate, "torch_knows_fraction_key", lambda: True)
    assert not _rules(run_preflight(Run.build(verl, lab, {}), launching=True, check_fixes=False), "emulation_torch")
    monkeypatch.setattr(emulate, "torch_knows_fraction_key", lambda: None)  # a CPU build: said, not refused
    r = run_preflight(Run.build(verl, lab, {}), launching=True, check_fixes=False)
    assert not _rules(r, "emulation_torch") and any("was not checked" in n for n in r.notes)
