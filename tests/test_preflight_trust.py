"""What the preflight must not wave through (issue 28, "Trust, third pass"), through `python run.py` as a user types
it: a plan with no card size (no memory verdict), keys verl 0.9.1 takes and never reads."""

from __future__ import annotations

import json
import shlex

from conftest import ROOT, composed, planned, run_py

from grpo_lab.checks.preflight import run_preflight
from grpo_lab.memory.run import Run

H16_4B = ("hardware=rtx4080_16gbx4", "model=qwen3_4b")


def _refused(tmp_path, name: str, *args: str) -> tuple[dict, str]:
    """python run.py preflight.only=true ARGS, refused without a traceback: (plan.json, stdout)."""
    out = run_py("preflight.only=true", *args, f"hydra.run.dir={tmp_path / name}")
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads((tmp_path / name / "plan.json").read_text()), out.stdout


def test_no_card_size_is_refused_not_planned_as_ok(tmp_path):
    """lab.hardware.gpu_memory_gb 0, -16 or null gave "memory plan skipped" and "plan OK", even for a 4B on 16 GB
    cards that the 16 GB card refuses with five memory errors: each is refused, with the hardware option's size."""
    for name, value, args, size in (("null", "null", H16_4B, "16"), ("neg", "-16", (), "32"), ("zero", "0", (), "32")):
        plan, stdout = _refused(tmp_path, name, *args, f"lab.hardware.gpu_memory_gb={value}")
        (e,) = plan["errors"]
        assert e["rule"] == "card_memory_unknown" and "phases" not in plan["memory"], plan["errors"]
        assert e["message"].startswith(f"lab.hardware.gpu_memory_gb={value} is no card size")
        assert f"says {size}" in e["message"] and e["fix"].startswith(f"lab.hardware.gpu_memory_gb={size}")
    # the guide's machine: its card size alone, printed and appended as typed, plans with a memory verdict
    assert e["fix"] == "lab.hardware.gpu_memory_gb=32" and f"fix: {e['fix']}" in stdout
    good = run_py("preflight.only=true", "lab.hardware.gpu_memory_gb=0", *shlex.split(e["fix"]),
                  f"hydra.run.dir={tmp_path / 'good'}")
    assert planned(good) and "Memory plan per GPU (32 GB cards" in good.stdout, good.stdout[-2000:]


# ---- item 1: keys verl 0.9.1 takes and never reads (docs/verl_unread_keys.md) -------------------------------------

STRICT_FORMAT = ROOT / "grpo_lab" / "tasks" / "rewards" / "strict_format.py"
# verl's DAPO recipe's own reward lines (recipe/dapo/test_dapo_7b_math.sh), in the older top-level spelling
DAPO_LEGACY_REWARD = ("reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                      "+reward_model.reward_kwargs.overlong_buffer_cfg.len=256",
                      "+reward_model.reward_kwargs.max_resp_len=1024")
# (override, the key verl reads instead, as the fix names it): one of each kind of UNREAD
UNREAD_CASES = (
    (f"custom_reward_function.path={STRICT_FORMAT}", f"reward.custom_reward_function.path={STRICT_FORMAT}"),
    ("actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.optim.clip_grad=0.5"),
    ("global_profiler.global_tool_config.precision_debugger.steps=[1,2]", "global_profiler.steps=[1,2]"),
    ("actor_rollout_ref.rollout.over_sample_rate=0.1", "actor_rollout_ref.rollout.over_sample_rate=0"),
    ("trainer.balance_batch=false", "trainer.balance_batch=true"),
)


def test_the_older_reward_keys_are_refused_not_planned_as_ok(tmp_path):
    """custom_reward_function.path=/tmp/nonexistent.py gave "plan OK" and trained with verl's default scorer."""
    plan, stdout = _refused(tmp_path, "issue", "custom_reward_function.path=/tmp/nonexistent.py")
    (e,) = plan["errors"]
    assert e["rule"] == "key_unread" and "verl/trainer/ppo/reward.py" in e["message"]
    assert "verl reads reward.custom_reward_function.path instead, which is null here" in e["message"]
    assert "fully_async_main.py" in e["message"] and "plan OK" not in stdout


def test_keys_verl_never_reads_are_refused_with_the_key_it_reads_and_the_fix_works_as_typed(tmp_path):
    args = (*(a for a, _ in UNREAD_CASES), *DAPO_LEGACY_REWARD)
    plan, stdout = _refused(tmp_path, "bad", *args)
    errors = {e["message"].split("=", 1)[0]: e for e in plan["errors"]}
    assert {e["rule"] for e in plan["errors"]} == {"key_unread"} and len(errors) == len(args)
    for arg, fix in UNREAD_CASES:
        e = errors[arg.split("=", 1)[0]]
        assert shlex.split(e["fix"].split("  or  ")[0]) == [fix], e  # as typed in a shell (brackets quoted)
        assert e["checked"].startswith("re-checked: the preflight passes")
        assert "verl/" in e["message"]  # the file of verl that shows it
    assert errors["reward_model.reward_manager"]["fix"] == "reward.reward_manager.name=dapo"
    assert errors["reward_model.reward_kwargs.max_resp_len"]["fix"] == "+reward.reward_kwargs.max_resp_len=1024"
    assert plan["fix_all"]["passes"] and f"together: {plan['fix_all']['overrides']}" in stdout
    good = run_py("preflight.only=true", *args, *shlex.split(plan["fix_all"]["overrides"]),
                  f"hydra.run.dir={tmp_path / 'good'}")
    assert planned(good), good.stdout[-3000:]


def test_a_key_only_the_legacy_trainer_reads_is_left_alone_under_it():
    verl, lab = composed("trainer.balance_batch=false", "trainer.use_v1=false", "actor_rollout_ref.actor.grad_clip=1.0")
    assert "key_unread" not in {p.rule for p in run_preflight(Run.build(verl, lab, {}), launching=False).errors}
