"""The official script's knobs: short keys, environment variables, their precedence, and derived values that follow
whichever spelling set them (issue 10, item 2)."""

from __future__ import annotations

import io
import json

import pytest
from conftest import compose_split, planned, run_py

from grpo_lab.cli.knobs import KNOBS, misspelt_env
from grpo_lab.cli.overrides import parse, prepare
from grpo_lab.facts import load_yaml
from grpo_lab.verl_keys import get

# a value for every knob, unlike the config's own (so that a knob that does not reach verl shows)
VALUES = {"model_path": "/models/x", "train_batch_size": 96, "ppo_mini_batch_size": 48, "rollout_n": 3,
          "max_prompt_length": 300, "max_response_length": 700, "rollout_tp": 2, "rollout_gpu_mem_util": 0.55,
          "total_epochs": 7, "test_freq": 3, "save_freq": 9, "project_name": "p1", "experiment_name": "e1",
          "ngpus_per_node": 2, "nnodes": 1, "actor_lr": 2e-6, "kl_loss_coef": 0.01, "entropy_coeff": 0.001,
          "ppo_max_token_len_per_gpu": 4096, "ppo_micro_batch_size_per_gpu": 4,
          "log_prob_micro_batch_size_per_gpu": 8, "train_file": "/d/train.parquet", "test_file": "/d/test.parquet"}


def test_each_short_key_feeds_its_verl_key():
    assert set(VALUES) == {k.key for k in KNOBS}
    verl, _ = compose_split(*(f"{k}={v}" for k, v in VALUES.items()))
    for knob in KNOBS:
        assert get(verl, knob.verl_key) == VALUES[knob.key], knob


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.key)
def test_short_key_verl_key_and_environment_give_the_same_verl_config(knob):
    # every value grpo-lab derives (max_model_len, the ref's micro-batch, DAPO's max_resp_len, ...) follows the value
    # verl uses, whichever of the three spellings set it; variant=dapo so that DAPO's max_resp_len is in the config
    value = VALUES[knob.key]
    short, _ = compose_split("variant=dapo", f"{knob.key}={value}")
    long, _ = compose_split("variant=dapo", f"{knob.verl_key}={value}")
    env, _ = compose_split("variant=dapo", environ={knob.env: str(value)})
    assert get(short, knob.verl_key) == value
    assert short == long
    assert short == env


def test_long_prompts_and_answers_move_vllms_context_and_dapos_limit():
    # issue 10 item 2: data.max_prompt_length=2048 data.max_response_length=8192 gave max_model_len 1536
    verl, _ = compose_split("variant=dapo", "data.max_prompt_length=2048", "data.max_response_length=8192")
    assert get(verl, "actor_rollout_ref.rollout.max_model_len") == 10240
    assert get(verl, "reward.reward_kwargs.max_resp_len") == 8192


def test_cfg_job_resolve_shows_the_context_verl_gets():
    proc = run_py("data.max_prompt_length=2048", "data.max_response_length=8192", "--cfg", "job", "--resolve")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "    max_model_len: 10240\n" in proc.stdout


def test_env_overrides_come_from_the_environment():
    env = {"ROLLOUT_GPU_MEM_UTIL": "0.5", "MODEL_PATH": "Qwen/Qwen3-0.6B", "UNRELATED": "1"}
    assert sorted(parse([], env).env) == ["model_path=Qwen/Qwen3-0.6B", "rollout_gpu_mem_util=0.5"]


@pytest.mark.parametrize("cli", [["rollout_gpu_mem_util=0.3"], ["actor_rollout_ref.rollout.gpu_memory_utilization=0.3"],
                                 ["-m", "rollout_gpu_mem_util=0.3,0.4"], ["+rollout_gpu_mem_util=0.3"]])
def test_command_line_beats_environment(cli):
    assert parse(cli, {"ROLLOUT_GPU_MEM_UTIL": "0.5"}).env == []


def test_precedence_command_line_over_environment_over_config_files():
    # config file (experiment=smoke) says 32; the environment says 64; the command line says 16
    env = {"TRAIN_BATCH_SIZE": "64"}
    verl, _ = compose_split("experiment=smoke", environ=env)
    assert get(verl, "data.train_batch_size") == 64
    verl, _ = compose_split("experiment=smoke", "train_batch_size=16", environ=env)
    assert get(verl, "data.train_batch_size") == 16
    verl, _ = compose_split("experiment=smoke", "data.train_batch_size=16", environ=env)
    assert get(verl, "data.train_batch_size") == 16
    verl, _ = compose_split("experiment=smoke")
    assert get(verl, "data.train_batch_size") == 32


