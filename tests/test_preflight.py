"""Preflight (grpo_lab/checks/preflight.py): a corpus of bad configs, one per rule, the guide's arithmetic, the
report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, composed, planned, run_py

from grpo_lab import facts
from grpo_lab.checks.preflight import PreflightReport, run_preflight
from grpo_lab.checks.rules import Problem
from grpo_lab.checks.rules.setup import THINKING_MIN_RESPONSE
from grpo_lab.memory.run import Run
from grpo_lab.verl_schema import schema


def put(d: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    for part in head:
        d = d.setdefault(part, {})
    d[last] = value


def check(verl, lab, launching=False, environ=None) -> PreflightReport:
    return run_preflight(Run.build(verl, lab, {} if environ is None else environ), launching=launching)


def rules(problems: list[Problem]) -> list[str]:
    return [p.rule for p in problems]


def only(problems: list[Problem], rule: str) -> Problem:
    found = [p for p in problems if p.rule == rule]
    assert len(found) == 1, (rule, [(p.rule, p.message) for p in problems])
    return found[0]


def write_parquet(path, rows: int, row_group_size: int | None = None):
    table = pa.table({"data_source": ["openai/gsm8k"] * rows,
                      "prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(rows)],
                      "reward_model": [{"style": "rule", "ground_truth": str(i)} for i in range(rows)]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


# ---- the guide's numbers ------------------------------------------------------------------------------------------

def test_guide_batch_arithmetic_with_a_gsm8k_sized_train_file(tmp_path):
    """128 prompts x 5 = 640 trajectories; mini-batch 64 -> 2 updates; 320 / 4 GPUs = 80; 7473 / 128 ~ 58 steps."""
    verl, lab = composed()
    verl["data"]["train_files"] = str(write_parquet(tmp_path / "train.parquet", 7473))
    r = check(verl, lab)
    b = r.batch
    assert b["trajectories_per_step"] == 640
    assert b["updates_per_step"] == 2
    assert b["trajectories_per_gpu"] == 80
    assert b["train_rows"] == 7473
    assert b["steps_per_epoch"] == 58
    assert b["total_training_steps"] == 116  # total_epochs 2
    assert r.ok, [(p.rule, p.message) for p in r.errors]
    text = r.format(verbose=True)
    for s in ("640 trajectories", "2 actor update", "80 trajectories per GPU", "58 steps per epoch"):
        assert s in text, s


def test_steps_per_epoch_unknown_without_the_file():
    verl, lab = composed()
    r = check(verl, lab)
    assert r.batch["steps_per_epoch"] is None
    # the command that writes that very path (issue 19: `make data` writes data/gsm8k/ only)
    (n,) = [n for n in r.notes if "steps_per_epoch unknown" in n]
    assert "python -m grpo_lab.tasks.data gsm8k --out /nonexistent` writes it" in n and "make data" not in n


def test_parquet_row_count_is_the_rows_written(tmp_path):
    for rows, group in ((1, None), (7473, 1000), (20000, 333)):
        path = write_parquet(tmp_path / f"t{rows}.parquet", rows, group)
        assert facts.parquet_num_rows(path) == pq.ParquetFile(path).metadata.num_rows == rows


def test_train_file_smaller_than_a_batch(tmp_path):
    verl, lab = composed()
    verl["data"]["train_files"] = str(write_parquet(tmp_path / "small.parquet", 100))
    p = only(check(verl, lab).errors, "data_files")
    assert "100 rows" in p.message and "128" in p.message


def test_guide_memory_table_in_the_report():
    for model, gb in (("qwen3_0_6b", 2.38), ("qwen3_1_7b", 6.88), ("qwen3_4b", 16.09)):
        verl, lab = composed(f"model={model}")
        r = check(verl, lab)
        assert r.memory["actor_state_gb_per_gpu"] == pytest.approx(gb, abs=0.02)
        # 0.4 of the card's real bytes (32 GiB, as CUDA reports a "32 GB" card)
        assert r.memory["phases"]["generation"]["components_gb"]["vllm_budget"] == pytest.approx(13.74)
        assert f"actor state {r.memory['actor_state_gb_per_gpu']} GB per GPU" in r.format(verbose=True)


# ---- batch rules --------------------------------------------------------------------------------------------------

def test_mini_batch_not_dividing():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.actor.ppo_mini_batch_size", 7)
    r = check(verl, lab)
    mini = only(r.errors, "mini_batch_divisibility")
    assert "7 x 5 = 35" in mini.message and "8.75" in mini.message
    assert "'Got mini_batch_size=35 and self.engine.get_data_parallel_size()=4'" in mini.message
    assert mini.fix == "ppo_mini_batch_size=8"
    # 128/7 updates: verl's V1 trainer pads the step to whole mini-batches (a warning); the legacy trainer fails
    upd = only(r.warnings, "updates_per_step_integer")
    assert "128/7" in upd.message and upd.fix == "ppo_mini_batch_size=8"
    assert "padded with 60 synthetic no-op samples to 700" in upd.message and "9% of each step" in upd.message
    assert r.batch["padding"] == {"multiple": 140, "padded_trajectories": 700, "samples": 60, "fraction": 0.086,
                                  "updates_per_step": 20}
    put(verl, "trainer.use_v1", False)
    upd = only(check(verl, lab).errors, "updates_per_step_integer")
    assert "legacy trainer (trainer.use_v1=false)" in upd.message and upd.fix == "ppo_mini_batch_size=8"


def test_train_batch_not_dividing_over_gpus():
    """650 trajectories over 4 GPUs: the V1 trainer pads them (a warning), the legacy trainer's equal split fails."""
    verl, lab = composed()
    put(verl, "data.train_batch_size", 130)
    put(verl, "actor_rollout_ref.actor.ppo_mini_batch_size", 65)
    r = check(verl, lab)
    p = only(r.warnings, "batch_divisibility")
    assert "650 trajectories" in p.message and "4 data-parallel GPUs" in p.message
    assert "verl's V1 trainer with dynamic batching runs it" in p.message and "padded with 650" in p.message
    assert "mini_batch_divisibility" in rules(r.errors)  # 325 per mini-batch over 4 GPUs: any mode fails
    put(verl, "trainer.use_v1", False)
    p = only(check(verl, lab).errors, "batch_divisibility")
    assert "650 trajectories" in p.message and "'650 % 4 != 0'" in p.message
    # train batch and mini-batch chosen together: 2 updates of 64 x 5 = 320 = 80 per GPU
    assert p.fix.split("  or  ")[0] == "train_batch_size=128 ppo_mini_batch_size=64"


