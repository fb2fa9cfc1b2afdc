"""A change plans what its override does (grpo_lab/memory/settings.py settings_after): the settings the memory plan
and the fit plan with after a Change are those settings_from_verl reads from the config with that Change applied, as
the fix re-check and the fit's verify apply it (grpo_lab/cli/apply.py)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import composed

from grpo_lab.cli.apply import Change, apply_overrides, parse, text
from grpo_lab.memory import memplan
from grpo_lab.memory.memplan_remedies import candidates
from grpo_lab.memory.run import Run
from grpo_lab.memory.settings import FIELD_OF_KEY, settings_after, settings_from_verl


def _other(value):
    """A value of the same kind as `value` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1 if isinstance(value, int) else round(value / 2, 3)
    if value is None:
        return 7
    return "fsdp2" if value == "fsdp" else "q_proj"


@pytest.mark.parametrize("key", sorted(FIELD_OF_KEY))
def test_each_key_moves_its_field_as_the_config_reads_it(key):
    verl, lab = composed("model=qwen3_4b")
    s = settings_from_verl(verl, lab)
    change = Change(key, _other(getattr(s, FIELD_OF_KEY[key])))
    after = settings_after(s, [change], lab.set_apart)
    assert after == settings_from_verl(apply_overrides(verl, lab, [change])[0], lab)
    assert after != s


@pytest.mark.parametrize("args", [("model=qwen3_4b",), ("model=qwen3_8b_lora", "actor_rollout_ref.model.lora_rank=0"),
                                  ("model=qwen3_1_7b", "hardware=rtx4080_16gbx4", "rollout_gpu_mem_util=0.85")])
def test_every_remedy_plans_what_its_printed_text_does(args):
    verl, lab = composed(*args)
    run = Run.build(verl, lab, {})
    found = candidates(run.model.arch, run.settings)
    assert len(found) >= 4
    for changes, planned in found:
        typed = parse(text(changes))  # the text printed, read back as a user's command line is
        assert typed == changes
        assert settings_from_verl(apply_overrides(verl, lab, typed)[0], lab) == planned, text(changes)


def test_a_key_that_moves_no_planned_setting_leaves_the_settings():
    s = memplan.Settings(n_gpus=4, card_gb=32)
    assert settings_after(s, {"actor_rollout_ref.model.lora_alpha": 16, "trainer.total_epochs": 3}) == s
    assert dataclasses.replace(s, gpu_memory_utilization=0.3, tp=2) == settings_after(
        s, [Change("rollout_gpu_mem_util", 0.3), Change("rollout_tp", 2)])  # short keys: through their verl keys