def test_odd_values_are_quoted_for_hydra():
    # (EXPERIMENT_NAME names the run's folder: a safe folder name only, tests/test_cli.py)
    cli = parse([], {"MODEL_PATH": "/models/my run (v2)", "PROJECT_NAME": "'my run,v2'", "ACTOR_LR": "1e-6"})
    verl, _ = compose_split(*cli.env)
    assert get(verl, "actor_rollout_ref.model.path") == "/models/my run (v2)"
    assert get(verl, "trainer.project_name") == "my run,v2"  # a comma list quoted, as Hydra reads `key='a,b'`
    assert get(verl, "actor_rollout_ref.actor.optim.lr") == 1e-6  # a number, as `actor_lr=$ACTOR_LR` reads it


def test_a_comma_list_in_the_environment_is_a_sweep_only_under_m():
    # as `key=$VAR` reads it in the official script: Hydra's sweep syntax, which only -m takes
    assert parse(["-m", "experiment=smoke"], {"ROLLOUT_GPU_MEM_UTIL": "0.3,0.4,0.5"}).env == [
        "rollout_gpu_mem_util=0.3,0.4,0.5"]
    err = io.StringIO()
    with pytest.raises(SystemExit) as e:
        prepare(["run.py", "experiment=smoke"], {"ROLLOUT_GPU_MEM_UTIL": "0.3,0.4,0.5"}, err=err)
    assert e.value.code == 2
    assert ("ROLLOUT_GPU_MEM_UTIL=0.3,0.4,0.5 python run.py -m experiment=smoke (the same as: python run.py -m "
            "experiment=smoke rollout_gpu_mem_util=0.3,0.4,0.5)") in err.getvalue()
    err = io.StringIO()
    with pytest.raises(SystemExit):
        prepare(["run.py"], {"PROJECT_NAME": "my run,v2"}, err=err)
    assert "PROJECT_NAME=\"'my run,v2'\"" in err.getvalue()  # a name that holds a comma: how to quote it


def _guide_env(**extra):
    return {k: str(v) for k, v in extra.items()}


def test_guides_smoke_command_in_env_spelling_equals_the_preset():
    # SPEC.md "Commands": the guide's smoke test, written with the official script's variables
    env = _guide_env(MODEL_PATH="Qwen/Qwen3-0.6B", NGPUS_PER_NODE=4, TRAIN_BATCH_SIZE=32, PPO_MINI_BATCH_SIZE=16,
                     ROLLOUT_N=4, MAX_RESPONSE_LENGTH=512, ROLLOUT_TP=1, ROLLOUT_GPU_MEM_UTIL=0.4,
                     PROJECT_NAME="course_grpo", EXPERIMENT_NAME="smoke_qwen3_0_6b", MAX_PROMPT_LENGTH=1024)
    via_env, _ = compose_split("model=qwen3_0_6b", "trainer.total_training_steps=3", "trainer.val_before_train=false",
                               "save_freq=-1", "trainer.resume_mode=disable", environ=env)
    preset, _ = compose_split("experiment=smoke")
    assert via_env == preset


def test_guides_real_run_command_in_env_spelling_equals_the_preset():
    env = _guide_env(MODEL_PATH="Qwen/Qwen3-1.7B", NGPUS_PER_NODE=4, TRAIN_BATCH_SIZE=128, PPO_MINI_BATCH_SIZE=64,
                     ROLLOUT_N=5, MAX_PROMPT_LENGTH=512, MAX_RESPONSE_LENGTH=1024, ROLLOUT_TP=1,
                     ROLLOUT_GPU_MEM_UTIL=0.4, TOTAL_EPOCHS=2, TEST_FREQ=10, SAVE_FREQ=50,
                     PROJECT_NAME="course_grpo", EXPERIMENT_NAME="qwen3_1_7b_gsm8k")
    via_env, _ = compose_split(environ=env)
    preset, _ = compose_split("experiment=qwen3_1_7b_gsm8k")
    assert via_env == preset


def test_misspelt_environment_variable_is_pointed_out():
    err = io.StringIO()
    prepare(["run.py"], {"ROLLOUT_GPU_MEM_UTILS": "0.5", "PATH": "/bin"}, err=err)
    assert "ROLLOUT_GPU_MEM_UTILS" in err.getvalue() and "ROLLOUT_GPU_MEM_UTIL?" in err.getvalue()
    assert misspelt_env({"HOME": "/root", "PATH": "/bin", "ROLLOUT_N": "4"}) == {}


