"""Issue 19 items 2, 3 and 5, through run.py with real argv:

- no "preflight: OK" (and no `next:`) for a run that cannot start on this machine: the console names each missing
  path with the command that makes it; a plan made for another machine gets "plan OK; not ready to launch here"
  and exit code 3 (README); an empty model folder is not planned as the default model;
- a learning rate of 1e-3 or more is warned with the presets' rates (read from conf/); total_training_steps <= 0
  refused, null still lets the epochs decide;
- a micro-batch size the user gives turns grpo-lab's dynamic batching default off (or the plan says loudly that it
  is ignored).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONF, NOT_READY_EXIT, ROOT, fake_gpus, fresh_clone, model_folder, planned, run_py, write_rows

from grpo_lab.checks.inputs import MAKERS
from grpo_lab.facts import load_yaml, preset_learning_rates

A = "actor_rollout_ref."
SDPA = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"  # no flash-attn needed


def _plan(tmp_path: Path, *args: str, env: dict | None = None, name: str = "run", **kw):
    """run.py preflight.only=true preflight.verbose=true ARGS: (process, plan.json, job folder)."""
    job = tmp_path / name
    proc = run_py("preflight.only=true", "preflight.verbose=true", *args, f"hydra.run.dir={job}", env=env, **kw)
    plan = json.loads((job / "plan.json").read_text()) if (job / "plan.json").is_file() else {}
    return proc, plan, job


def _verdict(proc) -> str:
    return [line for line in proc.stdout.splitlines() if line.startswith("preflight: ")][-1]


def _data(tmp_path: Path) -> list[str]:
    """train_file/test_file overrides to parquet files made here (400 and 8 rows)."""
    return [f"train_file={write_rows(tmp_path / 'train.parquet', 400)}",
            f"test_file={write_rows(tmp_path / 'test.parquet', 8)}"]


def _not_ready_here(proc, plan, job) -> None:
    """The verdict of a plan that holds but cannot start here: exit 3, no OK, no next:, status.json says so."""
    assert proc.returncode == NOT_READY_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert planned(proc)
    assert "\npreflight: OK" not in proc.stdout and "next:" not in proc.stdout
    assert plan["ready_here"] is False
    status = json.loads((job / "status.json").read_text())
    assert (status["status"], status["exit"], status["ready_here"]) == ("ok", NOT_READY_EXIT, False)


# ---- item 2: what this machine lacks, named on the console with the command that makes it ------------------------

def test_an_empty_model_folder_is_not_ready_and_not_planned_as_the_default_model(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc, plan, job = _plan(tmp_path, f"model_path={empty}", *_data(tmp_path), SDPA, env=fake_gpus(tmp_path, 4))
    _not_ready_here(proc, plan, job)
    cmd = f"huggingface-cli download Qwen/Qwen3-1.7B --local-dir {empty}"  # the model option's hub id, into it
    assert _verdict(proc) == f"preflight: plan OK; not ready to launch here: {empty} ({cmd})"
    assert f"actor_rollout_ref.model.path: {empty} is empty; `{cmd}` puts the model option's qwen3_1_7b there" \
        in proc.stdout
    assert [(n["rule"], n["command"]) for n in plan["not_ready_here"]] == [("input_missing", cmd)]
    # not planned as Qwen3-1.7B (the default model option): no memory plan, and the title names the folder
    assert proc.stdout.startswith(f"grpo-lab preflight: {empty} on rtx4080x4")
    assert "phases" not in plan["memory"] and "Memory plan per GPU" not in proc.stdout
    assert any(f"{empty} holds no config.json" in n for n in plan["notes"])
    # a folder with files but no config.json: the same, said as it is
    (empty / "model.safetensors").write_text("")
    proc, plan, job = _plan(tmp_path, f"model_path={empty}", *_data(tmp_path), SDPA, env=fake_gpus(tmp_path, 4),
                            name="files")
    _not_ready_here(proc, plan, job)
    assert f"{empty} holds no model (no config.json)" in proc.stdout and "phases" not in plan["memory"]


def test_a_model_folder_without_weights_and_a_gguf_file_are_not_ready(tmp_path):
    folder = model_folder(tmp_path / "cfg_only", "qwen3_0_6b")
    (folder / "model.safetensors").unlink()
    proc, plan, job = _plan(tmp_path, "model=qwen3_0_6b", f"model_path={folder}", *_data(tmp_path), SDPA,
                            env=fake_gpus(tmp_path, 4))
    _not_ready_here(proc, plan, job)
    assert f"{folder} holds a config.json but no weights (*.safetensors or pytorch_model*.bin)" in proc.stdout
    assert "Memory plan per GPU" in proc.stdout  # its architecture is still planned
    gguf = tmp_path / "smol.gguf"
    gguf.write_bytes(b"GGUF")
    proc, plan, job = _plan(tmp_path, "model=smollm2_135m", f"model_path={gguf}", *_data(tmp_path), SDPA,
                            env=fake_gpus(tmp_path, 4), name="gguf")
    _not_ready_here(proc, plan, job)
    assert f"{gguf} is a GGUF file (llama.cpp's format)" in proc.stdout and "huggingface-cli" not in proc.stdout
    (cmd,) = [n["command"] for n in plan["not_ready_here"] if n["rule"] == "input_missing"]
    assert "gguf_file=f" in cmd and cmd.endswith(f"{tmp_path} smol.gguf {tmp_path / 'smol'}")
    assert "make smollm2 does for SmolLM2's GGUF" in proc.stdout and f"model_path={tmp_path / 'smol'}" in proc.stdout


def test_a_hub_id_not_in_the_cache_while_offline(tmp_path):
    hub = tmp_path / "hf" / "hub"
    base = [*_data(tmp_path), SDPA, "model_path=Qwen/Qwen3-0.6B"]
    env = {**fake_gpus(tmp_path, 4), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(hub)}
    for gate in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        proc, plan, job = _plan(tmp_path, *base, env={**env, gate: "1"}, name=gate)
        _not_ready_here(proc, plan, job)
        assert _verdict(proc) == ("preflight: plan OK; not ready to launch here: Qwen/Qwen3-0.6B "
                                  "(huggingface-cli download Qwen/Qwen3-0.6B)")
        assert f"the hub is off ({gate}=1) and it is not in the cache" in proc.stdout
    # a cache folder with no snapshot in it is no cached model either
    (hub / "models--Qwen--Qwen3-0.6B" / "refs").mkdir(parents=True)
    proc, plan, job = _plan(tmp_path, *base, env={**env, "HF_HUB_OFFLINE": "1"}, name="no_snapshot")
    _not_ready_here(proc, plan, job)
    # with a snapshot (what huggingface-cli download leaves): ready, and the command that starts it is printed
    model_folder(hub / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123", "qwen3_0_6b")
    (hub / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("abc123")
    proc, plan, job = _plan(tmp_path, *base, env={**env, "HF_HUB_OFFLINE": "1"}, name="cached")
    assert proc.returncode == 0 and _verdict(proc) == "preflight: OK", proc.stdout[-3000:] + proc.stderr[-2000:]
    assert plan["ready_here"] is True and "not_ready_here" not in plan
    (nxt,) = [line for line in proc.stdout.splitlines() if line.startswith("next: ")]
    assert nxt.startswith("next: python run.py train_file=") and "preflight.only" not in nxt


def test_a_missing_train_file_gets_the_command_that_writes_that_path(tmp_path):
    test = write_rows(tmp_path / "test.parquet", 8)
    # the issue's case: `make data` writes data/gsm8k/ only; for this path the converter with its folder does
    proc, plan, job = _plan(tmp_path, "data.train_files=/nonexistent/train.parquet", f"test_file={test}")
    _not_ready_here(proc, plan, job)
    (item,) = [n for n in plan["not_ready_here"] if n["rule"] == "input_missing"]
    assert item["command"] == "python -m grpo_lab.tasks.data gsm8k --out /nonexistent"
    assert "/nonexistent/train.parquet (python -m grpo_lab.tasks.data gsm8k --out /nonexistent)" in _verdict(proc)
    assert "make data" not in proc.stdout
    # the command printed for a countdown file elsewhere makes exactly that file: run as printed, the plan has it
    where = tmp_path / "mine"
    args = ["dataset=countdown", f"train_file={where}/train.parquet", f"test_file={test}"]
    proc, plan, job = _plan(tmp_path, *args, name="countdown")
    (item,) = [n for n in plan["not_ready_here"] if n["rule"] == "input_missing"]
    assert item["command"] == f"python -m grpo_lab.tasks.countdown --out {where}"
    words = shlex.split(item["command"])
    assert subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    proc, plan, job = _plan(tmp_path, *args, name="countdown_made")
    assert not [n for n in plan.get("not_ready_here", []) if n["rule"] == "input_missing"], proc.stdout[-3000:]
    assert "2048 train rows / 128 = 16 steps per epoch" in proc.stdout


def test_a_fresh_clone_names_the_make_targets_for_countdown_smollm2(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    proc, plan, job = _plan(tmp_path, "experiment=countdown_smollm2", root=clone, cwd=clone)
    _not_ready_here(proc, plan, job)
    inputs = [(n["message"].split(":")[0], n["command"]) for n in plan["not_ready_here"]
              if n["rule"] == "input_missing"]
    assert inputs == [("data.train_files", "make countdown"), ("data.val_files", "make countdown"),
                      ("actor_rollout_ref.model.path", "make smollm2")]
    assert _verdict(proc).startswith("preflight: plan OK; not ready to launch here: data/countdown/train.parquet "
                                     "(make countdown); data/countdown/test.parquet (make countdown); "
                                     "data/smollm2-135m-instruct (make smollm2)")
    assert "huggingface-cli" not in proc.stdout
    # launched (no preflight.only), the same is a refusal, before Ray: never "OK"
    proc = run_py("experiment=countdown_smollm2", f"hydra.run.dir={tmp_path / 'launch'}", root=clone, cwd=clone)
    assert proc.returncode == 2 and "preflight: REFUSED" in proc.stdout, proc.stdout[-3000:]
    assert "preflight: OK" not in proc.stdout and "make it: make smollm2" in proc.stdout
    errors = json.loads((tmp_path / "launch" / "plan.json").read_text())["errors"]
    assert {e["command"] for e in errors if e["rule"] == "input_missing"} == {"make countdown", "make smollm2"}


def test_a_sweep_of_plans_not_ready_here_exits_3(tmp_path):
    proc = run_py("-m", "preflight.only=true", "rollout_n=4,5", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                  "~hydra.callbacks.sweep_summary", cwd=tmp_path)
    assert proc.returncode == NOT_READY_EXIT, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 sweep job(s) planned OK but not ready to launch here" in proc.stderr
    assert proc.stdout.count("plan OK; not ready to launch here:") == 2 and "next:" not in proc.stdout


def test_make_plan_passes_a_plan_that_is_not_ready_here(tmp_path):
    proc = subprocess.run(["make", "--no-print-directory", "plan", f"PY={sys.executable}",
                           f"ARGS=train_file={tmp_path}/none.parquet hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "preflight: plan OK; not ready to launch here:" in proc.stdout
    refused = subprocess.run(["make", "--no-print-directory", "plan", f"PY={sys.executable}",
                              f"ARGS=rollout_gpu_mem_util=1.5 hydra.run.dir={tmp_path / 'bad'}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "preflight: REFUSED" in refused.stdout


@pytest.mark.parametrize("maker", MAKERS, ids=lambda m: f"{m.make} -> {m.out}")
def test_each_make_command_writes_the_path_it_is_named_for(maker):
    # the make target's own command (make -n) writes to that folder, with the generator the other folders get
    target = maker.make.split()[1]
    extra = ["IN=x.jsonl"] if target == "own-data" else []
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), target, *extra, "PY=python"], capture_output=True, text=True,
                         timeout=60)
    line = next(cmd for cmd in dry.stdout.splitlines() if "-m grpo_lab." in cmd)
    module = maker.module.format(out=maker.out, parent=str(Path(maker.out).parent))
    words = shlex.split(module.replace("<your .jsonl or .csv>", "x.jsonl"))  # the make line quotes its paths
    assert shlex.split(line)[:len(words)] == words, (line, module)
    # and it is the default path of its config option
    group = "dataset" if maker.files != ("",) else "model"
    doc = load_yaml(CONF / group / f"{maker.group}.yaml")
    want = "${hydra:runtime.cwd}/" + maker.out
    if group == "dataset":
        assert (doc["train_file"], doc["test_file"]) == (f"{want}/train.parquet", f"{want}/test.parquet")
    else:
        assert doc["model_path"] == want


# ---- item 3: values ----------------------------------------------------------------------------------------------

def _preset_rates() -> list[tuple[float, str]]:
    """The actor learning rates of the presets, as Hydra composes each option (tests/test_facts.py checks them against
    run.py's own composition and the rates conf/'s files write)."""
    return list(preset_learning_rates())


@pytest.mark.parametrize("typed", ["actor_lr=1.0", f"{A}actor.optim.lr=1e-3"])
def test_a_learning_rate_of_1e_3_or_more_is_warned_with_the_presets(tmp_path, typed):
    proc, plan, _ = _plan(tmp_path, typed, *_data(tmp_path))
    assert planned(proc), proc.stdout[-3000:]
    (w,) = [w for w in plan["warnings"] if w["rule"] == "learning_rate_high"]
    presets = _preset_rates()
    assert len(presets) >= 3 and "conf/config.yaml" in [f for _, f in presets]
    assert w["message"].endswith("The presets use " + "; ".join(f"{lr:g} ({f})" for lr, f in presets))
    assert "[learning_rate_high]" in proc.stdout  # on the console, not only in plan.json
    fixes = w["fix"].split("  or  ")
    assert fixes == list(dict.fromkeys(f"{A}actor.optim.lr={lr:g}" for lr, _ in presets))  # one a rate
    assert w["checked"].startswith("re-checked: the preflight")
    # appended to the command as typed (either spelling), the fix passes
    proc, plan, job = _plan(tmp_path, typed, *_data(tmp_path), fixes[0], name="fixed")
    assert planned(proc) and not [w for w in plan["warnings"] if w["rule"] == "learning_rate_high"]
    assert load_yaml(job / "verl_config.yaml")["actor_rollout_ref"]["actor"]["optim"]["lr"] == \
        presets[0][0]


def test_a_learning_rate_below_1e_3_is_not_warned(tmp_path):
    proc, plan, _ = _plan(tmp_path, "actor_lr=9e-4", *_data(tmp_path))
    assert planned(proc) and not [w for w in plan["warnings"] if w["rule"] == "learning_rate_high"]


@pytest.mark.parametrize("steps,rule", [("0", "value_range"), ("-1", "value_range"), ("three", "value_types")])
def test_total_training_steps_not_positive_is_refused_and_null_lets_the_epochs_decide(tmp_path, steps, rule):
    args = ["experiment=smoke", *_data(tmp_path)]
    proc, plan, _ = _plan(tmp_path, *args, f"trainer.total_training_steps={steps}")
    assert proc.returncode == 2 and "preflight: REFUSED" in proc.stdout, proc.stdout[-3000:]
    (e,) = [e for e in plan["errors"] if e["rule"] == rule]
    assert "trainer.total_training_steps" in e["message"] and e["fix"] == "trainer.total_training_steps=null"
    assert e["checked"] == "re-checked: the preflight passes this rule with it"
    # the fix typed back: the epochs decide (400 rows / 32 prompts = 12 steps per epoch)
    proc, plan, _ = _plan(tmp_path, *args, f"trainer.total_training_steps={steps}", e["fix"], name="fixed")
    assert planned(proc), proc.stdout[-3000:]
    b = plan["batch"]
    assert b["steps_per_epoch"] == 12 and b["total_training_steps"] == 12 * b["total_epochs"]
    assert "400 train rows / 32 = 12 steps per epoch" in proc.stdout


# ---- item 5: the user's micro-batch size -------------------------------------------------------------------------

DYN = (f"{A}actor.use_dynamic_bsz", f"{A}rollout.log_prob_use_dynamic_bsz", f"{A}ref.log_prob_use_dynamic_bsz")


def _dyn(job: Path) -> tuple[bool, ...]:
    from grpo_lab.verl_keys import get

    cfg = load_yaml(job / "verl_config.yaml")
    return tuple(get(cfg, k) for k in DYN)


def test_without_a_micro_batch_size_dynamic_batching_stays_on(tmp_path):
    proc, plan, job = _plan(tmp_path, *_data(tmp_path))
    assert planned(proc) and _dyn(job) == (True, True, True) and "micro_batch" not in plan


@pytest.mark.parametrize("args,env,set_by", [
    ([f"{A}actor.ppo_micro_batch_size_per_gpu=2"], {}, "command line"),  # the issue's script
    (["ppo_micro_batch_size_per_gpu=4"], {}, "command line (ppo_micro_batch_size_per_gpu)"),
    ([], {"PPO_MICRO_BATCH_SIZE_PER_GPU": "4"}, "environment (PPO_MICRO_BATCH_SIZE_PER_GPU)"),
    (["log_prob_micro_batch_size_per_gpu=4"], {}, "command line (log_prob_micro_batch_size_per_gpu)"),
    ([f"{A}ref.log_prob_micro_batch_size_per_gpu=4"], {}, "command line"),
], ids=["verl-key", "short-key", "environment", "log-prob-short-key", "ref-verl-key"])
def test_a_users_micro_batch_turns_the_dynamic_batching_default_off(tmp_path, args, env, set_by):
    proc, plan, job = _plan(tmp_path, *args, *_data(tmp_path), env=env)
    assert planned(proc), proc.stdout[-3000:]
    assert _dyn(job) == (False, False, False)
    info = plan["micro_batch"]
    assert set_by in {m["set_by"] for m in info["micro"]}
    assert [o["key"] for o in info["turned_off"]] == list(DYN)
    assert {o["set_by"] for o in info["turned_off"]} == {"conf/config.yaml"}
    (note,) = [n for n in plan["notes"] if n.startswith("your micro-batch size wins")]
    assert f"({set_by})" in note and "grpo-lab's default use_dynamic_bsz=true (conf/config.yaml) is off" in note
    assert "- your micro-batch size wins" in proc.stdout
    # what verl gets, verl's own validation accepts
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = OmegaConf.create(load_yaml(job / "verl_config.yaml"))
    OmegaConf.set_struct(cfg, True)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_a_micro_batch_in_an_experiment_file_of_the_users(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    (clone / "conf" / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nppo_micro_batch_size_per_gpu: 4\n")
    proc, plan, job = _plan(tmp_path, "experiment=mine", *_data(tmp_path), root=clone, cwd=clone)
    assert planned(proc), proc.stdout[-3000:]
    assert _dyn(job) == (False, False, False)
    assert plan["micro_batch"]["micro"][0]["set_by"] == "conf/experiment/mine.yaml (ppo_micro_batch_size_per_gpu)"


def test_a_micro_batch_with_dynamic_batching_set_on_too_is_warned_as_ignored(tmp_path):
    args = ["ppo_micro_batch_size_per_gpu=4", f"{A}actor.use_dynamic_bsz=true", *_data(tmp_path)]
    proc, plan, job = _plan(tmp_path, *args)
    assert planned(proc), proc.stdout[-3000:]
    assert _dyn(job) == (True, True, True)  # nothing changed: both were the user's
    (w,) = [w for w in plan["warnings"] if w["rule"] == "micro_batch_explicit"]
    assert w["message"].startswith(f"your {A}actor.ppo_micro_batch_size_per_gpu=4 (command line "
                                   f"(ppo_micro_batch_size_per_gpu)) is IGNORED: {A}actor.use_dynamic_bsz=true")
    assert f"({A}actor.ppo_max_token_len_per_gpu=16384 per GPU)" in w["message"]
    assert "[micro_batch_explicit]" in proc.stdout and plan["micro_batch"]["turned_off"] == []
    assert w["fix"] == " ".join(f"{k}=false" for k in DYN) and w["checked"].startswith("re-checked")
    # the fix typed back: the micro-batch counts, no warning
    proc, plan, job = _plan(tmp_path, *args, *shlex.split(w["fix"]), name="fixed")
    assert planned(proc) and _dyn(job) == (False, False, False)
    assert not [w for w in plan["warnings"] if w["rule"] == "micro_batch_explicit"]
