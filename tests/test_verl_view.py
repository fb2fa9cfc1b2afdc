"""The typed view of verl's composed config (grpo_lab/memory/verl_view.py): the composed value, else verl's own
default; and where call sites once read one key with defaults of their own that disagreed, the composed value (or
verl's default) now decides for all of them."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import composed

from grpo_lab.checks.microbatch import PASSES
from grpo_lab.checks.rules import Ctx, run_rules
from grpo_lab.memory.run import Run
from grpo_lab.memory.verl_view import NUMBERS, VerlView
from grpo_lab.verl_keys import get
from grpo_lab.verl_schema import schema


def _without(verl, dotted):
    *path, leaf = dotted.split(".")
    node = verl
    for part in path:
        node = node[part]
    del node[leaf]
    return verl


def test_the_composed_value_wins_and_an_absent_key_has_verls_default():
    verl, _ = composed()
    cfg = VerlView.of(verl)
    assert cfg.rollout.n == verl["actor_rollout_ref"]["rollout"]["n"] == 5
    assert cfg.actor.fsdp_config.param_offload is verl["actor_rollout_ref"]["actor"]["fsdp_config"]["param_offload"]
    cfg = VerlView.of(_without(verl, "trainer.total_epochs"))
    assert cfg.trainer.total_epochs == get(schema().defaults, "trainer.total_epochs") == 30
    assert VerlView.of({}).data.max_prompt_length == 512  # verl's own, for a config that gives nothing
    assert VerlView.of({}).rollout.enable_sleep_mode is True  # RolloutConfig's default: verl's YAML does not set it
    assert VerlView.of({}).rollout.name is None  # verl has none ('???'): the config must give it


def test_a_null_stays_null_and_a_run_read_without_defaults_says_unknown():
    verl, _ = composed()
    verl["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"] = None
    assert VerlView.of(verl).rollout.gpu_memory_utilization is None
    cfg = VerlView.of({"trainer": {"nnodes": 2}}, defaults=False)
    assert cfg.trainer.nnodes == 2 and cfg.trainer.n_gpus_per_node is None and cfg.env_vars == {}


def test_the_view_is_read_only():
    verl, _ = composed()
    cfg = VerlView.of(verl)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.n = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.env_vars["X"] = "1"  # type: ignore[index]
    assert isinstance(cfg.trainer.logger, tuple)


def test_every_key_of_the_tables_is_in_the_view():
    verl, _ = composed()
    cfg = VerlView.of(verl)
    keys = [k for k, *_ in NUMBERS] + [k for _, sizes, dyn, budget in PASSES for k in (*sizes, dyn, budget)]
    for key in keys:
        assert cfg.at(key) == get(verl, key), key
    with pytest.raises(KeyError):
        cfg.at("actor_rollout_ref.rollout.no_such_key")


def _ctx(verl, lab):
    return Ctx.of(verl, lab, launching=False, environ={})


def _messages(c, rule):
    return [p.message for p in run_rules(c, only=[rule])]


def test_use_remove_padding_absent_is_verls_true_for_every_rule():
    """It was read with False by environment_skipped and ulysses_sequence_parallel, with True by
    padded_with_flash_attn and the settings."""
    verl, lab = composed("+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                         "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2")
    c = _ctx(_without(verl, "actor_rollout_ref.model.use_remove_padding"), lab)
    assert c.cfg.model.use_remove_padding is True and c.run.settings.use_remove_padding is True
    assert any("use_remove_padding with attn_implementation=sdpa" in m for m in _messages(c, "environment_skipped"))
    assert not [m for m in _messages(c, "ulysses_sequence_parallel") if "use_remove_padding" in m]
    assert not _messages(c, "padded_with_flash_attn")


def test_gpu_memory_utilization_absent_is_verls_half_for_the_rule_and_the_plan():
    """It was read with no default by gpu_memory_utilization_range (refused as null) and the doctor, 0.5 by the
    settings."""
    verl, lab = composed()
    c = _ctx(_without(verl, "actor_rollout_ref.rollout.gpu_memory_utilization"), lab)
    assert c.cfg.rollout.gpu_memory_utilization == c.run.settings.gpu_memory_utilization == 0.5
    assert not _messages(c, "gpu_memory_utilization_range")


def test_lengths_and_batch_absent_are_verls_for_the_batch_arithmetic_and_the_plan():
    """The batch arithmetic read absent lengths and train batch as 0, the settings as 512 and 128."""
    verl, lab = composed()
    for key in ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size"):
        _without(verl, key)
    run = Run.build(verl, lab, {})
    assert run.batch["sequence_length"] == run.settings.seq_len == 1024
    assert run.batch["train_batch_size"] == run.settings.train_batch_size == 1024


def test_the_deprecated_sequence_parallel_key_wins_for_the_plan_as_for_the_rules():
    """verl copies actor.ulysses_sequence_parallel_size over the engine's when it is above 1; the settings took the
    larger of the two."""
    verl, lab = composed("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",
                         "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    run = Run.build(verl, lab, {})
    assert run.settings.sp_size == run.batch["sequence_parallel_size"] == 2


def test_reference_offload_absent_is_verls_off_for_the_fit_as_for_the_plan():
    """make fit read it with no default (None: "already on"), the settings with False."""
    verl, lab = composed("actor_rollout_ref.actor.use_kl_loss=true")
    run = Run.build(_without(verl, "actor_rollout_ref.ref.fsdp_config.param_offload"), lab, {})
    assert run.cfg.ref.fsdp_config.param_offload is False and run.settings.ref_param_offload is False


def test_a_logger_absent_is_verls_console_and_wandb():
    """_loggers read it as 'console', logger_unknown's text as null."""
    verl, lab = composed()
    (m,) = _messages(_ctx(_without(verl, "trainer.logger"), lab), "logger_unknown")
    assert "trainer.logger=[console,wandb] leaves out verl's file logger" in m