def test_misspelt_short_key_is_refused_with_the_right_name():
    err = io.StringIO()
    with pytest.raises(SystemExit) as e:
        prepare(["run.py", "train_batch_sise=4"], {}, err=err)
    assert e.value.code == 2 and "did you mean 'train_batch_size'" in err.getvalue()


def test_environment_sweep_under_m_plans_one_job_per_value(tmp_path):
    """The design's "Hydra multirun sweeps over ROLLOUT_GPU_MEM_UTIL" (issue 19 item 10): like the short key's sweep."""
    out = run_py("-m", "experiment=smoke", "preflight.only=true", f"hydra.sweep.dir={tmp_path}",
                 "~hydra.callbacks.sweep_summary", env={"ROLLOUT_GPU_MEM_UTIL": "0.3,0.4,0.5"})
    assert planned(out), out.stdout[-3000:] + out.stderr[-3000:]
    jobs = sorted(tmp_path.glob("job*"))
    got = [load_yaml(j / "verl_config.yaml")["actor_rollout_ref"]["rollout"]
           ["gpu_memory_utilization"] for j in jobs]
    assert got == [0.3, 0.4, 0.5]
    for job, value in zip(jobs, got):
        plan = json.loads((job / "plan.json").read_text())
        assert plan["errors"] == []
        changed = {c["key"]: c["set_by"] for c in plan["changed_defaults"]}
        if value != 0.5:  # (verl's own default is 0.5: not a changed default)
            assert changed["actor_rollout_ref.rollout.gpu_memory_utilization"] == "environment (ROLLOUT_GPU_MEM_UTIL)"


def test_environment_list_without_m_is_refused_with_the_sweep_command(tmp_path):
    out = run_py("experiment=smoke", f"hydra.run.dir={tmp_path / 'run'}", env={"ROLLOUT_GPU_MEM_UTIL": "0.3,0.4,0.5"})
    assert out.returncode == 2 and not (tmp_path / "run").exists()
    assert "ROLLOUT_GPU_MEM_UTIL=0.3,0.4,0.5 python run.py -m experiment=smoke" in out.stderr
    assert "python run.py -m experiment=smoke" in out.stderr and "rollout_gpu_mem_util=0.3,0.4,0.5)" in out.stderr


def test_a_value_given_twice_is_named_with_the_one_that_wins(tmp_path):
    """Issue 19 item 3: Hydra keeps the last silently; grpo-lab warns on the console and in plan.json."""
    out = run_py("preflight.only=true", f"hydra.run.dir={tmp_path}", "rollout_gpu_mem_util=0.3",
                 "rollout_gpu_mem_util=0.5", "model=qwen3_4b", "model=qwen3_0_6b",
                 "actor_rollout_ref.actor.optim.lr=3e-6", "actor_lr=2e-6", "rollout_n=4", env={"ROLLOUT_N": "3"})
    assert planned(out), out.stdout[-3000:] + out.stderr[-3000:]
    expected = [
        "ROLLOUT_N=3 in the environment is ignored: the command line sets the same value, and its rollout_n=4 wins",
        "actor_lr (2e-6) and its verl key actor_rollout_ref.actor.optim.lr (3e-6) are both given: the verl key's 3e-6 "
        "wins, whatever the order",
        "rollout_gpu_mem_util is given 2 times on the command line (0.3, then 0.5): the last, 0.5, wins",
        "model is given 2 times on the command line (qwen3_4b, then qwen3_0_6b): the last, qwen3_0_6b, wins",
    ]
    for text in expected:
        assert f"grpo-lab: warning: {text}" in out.stderr, (text, out.stderr)
    recorded = [w["message"] for w in json.loads((tmp_path / "plan.json").read_text())["warnings"]
                if w["rule"] == "key_given_twice"]
    assert len(recorded) == 4 and all(any(m.startswith(t) for m in recorded) for t in expected), recorded
    # and what the warnings say won is what verl gets
    verl = load_yaml(tmp_path / "verl_config.yaml")
    a = verl["actor_rollout_ref"]
    assert (a["rollout"]["gpu_memory_utilization"], a["rollout"]["n"], a["actor"]["optim"]["lr"]) == (0.5, 4, 3e-6)
    assert a["model"]["path"] == "Qwen/Qwen3-0.6B"


def test_one_value_once_gives_no_warning():
    cli = parse(["rollout_gpu_mem_util=0.3", "+actor_rollout_ref.model.override_config.x=1", "~trainer.logger",
                 "+trainer.logger=[console]"], {"ROLLOUT_N": "3"})
    assert cli.warnings == []