def test_train_batch_smaller_than_mini_batch():
    verl, lab = composed()
    put(verl, "data.train_batch_size", 32)
    p = only(check(verl, lab).warnings, "train_batch_vs_mini_batch")  # the V1 trainer pads it to one mini-batch
    assert "32 prompts" in p.message and "64" in p.message and "50% of each step's samples are padding" in p.message
    assert p.fix == "ppo_mini_batch_size=32"
    put(verl, "trainer.use_v1", False)  # the legacy trainer: each rank's 40 against 80 per mini-batch
    assert "'40 % 80 != 0'" in only(check(verl, lab).errors, "train_batch_vs_mini_batch").message
    put(verl, "trainer.use_v1", True)
    _static_batches(verl)  # without dynamic batching verl's validate_config refuses it (either trainer)
    p = only(check(verl, lab).errors, "train_batch_vs_mini_batch")
    assert "'ValueError: train_batch_size (32) must be >= actor.ppo_mini_batch_size (64)'" in p.message
    assert p.fix == "ppo_mini_batch_size=32"


def _static_batches(verl):
    put(verl, "actor_rollout_ref.actor.use_dynamic_bsz", False)
    put(verl, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", False)
    put(verl, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", False)


def test_micro_batch_rules_when_dynamic_batching_is_off():
    verl, lab = composed()
    _static_batches(verl)
    assert not [e for e in check(verl, lab).errors if e.rule in ("micro_batch", "log_prob_micro_batch")]
    put(verl, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 3)
    p = only(check(verl, lab).errors, "micro_batch")
    assert "80 trajectories" in p.message and "3" in p.message and p.fix == "ppo_micro_batch_size_per_gpu=2"
    put(verl, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", None)
    assert "not set" in only(check(verl, lab).errors, "micro_batch").message
    put(verl, "actor_rollout_ref.actor.ppo_micro_batch_size", 8)
    p = only(check(verl, lab).errors, "micro_batch")
    assert "deprecated" in p.message and "ppo_micro_batch_size_per_gpu=2" in p.fix
    # with dynamic batching the micro-batch sizes are unused: no micro-batch rule fires
    verl, lab = composed()
    put(verl, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 3)
    assert "micro_batch" not in rules(check(verl, lab).errors)


def test_log_prob_micro_batch_missing():
    verl, lab = composed()
    _static_batches(verl)
    put(verl, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", None)
    p = only(check(verl, lab).errors, "log_prob_micro_batch")
    assert "rollout.log_prob_micro_batch_size_per_gpu" in p.message


def test_rollout_tp_not_dividing_gpus():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.rollout.tensor_model_parallel_size", 3)
    p = only(check(verl, lab).errors, "rollout_parallel")
    assert "3" in p.message and "4 GPUs" in p.message and p.fix == "rollout_tp=4"


# ---- token budgets ------------------------------------------------------------------------------------------------

def test_token_budget_below_one_sequence():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 1024)
    put(verl, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", 1000)
    errs = [p for p in check(verl, lab).errors if p.rule == "token_budget"]
    assert {p.fix for p in errs} == {"ppo_max_token_len_per_gpu=1536",
                                     "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=1536"}
    assert all("1536" in p.message for p in errs)


def test_token_budget_advice_note():
    verl, lab = composed("speed=guide")  # the script's update budget, 3000
    notes = check(verl, lab).notes
    assert any("3000" in n and "2 x (max_prompt_length + max_response_length)" in n for n in notes)
    put(verl, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 4096)
    assert not any("ppo_max_token_len_per_gpu=4096 is below" in n for n in check(verl, lab).notes)


# ---- pitfalls -----------------------------------------------------------------------------------------------------

def test_flash_attn_missing_at_launch(monkeypatch):
    monkeypatch.setattr(facts, "module_available", lambda name: False)
    monkeypatch.setattr(facts, "_proc_gpus", lambda: 4)
    verl, lab = composed()
    r = check(verl, lab, launching=True)
    p = only(r.errors, "flash_attn_missing")
    assert "flash_attention_2" in p.message
    assert p.fix == "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    put(verl, "actor_rollout_ref.model.override_config", {"attn_implementation": "sdpa"})
    assert "flash_attn_missing" not in rules(check(verl, lab, launching=True).errors)
    # not launching: skipped, and said so
    verl, lab = composed()
    r = check(verl, lab, launching=False)
    assert "flash_attn_missing" not in rules(r.errors)
    assert any("environment checks skipped" in n for n in r.notes)
    # installed: fine
    monkeypatch.setattr(facts, "module_available", lambda name: True)
    assert "flash_attn_missing" not in rules(check(verl, lab, launching=True).errors)


def test_visible_gpus_at_launch(monkeypatch):
    monkeypatch.setattr(facts, "module_available", lambda name: True)
    monkeypatch.setattr(facts, "_proc_gpus", lambda: 4)
    verl, lab = composed()
    assert "visible_gpus" not in rules(check(verl, lab, launching=True).errors)
    p = only(check(verl, lab, launching=True, environ={"CUDA_VISIBLE_DEVICES": "0,1"}).errors, "visible_gpus")
    assert "n_gpus_per_node=4" in p.message and "2 CUDA GPU" in p.message and p.fix == "ngpus_per_node=2"
    assert "visible_gpus" not in rules(check(verl, lab, launching=False, environ={"CUDA_VISIBLE_DEVICES": ""}).errors)


def test_visible_gpu_count_without_torch(monkeypatch):
    monkeypatch.setattr(facts, "_proc_gpus", lambda: 4)
    assert facts.visible_gpus({})[0] == 4
    assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "1,3"})[0] == 2
    assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": ""})[0] == 0
    assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"})[0] == 0
    assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"})[0] == 4
    monkeypatch.setattr(facts, "_proc_gpus", lambda: None)
    monkeypatch.setattr(facts, "_smi_gpus", lambda: None)
    assert facts.visible_gpus({})[0] == 0


def test_ray_cpu_budget_v1_trainer():
    """The H200 case: 1 GPU, num_cpus=8, V1 trainer: 3 + 1 + 1 + 8 storage units = 13 > 8 -> silent hang."""
    verl, lab = composed("hardware=h200x1")
    put(verl, "ray_kwargs.ray_init.num_cpus", 8)
    put(verl, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8)
    p = only(check(verl, lab).errors, "ray_cpus")
    assert "needs 13 CPUs" in p.message and "has 8" in p.message and "hangs silently" in p.message
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units=3" in p.fix
    assert "ray_kwargs.ray_init.num_cpus=13" in p.fix and "trainer.use_v1=false" in p.fix
    put(verl, "ray_kwargs.ray_init.num_cpus", 16)  # what ran
    assert "ray_cpus" not in rules(check(verl, lab).errors)
    put(verl, "ray_kwargs.ray_init.num_cpus", 8)
    put(verl, "trainer.use_v1", False)  # the legacy trainer ran with 8: no TransferQueue
    assert "ray_cpus" not in rules(check(verl, lab).errors)


def test_ray_cpu_budget_from_the_hardware_file_or_the_machine(monkeypatch):
    verl, lab = composed()  # rtx4080x4: 12 + 1 + 1 + 2 units = 16 = num_cpus
    assert check(verl, lab).batch["ray_cpus"]["needed"] == 16
    assert "ray_cpus" not in rules(check(verl, lab).errors)
    put(verl, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8)  # verl's default: 22 > 16
    assert "needs 22 CPUs" in only(check(verl, lab).errors, "ray_cpus").message
    put(verl, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 2)
    put(verl, "ray_kwargs.ray_init.num_cpus", None)  # Ray takes the machine's cores: the hardware file's 8
    lab.hardware.cpu_cores = 8
    assert "lab.hardware.cpu_cores=8" in only(check(verl, lab).errors, "ray_cpus").message
    monkeypatch.setattr(facts, "machine_cpus", lambda: 64)  # launching: the real machine counts
    monkeypatch.setattr(facts, "module_available", lambda name: True)
    monkeypatch.setattr(facts, "_proc_gpus", lambda: 4)
    assert "ray_cpus" not in rules(check(verl, lab, launching=True).errors)


def test_ray_env_vars_must_be_strings():
    verl, lab = composed()
    put(verl, "ray_kwargs.ray_init.runtime_env.env_vars", {"NCCL_P2P_DISABLE": 1, "OK": "1"})
    p = only(check(verl, lab).errors, "ray_env_vars")
    assert "NCCL_P2P_DISABLE=1 is a int" in p.message
    assert p.fix == "\"ray_kwargs.ray_init.runtime_env.env_vars.NCCL_P2P_DISABLE='1'\""


def test_dynamic_batch_settings_that_disagree():
    """The rollout's log-prob pass shares the actor's engine (verl asserts they agree): refused. The reference model
    has an engine of its own, built with its own setting: warned about."""
    verl, lab = composed()
    put(verl, "actor_rollout_ref.actor.use_dynamic_bsz", False)
    r = check(verl, lab)
    p = only(r.errors, "dynamic_bsz_mismatch")
    assert "rollout.log_prob_use_dynamic_bsz=true" in p.message and "ref." not in p.message
    assert "ActorRolloutRefWorker.init_model" in p.message
    assert p.fix == "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false"
    w = only(r.warnings, "dynamic_bsz_mismatch")
    assert "ref.log_prob_use_dynamic_bsz=true" in w.message and "so this runs" in w.message
    assert w.fix == "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false"
    verl, lab = composed()
    put(verl, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", False)
    r = check(verl, lab)
    assert "dynamic_bsz_mismatch" not in rules(r.errors) and only(r.warnings, "dynamic_bsz_mismatch")
    put(verl, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", None)  # and no micro-batch: verl fails
    assert "ref.log_prob_micro_batch_size_per_gpu is not set" in only(check(verl, lab).errors,
                                                                       "log_prob_micro_batch").message


def test_misspelt_model_key():
    verl, lab = composed()
    verl["actor_rollout_ref"]["model"]["use_remove_paddin"] = True
    p = only(check(verl, lab).errors, "model_key_unknown")
    assert "did you mean 'use_remove_padding'" in p.message
    assert p.fix == "~actor_rollout_ref.model.use_remove_paddin actor_rollout_ref.model.use_remove_padding=true"
    # override_config is free-form; dataclass-only fields are known too
    verl, lab = composed()
    verl["actor_rollout_ref"]["model"]["override_config"] = {"attn_implementation": "sdpa", "rope_theta": 1e6}
    verl["actor_rollout_ref"]["model"]["target_parameters"] = None
    assert "model_key_unknown" not in rules(check(verl, lab).errors)
    keys, source = schema().model_keys, schema().model_keys_from
    assert {"path", "use_remove_padding", "enable_gradient_checkpointing", "override_config", "lora_rank"} <= keys
    assert "hf_model.yaml" in source and "HFModelConfig" in source


@pytest.mark.parametrize("util", [1.5, 0, -0.2, 1.0])
def test_gpu_memory_utilization_outside_0_1(util):
    verl, lab = composed()
    put(verl, "actor_rollout_ref.rollout.gpu_memory_utilization", util)
    r = check(verl, lab)
    p = only(r.errors, "gpu_memory_utilization_range")
    assert f"gpu_memory_utilization={util!r}" in p.message and p.fix == "rollout_gpu_mem_util=0.4"
    assert "memory_generation" not in rules(r.errors)  # one problem, one message
    if util == 1.0:  # vLLM 0.24 at start-up, its own words (vllm/v1/worker/utils.py request_memory)
        assert "is less than desired GPU memory utilization (1.0, ... GiB)" in p.message
        assert "request_memory" in p.message


def test_gpu_memory_utilization_1_on_sglang_is_a_warning():
    """SGLang's mem_fraction_static=1.0 is not checked against SGLang's code: warned about; the memory plan is made
    with the value as set (and says what it predicts)."""
    verl, lab = composed("rollout=sglang_tp1_mem04", "rollout_gpu_mem_util=1.0")
    r = check(verl, lab)
    assert "gpu_memory_utilization_range" not in rules(r.errors)
    assert "not checked against sglang's code" in only(r.warnings, "gpu_memory_utilization_range").message
    assert r.memory["phases"]["generation"]["components_gb"]["sglang_static"] > 30


def test_lora_with_dummy_loading_is_a_warning():
    """verl 0.9.1's worker syncs the base weights before the first adapter (engine_workers.py do_lora_base_sync):
    LoRA with load_format=dummy is warned about (not confirmed on a GPU yet), not refused."""
    verl, lab = composed("model=qwen3_8b_lora")
    assert "lora_load_format" not in rules(check(verl, lab).errors + check(verl, lab).warnings)
    put(verl, "actor_rollout_ref.rollout.load_format", "dummy")
    r = check(verl, lab)
    assert "lora_load_format" not in rules(r.errors)
    p = only(r.warnings, "lora_load_format")
    assert "lora_rank=64" in p.message and "do_lora_base_sync" in p.message and "not yet confirmed" in p.message
    assert p.fix == "actor_rollout_ref.rollout.load_format=safetensors"
    put(verl, "actor_rollout_ref.model.lora", {"merge": True})  # merged full weights are synced: nothing to say
    assert "lora_load_format" not in rules(check(verl, lab).warnings)


def test_dapo_group_filtering_needs_a_metric():
    verl, lab = composed("variant=dapo")
    assert "dapo_filter_metric" not in rules(check(verl, lab).errors + check(verl, lab).warnings)
    put(verl, "algorithm.filter_groups.metric", None)
    p = only(check(verl, lab).errors, "dapo_filter_metric")
    assert "filter_groups.metric" in p.message and "algorithm.filter_groups.metric=acc" in p.fix
    verl, lab = composed("variant=dapo")
    put(verl, "reward.reward_manager.name", "naive")  # reports no `acc`
    assert "missing DAPO metric" in only(check(verl, lab).warnings, "dapo_filter_metric").message


def test_qwen3_thinking_with_a_short_response_limit():
    verl, lab = composed()  # Qwen3-1.7B (chat, thinking), 1024 response tokens
    p = only(check(verl, lab).warnings, "thinking_response_length")
    assert "1024" in p.message and str(THINKING_MIN_RESPONSE) in p.message and "####" in p.message
    assert "model=qwen3_1_7b_base" in p.fix and "max_response_length=2048" in p.fix
    assert "thinking_response_length" not in rules(check(*composed("model=qwen3_1_7b_base")).warnings)
    put(verl, "data.max_response_length", 2048)
    assert "thinking_response_length" not in rules(check(verl, lab).warnings)
    verl, lab = composed()
    put(verl, "data.apply_chat_template_kwargs", {"enable_thinking": False})
    assert "thinking_response_length" not in rules(check(verl, lab).warnings)


def test_nccl_p2p_on_cards_without_p2p():
    verl, lab = composed()  # rtx4080x4 sets NCCL_P2P_DISABLE for the workers
    assert "nccl_p2p" not in rules(check(verl, lab).warnings)
    verl["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"] = {}
    assert "NCCL_P2P_DISABLE" in only(check(verl, lab).warnings, "nccl_p2p").fix
    assert "nccl_p2p" not in rules(check(verl, lab, environ={"NCCL_P2P_DISABLE": "1"}).warnings)


# ---- memory rules -------------------------------------------------------------------------------------------------

def test_full_finetune_of_8b_refused_with_a_pointer_to_lora():
    verl, lab = composed("model=qwen3_8b_lora", "actor_rollout_ref.model.lora_rank=0")
    r = check(verl, lab)
    p = only(r.errors, "full_finetune_too_big")
    assert "8.2B" in p.message and "16 B per parameter" in p.message and "model=qwen3_8b_lora" in p.message
    # the fix is the LoRA recipe as overrides (re-checkable), not a group choice
    assert p.fix == ("actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32 "
                     "actor_rollout_ref.rollout.load_format=safetensors "
                     "actor_rollout_ref.actor.fsdp_config.param_offload=true "
                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    assert p.checked.startswith("re-checked")
    # strict=false: the predicted OOMs become warnings, nothing else blocks
    lab.preflight.strict = False
    r = check(verl, lab)
    assert r.ok, [(e.rule, e.message) for e in r.errors]
    assert "full_finetune_too_big" in rules(r.warnings)


def test_4b_at_util_085_refused_before_launch():
    verl, lab = composed("model=qwen3_4b", "rollout_gpu_mem_util=0.85", "actor_rollout_ref.rollout.max_model_len=1536")
    r = check(verl, lab)
    p = only(r.errors, "memory_generation")
    assert "32 GB cards" in p.message and "vllm budget 29.21" in p.message  # 0.85 x 32 GiB
    fix_util = float(p.fix.split("=")[1])
    assert p.fix.startswith("rollout_gpu_mem_util=") and fix_util < 0.85
    assert r.memory["verdict"]["generation"] == "oom"
    lab.preflight.strict = False
    r = check(verl, lab)
    assert "memory_generation" in rules(r.warnings) and "memory_generation" not in rules(r.errors)


def test_vllm_kv_cache_cannot_hold_max_model_len():
    # verl's default, max_model_len null -> 40960 (conf/ sets prompt + response), at 0.4 x 32 GB
    verl, lab = composed("model=qwen3_4b", "actor_rollout_ref.rollout.max_model_len=null")
    p = only(check(verl, lab).errors, "vllm_kv_cache")
    assert "40960" in p.message and p.fix == "actor_rollout_ref.rollout.max_model_len=1536"


def test_tight_phase_is_a_warning_with_remedies():
    verl, lab = composed("model=qwen3_4b", "actor_rollout_ref.rollout.max_model_len=1536")
    r = check(verl, lab)
    assert r.ok
    p = only(r.warnings, "memory_generation")
    assert "tight" in p.message and "Remedies" in p.message
    assert r.memory["verdict"]["overall"] == "tight"


def test_architecture_from_a_local_config_json(tmp_path):
    cfg = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 4096,
           "tie_word_embeddings": True, "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    verl, lab = composed()  # lab.model says Qwen3-1.7B
    put(verl, "actor_rollout_ref.model.path", str(tmp_path))
    r = check(verl, lab)
    assert r.memory["architecture_source"] == str(tmp_path / "config.json")
    assert r.memory["params"] < 1e6
    assert "model_arch_mismatch" not in rules(r.warnings)


def test_model_path_that_disagrees_with_the_model_group():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.model.path", "someone/Unknown-7B")
    p = only(check(verl, lab, environ={"HF_HOME": "/nonexistent"}).warnings, "model_arch_mismatch")
    assert "someone/Unknown-7B" in p.message and "qwen3_1_7b" in p.message


def test_model_path_naming_a_known_model_plans_that_model():
    """MODEL_PATH=Qwen/Qwen3-0.6B with the default 1.7B group: the 0.6B is planned, no mismatch warning."""
    verl, lab = composed()
    put(verl, "actor_rollout_ref.model.path", "Qwen/Qwen3-0.6B")
    r = check(verl, lab, environ={"HF_HOME": "/nonexistent"})
    assert "model_arch_mismatch" not in rules(r.warnings)
    assert r.memory["params_b"] == pytest.approx(0.596, abs=0.01)
    assert "qwen3_0_6b" in r.memory["architecture_source"] and r.title.startswith("qwen3_0_6b")


# ---- the report ---------------------------------------------------------------------------------------------------

def test_all_problems_are_collected_not_first_fail():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.actor.ppo_mini_batch_size", 7)
    put(verl, "actor_rollout_ref.rollout.gpu_memory_utilization", 1.5)
    put(verl, "ray_kwargs.ray_init.runtime_env.env_vars", {"X": 1})
    put(verl, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 100)
    verl["actor_rollout_ref"]["model"]["enable_gradient_checkpoint"] = True
    r = check(verl, lab)
    assert {"mini_batch_divisibility", "gpu_memory_utilization_range", "ray_env_vars",
            "token_budget", "model_key_unknown"} <= set(rules(r.errors))
    assert "updates_per_step_integer" in rules(r.warnings)  # verl's V1 trainer pads the step
    assert not r.ok
    text = r.format(verbose=True)
    assert text.index("Batch arithmetic") < text.index("Memory plan") < text.index("Errors") < text.index("Warnings")
    for p in r.errors:
        assert f"[{p.rule}]" in text and p.fix and f"fix: {p.fix}" in text
    assert text.rstrip().endswith(f"REFUSED ({len(r.errors)} error(s))")


def test_to_json_is_plan_json():
    verl, lab = composed()
    out = check(verl, lab).to_json()
    assert set(out) == {"batch", "memory", "time", "errors", "warnings", "notes"}
    assert {"trajectories_per_step", "updates_per_step", "trajectories_per_gpu", "steps_per_epoch"} <= set(out["batch"])
    assert {"actor_state_gb_per_gpu", "phases", "kv_cache", "host_ram_gb", "verdict"} <= set(out["memory"])
    assert all({"rule", "message", "fix"} <= set(p) <= {"rule", "message", "fix", "checked"} for p in out["warnings"])
    json.loads(json.dumps(out))


def test_no_heavy_imports_and_fast():
    """Preflight imports neither verl, torch, ray, vllm nor pyarrow (no data files here: pyarrow reads local ones)."""
    verl, lab = composed()
    code = (
        "import json, sys, time\n"
        "t = time.time()\n"
        "from grpo_lab.checks.preflight import run_preflight\n"
        "from grpo_lab.labconf import Lab\n"
        "from grpo_lab.memory.run import Run\n"
        "verl, lab = json.load(sys.stdin)\n"
        "r = run_preflight(Run.build(verl, Lab.of(lab), {}), launching=False)\n"
        "heavy = [m for m in ('verl', 'torch', 'ray', 'vllm', 'pyarrow', 'transformers') if m in sys.modules]\n"
        "print(json.dumps({'heavy': heavy, 'seconds': time.time() - t, 'batch': r.batch['trajectories_per_step']}))\n")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps([verl, asdict(lab)]), capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["heavy"] == [] and res["batch"] == 640
    assert res["seconds"] < 1.0


# ---- through run.py (each ~3 s: two of them) ----------------------------------------------------------------------

def test_run_py_refuses_a_bad_config_and_writes_the_plan(tmp_path):
    t = time.time()
    out = run_py("preflight.only=true", "ppo_mini_batch_size=7", "rollout_gpu_mem_util=1.5",
                 f"hydra.run.dir={tmp_path}")
    elapsed = time.time() - t
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "[mini_batch_divisibility]" in text and "[gpu_memory_utilization_range]" in text
    assert "fix: ppo_mini_batch_size=8" in text
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert {"mini_batch_divisibility", "gpu_memory_utilization_range"} <= {e["rule"] for e in plan["errors"]}
    assert plan["batch"]["trajectories_per_gpu"] == 8.75
    assert elapsed < 60  # no Ray, no model: seconds (benchmarks/preflight_speed.py measures it)


def test_run_py_plan_with_the_guide_numbers(tmp_path):
    train = write_parquet(tmp_path / "train.parquet", 7473)
    out = run_py("preflight.only=true", f"train_file={train}", f"test_file={train}",
                 f"hydra.run.dir={tmp_path / 'job'}")
    assert planned(out), out.stdout + out.stderr
    plan = json.loads((tmp_path / "job" / "plan.json").read_text())
    b, m = plan["batch"], plan["memory"]
    assert (b["trajectories_per_step"], b["updates_per_step"], b["trajectories_per_gpu"], b["steps_per_epoch"]) == \
        (640, 2, 80, 58)
    assert m["actor_state_gb_per_gpu"] == pytest.approx(6.88, abs=0.02)
    assert m["verdict"]["overall"] == "fits"
