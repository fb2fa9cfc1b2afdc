"""Fixes that fix (grpo_lab/checks/fixes.py): for a corpus of bad configurations, each written in every spelling a user
may use (short key, verl key, the official script's environment variable), the fix
`python run.py ... preflight.only=true` prints, appended to that same command as typed (the environment kept), passes
the preflight. A config file's spelling: through Hydra's --config-dir/--config-name. The fixer's parts at function level
below."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, composed, planned, run_py

from grpo_lab import facts
from grpo_lab.checks import fixes
from grpo_lab.checks.preflight import run_preflight
from grpo_lab.cli.apply import Change
from grpo_lab.cli.knobs import KNOBS
from grpo_lab.memory.run import Run
from grpo_lab.verl_keys import get

STATIC = ("actor_rollout_ref.actor.use_dynamic_bsz=false", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
          "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false")
# verl's deprecated legacy trainer: it pads nothing (grpo_lab/checks/rules/batch.py Mode)
LEGACY = ("trainer.use_v1=false",)
H200 = ("experiment=smoke_tiny", "hardware=h200x1")

# (overrides, the error rule(s) it must raise): the cases first, then one per error rule. A batch shape verl's
# V1 trainer pads (grpo-lab's default mode: V1 with dynamic batching) is refused in the mode where verl 0.9.1 fails on
# it, static batching (STATIC) or the legacy trainer (LEGACY); WARNED below has the default mode's warnings
CORPUS: list[tuple[tuple[str, ...], set[str]]] = [
    (("ngpus_per_node=3",), {"mini_batch_divisibility"}),
    ((*STATIC, "ngpus_per_node=3"), {"batch_divisibility", "mini_batch_divisibility"}),
    ((*H200, "ngpus_per_node=0"), {"value_range"}),
    (("actor_lr=-1e-6",), {"value_range"}),
    (("actor_lr=abc",), {"value_types"}),
    (("speed=fused", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"), {"fused_sum_pi_squared"}),
    (("rollout_n=1", "algorithm.adv_estimator=grpo_passk"), {"group_size"}),
    (("total_epochs=-1",), {"value_range"}),
    (("max_response_length=0",), {"value_range"}),
    (("train_batch_size=abc",), {"value_types"}),
    (("ppo_mini_batch_size=7",), {"mini_batch_divisibility"}),
    ((*LEGACY, "ppo_mini_batch_size=7"), {"mini_batch_divisibility", "updates_per_step_integer"}),
    ((*STATIC, "train_batch_size=32"), {"train_batch_vs_mini_batch"}),
    ((*LEGACY, "train_batch_size=32"), {"train_batch_vs_mini_batch"}),
    ((*STATIC, "train_batch_size=130", "ppo_mini_batch_size=65"), {"batch_divisibility", "mini_batch_divisibility"}),
    (("rollout_tp=3",), {"rollout_parallel"}),
    ((*STATIC, "ppo_micro_batch_size_per_gpu=3"), {"micro_batch"}),
    ((*STATIC, "actor_rollout_ref.actor.ppo_micro_batch_size=8"), {"micro_batch"}),
    ((*STATIC, "log_prob_micro_batch_size_per_gpu=3"), {"log_prob_micro_batch"}),
    (("ppo_max_token_len_per_gpu=1000",), {"token_budget"}),
    (("rollout_gpu_mem_util=1.5",), {"gpu_memory_utilization_range"}),
    ((*H200, "ray_kwargs.ray_init.num_cpus=8", "transfer_queue.backend.SimpleStorage.num_data_storage_units=8"),
     {"ray_cpus"}),
    ((*H200, "++ray_kwargs.ray_init.address=auto"), {"ray_join_num_cpus"}),
    (("++ray_kwargs.ray_init.runtime_env.env_vars.FOO=1",), {"ray_env_vars"}),
    (("actor_rollout_ref.actor.use_dynamic_bsz=false",), {"dynamic_bsz_mismatch"}),
    # (+actor_rollout_ref.model.use_remove_paddin=true: refused on the command line before composing, by
    #  grpo_lab/cli/overrides.py; the model_key_unknown rule, for such a key in a config file, is in test_preflight.py)
    (("variant=dapo", "algorithm.filter_groups.metric=null"), {"dapo_filter_metric"}),
    (("model=qwen3_8b_lora", "actor_rollout_ref.model.lora_rank=0"), {"full_finetune_too_big"}),
    (("model=qwen3_4b", "rollout_gpu_mem_util=0.85"), {"memory_generation"}),
    (("model=qwen3_4b", "actor_rollout_ref.rollout.max_model_len=null"), {"vllm_kv_cache"}),
    (("lab.hardware.host_ram_gb=34",), {"memory_host_ram"}),
    (("ngpus_per_node=3", "actor_lr=-1", "rollout_gpu_mem_util=1.5"),
     {"mini_batch_divisibility", "value_range", "gpu_memory_utilization_range"}),
    # issue 19 item 1: a value typed in verl's spelling got a fix in the short spelling, which loses to it
    (("total_epochs=two",), {"value_types"}),
    ((*LEGACY, "data.train_batch_size=100", "rollout_n=3"), {"updates_per_step_integer"}),
    # issue 28 item 2: a length that is no number was an OmegaConf traceback (vLLM's max_model_len is built from it)
    (("max_response_length=abc",), {"value_types"}),
]

# (overrides, the warning rule, what its message says): what verl 0.9.1 runs in grpo-lab's default mode (the V1
# trainer with dynamic batching), so planned, with a warning and its re-checked fix (the refused forms are in CORPUS)
WARNED: list[tuple[tuple[str, ...], str, str]] = [
    (("train_batch_size=32",), "train_batch_vs_mini_batch", "padded with 160 synthetic no-op samples to 320"),
    (("data.train_batch_size=100", "rollout_n=3"), "updates_per_step_integer", "padded with 84 synthetic no-op"),
    (("train_batch_size=130", "ppo_mini_batch_size=64"), "batch_divisibility",
     "32% of each step's samples are padding"),
    (("rollout_n=1",), "group_size", "the raw score as the advantage, no baseline"),
    (("actor_lr=0",), "learning_rate_zero", "the actor never changes"),
    (("actor_rollout_ref.model.use_remove_padding=false",), "padded_with_flash_attn", "the padding only adds tokens"),
    (("actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",), "dynamic_bsz_mismatch", "so this runs"),
    (("variant=dapo", "max_response_length=256", "reward.reward_kwargs.overlong_buffer_cfg.len=256"),
     "dapo_overlong_buffer", "every answer, however short, gets a penalty"),
]


def check(verl, lab, launching=False, environ=None):
    return run_preflight(Run.build(verl, lab, {} if environ is None else environ), launching=launching)


def test_ngpus_per_node_3_gets_one_fix_that_keeps_two_updates():
    """The issue's acceptance example: train batch and mini-batch change together (126 = 2 x 63, 63 x 5 / 3 = 105).
    In the default mode (verl's V1 trainer, dynamic batching) the mini-batch is refused and the step's padding warned
    about, with the same fix; the legacy trainer refuses both, with one fix for both."""
    r = check(*composed("ngpus_per_node=3"))
    assert [p.rule for p in r.errors] == ["mini_batch_divisibility"]
    (w,) = [p for p in r.warnings if p.rule == "batch_divisibility"]
    assert "padded with 320 synthetic no-op samples to 960" in w.message
    for p in (*r.errors, w):
        assert p.alternatives[0] == "train_batch_size=126 ppo_mini_batch_size=63"
        assert "ngpus_per_node=2" in p.alternatives
    r2 = check(*composed("ngpus_per_node=3", "train_batch_size=126", "ppo_mini_batch_size=63"))
    assert r2.ok and r2.batch["updates_per_step"] == 2 and r2.batch["trajectories_per_gpu"] == 105
    assert r2.batch["padding"]["samples"] == 0 and "batch_divisibility" not in {p.rule for p in r2.warnings}
    r = check(*composed(*LEGACY, "ngpus_per_node=3"))
    assert {p.rule for p in r.errors} == {"batch_divisibility", "mini_batch_divisibility"}
    # (630 generation requests do not split over its 8 agent loop workers: agent_loop_workers' fix joins in)
    assert r.fix_all == "train_batch_size=126 ppo_mini_batch_size=63 actor_rollout_ref.rollout.agent.num_workers=7"


def test_a_fix_that_causes_a_new_error_is_combined_or_replaced():
    """rollout_n=1's plain fix (rollout_n=5) on 3 GPUs would break the batch split: the printed fix carries both."""
    shape = ("rollout_n=1", "algorithm.adv_estimator=grpo_passk", "ngpus_per_node=3", "train_batch_size=126",
             "ppo_mini_batch_size=63")
    r = check(*composed(*shape))
    p = next(p for p in r.errors if p.rule == "group_size")
    assert check(*composed(*shape, *shlex.split(p.alternatives[0]))).ok


def test_no_single_fix_is_said_plainly(monkeypatch):
    """When re-checking finds no alternative that passes, the fix says so instead of printing one that fails."""
    from grpo_lab.checks.rules import Problem

    verl, lab = composed(*LEGACY, "ngpus_per_node=3")  # the legacy trainer: 129 is not whole mini-batches either
    checker = fixes.FixChecker(Run.build(verl, lab, {}), launching=False, problems=check(verl, lab).errors)
    p = checker.check(Problem("batch_divisibility", "x", "train_batch_size=129"))
    assert p.fix.startswith("no single fix is known: train_batch_size=129 still fails")
    assert p.checked == "re-checked: no single fix passes"


def test_words_and_group_choices_are_not_applied_but_marked():
    verl, lab = composed()
    checker = fixes.FixChecker(Run.build(verl, lab, {}), launching=False, problems=[])
    from grpo_lab.checks.rules import Problem

    p = checker.check(Problem("x", "y", "model=qwen3_4b  or  point train_file at a parquet file", "warn"))
    assert p.fix == "model=qwen3_4b  or  point train_file at a parquet file"
    assert p.checked.startswith("not re-checked")


def test_apply_follows_derived_values():
    """A fix that changes the response length re-derives vLLM's max_model_len (prompt + response), as conf does."""
    verl, lab = composed()
    v, _ = fixes.apply(verl, lab, fixes.parse("max_response_length=2048"))
    assert v["data"]["max_response_length"] == 2048 and v["actor_rollout_ref"]["rollout"]["max_model_len"] == 2560
    # a short key sets every verl key conf/config.yaml builds from it (log-prob micro-batch: rollout and ref)
    v, _ = fixes.apply(verl, lab, fixes.parse("log_prob_micro_batch_size_per_gpu=4"))
    assert v["actor_rollout_ref"]["rollout"]["log_prob_micro_batch_size_per_gpu"] == 4
    assert v["actor_rollout_ref"]["ref"]["log_prob_micro_batch_size_per_gpu"] == 4
    # the input is not changed
    assert verl["data"]["max_response_length"] == 1024
    assert fixes.parse("model=qwen3_4b") is None and fixes.parse("run on the GPU machine") is None


def test_a_verl_key_set_on_its_own_gets_its_fix_by_that_name():
    """trainer.total_epochs=two typed: the short key no longer reaches it, so the fix names the verl key."""
    verl, lab = composed("trainer.total_epochs=two")
    assert _short(lab.set_apart) == {"total_epochs": ["trainer.total_epochs"]}
    (p,) = [p for p in check(verl, lab).errors if p.rule == "value_types"]
    assert p.fix == "trainer.total_epochs=1" and p.checked.startswith("re-checked: the preflight passes")
    assert _short(composed("total_epochs=two")[1].set_apart) == {}  # the short key typed: nothing set apart


def test_apply_and_respell_follow_what_composing_does_with_keys_set_apart():
    """The ref's log-prob micro-batch reads the rollout's; typed on its own, the short key reaches only the rollout's
    (as Hydra composes it), and a fix in the short spelling gets the ref's key added."""
    ref = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
    roll = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    verl, lab = composed(*STATIC, f"{ref}=3")
    assert _short(lab.set_apart) == {"log_prob_micro_batch_size_per_gpu": [ref]}
    applied, _ = fixes.apply(verl, lab, fixes.parse("log_prob_micro_batch_size_per_gpu=4"))
    by_compose, _ = composed(*STATIC, f"{ref}=3", "log_prob_micro_batch_size_per_gpu=4")
    assert applied == by_compose and get(applied, ref) == 3 and get(applied, roll) == 4
    assert fixes.respell(fixes.parse("log_prob_micro_batch_size_per_gpu=4"), lab.set_apart) == [
        Change("log_prob_micro_batch_size_per_gpu", 4), Change(ref, 4)]
    # the rollout's key typed: the ref's still follows it, so the fix names the rollout's key alone
    verl, lab = composed(*STATIC, f"{roll}=3")
    assert fixes.respell(fixes.parse("log_prob_micro_batch_size_per_gpu=4"), lab.set_apart) == [Change(roll, 4)]
    applied, _ = fixes.apply(verl, lab, [Change(roll, 4)])
    assert applied == composed(*STATIC, f"{roll}=3", f"{roll}=4")[0]
    # verl's log-prob budgets read the update's, but conf/speed/fast.yaml sets all three: a new update budget leaves
    # them as composing does, even where their values are equal (16384)
    upd = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    verl, lab = composed(*STATIC)
    assert lab.set_apart[upd] == ["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                                  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
    applied, _ = fixes.apply(verl, lab, [Change(upd, 8192)])
    assert applied == composed(*STATIC, f"{upd}=8192")[0]
    assert get(applied, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu") == 16384


def _short(apart: dict) -> dict:
    """set_apart's entries of the short keys (conf/config.yaml's `${key}`s)."""
    from grpo_lab.cli.knobs import SHORT_KEYS

    return {k: v for k, v in apart.items() if k in SHORT_KEYS}


def test_visible_gpus_fix_rechecked_at_launch(monkeypatch):
    monkeypatch.setattr(facts, "module_available", lambda name: True)
    monkeypatch.setattr(facts, "_proc_gpus", lambda: 4)
    verl, lab = composed()
    r = check(verl, lab, launching=True, environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    p = next(p for p in r.errors if p.rule == "visible_gpus")
    assert p.fix == "ngpus_per_node=2" and p.checked.startswith("re-checked: the preflight passes")


# ---- through run.py: the printed fix appended to the command as typed, in each spelling ----------------------------

KNOB = {k.key: k for k in KNOBS}


def spellings(overrides: tuple[str, ...]) -> list[tuple[str, tuple[str, ...], dict[str, str]]]:
    """(spelling, argv, environment) of one case: as written, every short key as its verl key, every short key as its
    environment variable (the last two only when the case has a short key)."""
    out = [("as written", overrides, {})]
    short = [o for o in overrides if o.split("=", 1)[0] in KNOB]
    if short:
        out.append(("verl key", tuple(f"{KNOB[o.split('=', 1)[0]].verl_key}={o.split('=', 1)[1]}" if o in short else o
                                      for o in overrides), {}))
        out.append(("env var", tuple(o for o in overrides if o not in short),
                    {KNOB[k].env: v for k, v in (o.split("=", 1) for o in short)}))
    return out


SPELLED = [(name, argv, env, expected) for overrides, expected in CORPUS for name, argv, env in spellings(overrides)]


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


def plan_fix(plan: dict) -> str:
    """What a user would type: `Fix all ... together` with several errors, else the error's first alternative."""
    if "fix_all" in plan:
        assert plan["fix_all"]["passes"], plan["fix_all"]
        return plan["fix_all"]["overrides"]
    (e,) = plan["errors"]
    return e["fix"].split("  or  ")[0]


@pytest.mark.parametrize("spelling,argv,env,expected", SPELLED,
                         ids=[f"{n}: {' '.join(filter(None, [_env_text(e), *a]))}" for n, a, e, _ in SPELLED])
def test_the_printed_fix_passes_appended_to_the_command_as_typed(tmp_path, spelling, argv, env, expected):
    bad = run_py("preflight.only=true", f"hydra.run.dir={tmp_path / 'bad'}", *argv, env=env)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
    plan = json.loads((tmp_path / "bad" / "plan.json").read_text())
    assert expected <= {e["rule"] for e in plan["errors"]}, bad.stdout
    for e in plan["errors"]:
        assert e["fix"] and e.get("checked", "").startswith("re-checked: the preflight passes"), e
    fix = plan_fix(plan)
    assert f"fix: {fix}" in bad.stdout or f"together: {fix}" in bad.stdout
    good = run_py("preflight.only=true", f"hydra.run.dir={tmp_path / 'good'}", *argv, *shlex.split(fix), env=env)
    assert planned(good), (fix, good.stdout + good.stderr)


# issue 28 item 2: wrong types and ranges of the numbers verl needs, several per key in one sweep (one process): every
# job is refused naming the key, none raises (a micro-batch of "abc" was a ValueError in the memory plan)
WRONG_NUMBERS = {"max_prompt_length": ("abc", "-16", "1.5", "null"), "ppo_micro_batch_size_per_gpu": ("abc", "[1,2]"),
                 "entropy_coeff": ("abc", "null"), "test_freq": ("1.5", "true")}


@pytest.mark.parametrize("key,values", WRONG_NUMBERS.items(), ids=list(WRONG_NUMBERS))
def test_a_wrong_number_is_refused_naming_its_key_in_every_job_of_a_sweep(tmp_path, key, values):
    out = run_py("-m", "preflight.only=true", f"{key}={','.join(values)}", f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    plans = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("job*/plan.json"))]
    assert len(plans) == len(values)
    for value, plan in zip(values, plans):
        named = [e for e in plan["errors"] if e["rule"] in ("value_types", "value_range")
                 and e["message"].startswith(KNOB[key].verl_key + "=")]
        assert named and named[0]["fix"].startswith(f"{key}="), (value, plan["errors"])


def test_a_wrong_length_in_each_spelling_is_refused_in_seconds(tmp_path):
    """The issue's three spellings in one command: each length named and refused, in seconds of the child's CPU time
    (nothing heavy started); the 2 s target is benchmarks/preflight_speed.py's to show, not a timed test's."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run_py("preflight.only=true", "max_response_length=abc", "data.max_prompt_length=abc",
                 f"hydra.run.dir={tmp_path}", env={"MAX_PROMPT_LENGTH": "abc"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    errors = json.loads((tmp_path / "plan.json").read_text())["errors"]
    assert {e["message"].split("=", 1)[0] for e in errors} == {"data.max_response_length", "data.max_prompt_length"}
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 10  # Ray or verl: far more


@pytest.mark.parametrize("argv,rule,says", WARNED, ids=[" ".join(a) for a, _, _ in WARNED])
def test_what_verl_runs_is_planned_with_a_warning_and_its_fix(tmp_path, argv, rule, says):
    """Not refused: run.py plans it (exit 3 on this CPU machine: not ready to launch here), the warning in plan.json
    says what verl does with it, and its fix, appended to the same command, clears it (re-checked)."""
    out = run_py("preflight.only=true", f"hydra.run.dir={tmp_path}", *argv)
    assert planned(out), out.stdout[-3000:] + out.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert not plan["errors"], plan["errors"]
    (w,) = [w for w in plan["warnings"] if w["rule"] == rule and says in w["message"]]
    assert "verl 0.9.1" in w["message"] or "verl's V1 trainer" in w["message"], w["message"]
    assert w["checked"].startswith("re-checked: the preflight passes"), w
    fix = shlex.split(w["fix"].split("  or  ")[0])
    r = run_preflight(Run.build(*composed(*argv, *fix), {}), launching=False)
    assert r.ok and not [p for p in r.warnings if p.rule == rule and says in p.message], (fix, r.format())


@pytest.mark.parametrize("file_text,expected", [
    ("trainer:\n  total_epochs: two\n", "trainer.total_epochs=1"),
    ("actor_rollout_ref:\n  rollout:\n    gpu_memory_utilization: 1.5\n",
     "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"),
    ("rollout_gpu_mem_util: 1.5\n", "rollout_gpu_mem_util=0.4"),  # the short key in the file: the short key wins
    ("data:\n  max_response_length: abc\n", "data.max_response_length=1024"),
], ids=["verl key total_epochs", "verl key gpu_memory_utilization", "short key", "verl key max_response_length"])
def test_a_fix_for_a_value_in_a_config_file_passes(tmp_path, file_text, expected):
    """A user's own config file (Hydra's --config-dir/--config-name, on top of grpo-lab's config): the fix names the
    key in the spelling that wins over the file."""
    (tmp_path / "mine.yaml").write_text("defaults:\n  - config\n  - _self_\n\n" + file_text)
    argv = ("--config-dir", str(tmp_path), "--config-name", "mine", "preflight.only=true")
    bad = run_py(*argv, f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    fix = plan_fix(json.loads((tmp_path / "bad" / "plan.json").read_text()))
    assert fix == expected and f"fix: {fix}" in bad.stdout
    good = run_py(*argv, f"hydra.run.dir={tmp_path / 'good'}", *shlex.split(fix))
    assert planned(good), good.stdout + good.stderr


def test_non_parquet_train_file_is_refused(tmp_path):
    bad = tmp_path / "train.csv"
    bad.write_text("prompt,answer\n1+1,2\n")
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    def with_train(path):
        verl, lab = composed()  # (composed() points the data at /nonexistent; the train file is set here)
        verl["data"]["train_files"] = str(path)
        return check(verl, lab)

    for f in (bad, fake):
        p = next(p for p in with_train(f).errors if p.rule == "data_files")
        assert str(f) in p.message and "make data" in p.fix and "not re-checked" in p.checked
    real = tmp_path / "ok.parquet"
    pq.write_table(pa.table({"x": list(range(200))}), real)
    r = with_train(real)
    assert "data_files" not in {p.rule for p in r.errors} and r.batch["train_rows"] == 200


# ---- "Fix all" only when it passes; else make fit with the user's own arguments (issue 28, item 5) ----

def _balanced(line: str) -> bool:
    depth = 0
    for ch in line:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return False
    return depth == 0


def _make_fit(args: str, tmp_path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "fit", f"PY={sys.executable}",
                           f"ARGS={args} hydra.run.dir={tmp_path / name}"], cwd=ROOT, text=True, capture_output=True,
                          timeout=120)


def test_a_fix_all_that_leaves_errors_is_not_offered_and_make_fit_takes_the_users_own_arguments(tmp_path):
    """A 40,000-token answer on 32 GB cards: each token budget below one sequence; the actor's fix alone is out of
    memory, and all the fixes together too. No "Fix all": the pointer to make fit with the arguments as typed, and
    that make fit searches (it raises the budgets itself) instead of sending the user back to the preflight."""
    args = "model=qwen3_1_7b speed=guide data.max_response_length=40000"  # the script's unfused log-prob
    proc = run_py(*args.split(), "preflight.only=true", f"hydra.run.dir={tmp_path / 'plan'}")
    assert proc.returncode == 2, proc.stdout[-3000:]
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert "fix_all" not in plan and "Fix all" not in proc.stdout
    pointer = f'make fit ARGS="{args}"'
    assert plan["fit"]["command"] == pointer and pointer in proc.stdout
    assert "No fix above clears every error together: with all of them (" in proc.stdout
    assert "the preflight still says: [memory_training] training phase: predicted peak" in plan["fit"]["why"]
    cut = [line for line in proc.stdout.splitlines() if not _balanced(line)]  # a quote cut mid-sentence leaves one open
    assert cut == [], cut
    still = [p["fix"] for p in plan["errors"] if p["fix"].startswith("no single fix is known")]
    assert still and all(re.search(r"still fails \(\[memory_training\] .*\)\); change these values", f) for f in still)

    fit = _make_fit(args, tmp_path, "fit")
    assert "fix these first" not in fit.stdout, fit.stdout[-3000:]
    assert "What would fit (nothing tried fits these cards)" in fit.stdout
    assert "a bigger card: full fine-tuning fits" in fit.stdout and (tmp_path / "fit" / "fit.json").is_file()
    # the budgets raised to one sequence are the fit's own first move when something fits
    fit = _make_fit("model=qwen3_1_7b data.max_response_length=20000", tmp_path, "fit2")  # above 16384
    assert fit.returncode == 0, fit.stdout[-3000:]
    assert "token budgets of one sequence: required, not a choice" in fit.stdout
    command = re.search(r"^The command:\n  (python run\.py .*)$", fit.stdout, re.M).group(1)
    after = run_py(*shlex.split(command)[2:], "preflight.only=true", f"hydra.run.dir={tmp_path / 'after'}")
    assert planned(after), after.stdout[-3000:]


def test_a_fix_that_switches_to_lora_carries_the_warning_make_fit_gives(tmp_path):
    args = "model=qwen3_8b_lora actor_rollout_ref.model.lora_rank=0"  # Qwen3-8B, full fine-tuning asked for
    proc = run_py(*args.split(), "preflight.only=true", f"hydra.run.dir={tmp_path / 'plan'}")
    fit = _make_fit(args, tmp_path, "fit")
    assert fit.returncode == 0
    assert "this command trains LoRA adapters instead: WHAT IS TRAINED CHANGES !!!" in fit.stdout
    words = re.search(r"^     (LoRA: CHANGES WHAT IS TRAINED: .*)$", fit.stdout, re.M).group(1)
    lines = proc.stdout.splitlines()
    fixes = [i for i, line in enumerate(lines) if re.match(r"\s+fix: |Fix all \d+ errors together: ", line)]
    lora = [i for i in fixes if "lora_rank=64" in lines[i]]
    assert len(lora) >= 2 and any(lines[i].startswith("Fix all") for i in lora), proc.stdout[-3000:]
    for i in fixes:
        after = lines[i + 2:i + 4]  # below the fix and its re-check
        warned = bool(after) and after[0].strip() == "!!! LoRA: this fix trains LoRA adapters instead: WHAT IS " \
                                                     "TRAINED CHANGES !!!"
        assert warned == (i in lora), lines[i:i + 4]
        if warned:
            assert after[1].strip() == words
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert all("WHAT IS TRAINED CHANGES" in e["caution"] for e in plan["errors"] if "lora_rank=64" in e["fix"])


# ---- issue 43: a fix of a key the user added with +, appended to the command as typed ----

ATTN = "actor_rollout_ref.model.override_config.attn_implementation"


@pytest.mark.skipif(facts.module_available("flash_attn"), reason="flash-attn installed: nothing to fix")
def test_a_key_the_user_added_gets_its_fix_with_two_pluses(tmp_path):
    """The user's own +key: Hydra's + cannot add it again, so the fix is ++key, and the message says what they set.
    Their own second +key is refused before composing with the ++ spelling (not a 'given 2 times' warning)."""
    argv = ("preflight.only=true", "experiment=smoke", "hardware=h100x1", f"+{ATTN}=flash_attention_2")
    bad = run_py(*argv, f"hydra.run.dir={tmp_path / 'bad'}")
    (p,) = [n for n in json.loads((tmp_path / "bad" / "plan.json").read_text())["not_ready_here"]
            if n["rule"] == "flash_attn_missing"]
    assert p["command"] == f"++{ATTN}=sdpa" and f"fix: ++{ATTN}=sdpa" in bad.stdout, bad.stdout[-3000:]
    assert f"({ATTN}=flash_attention_2)" in p["message"] and "verl's default" not in p["message"]
    good = run_py(*argv, *shlex.split(p["command"]), f"hydra.run.dir={tmp_path / 'good'}")
    assert planned(good) and "[flash_attn_missing]" not in good.stdout, good.stdout[-3000:] + good.stderr
    assert "the last, sdpa, wins" in good.stderr
    twice = run_py(*argv, f"+{ATTN}=sdpa", f"hydra.run.dir={tmp_path / 'twice'}")
    assert twice.returncode == 2 and f"write ++{ATTN}=sdpa" in twice.stderr, twice.stderr[-2000:]
    assert "given 2 times" not in twice.stderr and not (tmp_path / "twice").exists()


def test_the_flash_attn_fix_names_the_key_that_sets_it(monkeypatch):
    """Set under override_config.model_config: the fix changes that key, in the spelling that sets it again."""
    monkeypatch.setattr(facts, "module_available", lambda name: False)
    key = ATTN.replace(".attn_implementation", ".model_config.attn_implementation")
    r = check(*composed(f"+{key}=flash_attention_2"), launching=True)
    (p,) = [p for p in r.errors if p.rule == "flash_attn_missing"]
    assert p.fix == f"++{key}=sdpa" and f"({key}=flash_attention_2)" in p.message


def test_a_kv_cache_pin_too_big_gets_a_fix_of_that_pin(tmp_path):
    """The user's +kv_cache_memory_bytes is the cause: the fix sets that key (++: they added it) to the KV cache the
    memory plan gives vLLM without it, re-checked; appended to the command, the plan holds."""
    from grpo_lab.launch.prepare import KEY
    from grpo_lab.memory.run import Run, planned_kv_bytes

    argv = ("preflight.only=true", "experiment=smoke", "hardware=h100x1", f"+{KEY}=900000000000")
    bad = run_py(*argv, f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2, bad.stdout[-3000:]
    (e,) = json.loads((tmp_path / "bad" / "plan.json").read_text())["errors"]
    planned_kv = planned_kv_bytes(Run.build(*composed("experiment=smoke", "hardware=h100x1"), {}).memory)
    assert e["rule"] == "memory_generation" and e["fix"] == f"++{KEY}={planned_kv}", e
    assert e["checked"].startswith("re-checked: the preflight passes") and f"fix: {e['fix']}" in bad.stdout
    good = run_py(*argv, e["fix"], f"hydra.run.dir={tmp_path / 'good'}")
    assert planned(good), good.stdout[-3000:] + good.stderr


def test_the_plans_lora_remedy_appended_as_typed_passes_the_lora_rules(tmp_path):
    """The memory plan's LoRA remedy (plan.json `remedies`, the doctor's memory advice) on an FSDP1 actor carries FSDP2:
    appended to the command, no LoRA rule refuses it (without it, lora_fsdp1_adapter did, peft >= 0.21)."""
    argv = ["model=qwen3_4b", "hardware=rtx4080_16gbx4", "preflight.only=true"]
    bad = run_py(*argv, f"hydra.run.dir={tmp_path / 'bad'}")
    assert "Traceback" not in bad.stdout + bad.stderr, bad.stderr[-3000:]
    plan = json.loads((tmp_path / "bad" / "plan.json").read_text())
    (lora,) = [r["override"] for r in plan["memory"]["remedies"]["training"] if "lora_rank=64" in r["override"]]
    assert "actor_rollout_ref.actor.strategy=fsdp2" in lora
    good = run_py(*argv, *shlex.split(lora), f"hydra.run.dir={tmp_path / 'good'}")
    after = json.loads((tmp_path / "good" / "plan.json").read_text())
    assert not [e["rule"] for e in after["errors"] if e["rule"].startswith("lora_")], good.stdout[-3000:]
