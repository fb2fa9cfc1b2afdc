"""The custom reward file is imported and called before Ray (grpo_lab/checks/rules/late.py,
grpo_lab/checks/reward_probe.py): a file that is missing, raises at import, lacks the function, or whose function raises
or returns no number is refused by `python run.py` with the file, the line and the fix, and nothing starts; a good file
passes."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, composed, planned, run_py

from grpo_lab.after_run.doctor import verdict
from grpo_lab.checks import reward_probe
from grpo_lab.checks.preflight import run_preflight
from grpo_lab.memory.run import Run

KEY = "reward.custom_reward_function"
GOOD = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    assert data_source == "my_source", data_source  # the probe uses the training parquet's first row
    assert extra_info["index"] == 4, extra_info
    return 1.0 + bonus if solution_str.strip().endswith(str(ground_truth)) else 0.0
"""


ANY = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
       "    return float(solution_str == ground_truth)\n")


def write(tmp_path, text, name="my_reward.py"):
    f = tmp_path / name
    f.write_text(textwrap.dedent(text))
    return f


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """A training parquet in verl's row format, with a data_source of its own; the first row: 3 + 4, index 4."""
    f = tmp_path_factory.mktemp("data") / "train.parquet"
    rows = [{"data_source": "my_source", "prompt": [{"role": "user", "content": f"3 + {i} = ?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(3 + i)},
             "extra_info": {"split": "train", "index": i}}
            for i in range(4, 4 + 256)]  # two train batches of the default 128
    pq.write_table(pa.Table.from_pylist(rows), f)
    return f


def run_with(tmp_path, train, reward_file, *extra, only=True):
    job = tmp_path / "job"
    args = [f"{KEY}.path={reward_file}", f"train_file={train}", f"test_file={train}",
            f"hydra.run.dir={job}", *extra]
    out = run_py(*(["preflight.only=true"] if only else []), *args)
    plan = json.loads((job / "plan.json").read_text()) if (job / "plan.json").exists() else {}
    return out, out.stdout + out.stderr, plan, job


def assert_refused(out, text, plan, job, rule):
    assert out.returncode == 2, text
    assert rule in {e["rule"] for e in plan["errors"]}, plan["errors"]
    assert "nothing was started" in text and "Traceback" not in text
    assert "ray init kwargs" not in text  # verl's main_ppo prints this right before ray.init
    assert json.loads((job / "status.json").read_text())["status"] == "failed"
    return next(e for e in plan["errors"] if e["rule"] == rule)


# ---- through run.py ----------------------------------------------------------------------------------------------

def test_missing_file(tmp_path, train):
    write(tmp_path, GOOD, "my_reward.py")
    typo = tmp_path / "my_rewrad.py"
    out, text, plan, job = run_with(tmp_path, train, typo)
    e = assert_refused(out, text, plan, job, "reward_fn_file")
    assert f"the reward file {typo} does not exist" in e["message"] and "Custom module file not found" in e["message"]
    # the fix: the file of a close name there (re-checked: it passes). verl's own scorer (path=null) is not offered:
    # it has nothing for the rows' data_source 'my_source' (rule reward_fn_data_source fails that alternative)
    assert e["fix"] == f"{KEY}.path={tmp_path / 'my_reward.py'}", e
    assert e["checked"] == "re-checked: the preflight passes this rule with it"
    assert f"{KEY}.path=/abs/path/to/reward.py" in e["message"]
    good = run_py("preflight.only=true", f"{KEY}.path={typo}", f"train_file={train}",
                  f"test_file={train}", f"hydra.run.dir={tmp_path / 'fixed'}",
                  *shlex.split(e["fix"].split("  or  ")[0]),
                  "+reward.custom_reward_function.reward_kwargs.bonus=0.5")
    assert planned(good), good.stdout + good.stderr


def test_preset_launched_from_another_directory(tmp_path):
    """The shipped rewards are found by the package's own path (${lab_pkg:...}), so a preset passes from any launch
    folder; a path built from the launch folder (${hydra:runtime.cwd}/grpo_lab/tasks/rewards/...) does not, and its fix
    is the repository's file (re-checked), which typed back passes."""
    ok = run_py("preflight.only=true", "experiment=learn_smollm2", "hardware=h200x1",
                f"hydra.run.dir={tmp_path / 'preset'}", cwd=tmp_path)
    assert planned(ok), ok.stdout + ok.stderr
    shipped = ROOT / "grpo_lab" / "tasks" / "rewards" / "strict_format.py"
    assert json.loads((tmp_path / "preset" / "plan.json").read_text())["errors"] == []
    out = run_py("preflight.only=true", "experiment=learn_smollm2", "hardware=h200x1",
                 KEY + ".path=${hydra:runtime.cwd}/grpo_lab/tasks/rewards/strict_format.py",
                 f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    e = assert_refused(out, out.stdout + out.stderr, plan, tmp_path / "a", "reward_fn_file")
    assert f"the reward file {tmp_path}/grpo_lab/tasks/rewards/strict_format.py does not exist" in e["message"]
    assert e["fix"].split("  or  ")[0] == f"{KEY}.path={shipped}" and f"run from {ROOT}" in e["message"]
    good = run_py("preflight.only=true", "experiment=learn_smollm2", "hardware=h200x1", f"{KEY}.path={shipped}",
                  f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path)
    assert planned(good), good.stdout + good.stderr


def test_file_that_raises_at_import(tmp_path, train):
    f = write(tmp_path, """\
        import re

        import my_grader_that_is_not_installed
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
        """)
    out, text, plan, job = run_with(tmp_path, train, f)
    e = assert_refused(out, text, plan, job, "reward_fn_file")
    assert f"importing the reward file {f}" in e["message"]
    assert "ModuleNotFoundError: No module named 'my_grader_that_is_not_installed'" in e["message"]
    assert f"{f}:3: `import my_grader_that_is_not_installed`" in e["message"] and "Fix the file" in e["message"]


def test_file_without_the_function(tmp_path, train):
    f = write(tmp_path, """\
        import math

        def score_answer(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        def _helper():
            pass

        class Grader:
            pass
        """)
    out, text, plan, job = run_with(tmp_path, train, f, f"{KEY}.name=compute_score")
    e = assert_refused(out, text, plan, job, "reward_fn_file")
    assert "`compute_score` is not defined in the reward file" in e["message"] and str(f) in e["message"]
    assert "it defines: Grader, score_answer" in e["message"]  # its own callables (not math's, not _helper)
    assert f"python run.py {KEY}.name=<function>" in e["message"]


def test_function_that_raises(tmp_path, train):
    f = write(tmp_path, """\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            answer = solution_str.split("####")[1]
            return float(answer == ground_truth)
        """)
    out, text, plan, job = run_with(tmp_path, train, f)
    e = assert_refused(out, text, plan, job, "reward_fn_result")
    assert f"the reward function {f}:compute_score raised IndexError: list index out of range" in e["message"]
    assert f"{f}:2: `answer = solution_str.split(\"####\")[1]`" in e["message"]
    assert "with the answer 7 on data_source=my_source, ground_truth=7" in e["message"]
    assert "Fix the function" in e["message"]


@pytest.mark.parametrize("body,says", [("return '1.0'", "returned '1.0' (a str)"),
                                       ("score = 1.0", "returned None (a NoneType)")], ids=["string", "None"])
def test_function_that_returns_no_number(tmp_path, train, body, says):
    f = write(tmp_path, f"""\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            {body}
        """)
    out, text, plan, job = run_with(tmp_path, train, f)
    e = assert_refused(out, text, plan, job, "reward_fn_result")
    assert says in e["message"] and f"{f}:compute_score" in e["message"], e["message"]
    assert "verl needs a number (int, float or bool) or a dict with a numeric 'score'" in e["message"]


def test_good_file_with_reward_kwargs_passes(tmp_path, train):
    f = write(tmp_path, GOOD)
    out, text, plan, job = run_with(tmp_path, train, f, "+reward.custom_reward_function.reward_kwargs.bonus=0.5")
    assert planned(out), text
    assert not [w for w in plan["warnings"] if w["rule"].startswith("reward_fn")]


def test_reward_kwargs_the_function_does_not_take(tmp_path, train):
    f = write(tmp_path, GOOD.replace(", bonus=0.0", "").replace("1.0 + bonus", "1.0"))
    out, text, plan, job = run_with(tmp_path, train, f, "+reward.custom_reward_function.reward_kwargs.bonus=0.5")
    e = assert_refused(out, text, plan, job, "reward_fn_result")
    assert "TypeError" in e["message"] and "unexpected keyword argument 'bonus'" in e["message"]
    assert "verl calls it with keyword arguments only: compute_score(data_source=..., solution_str=..., " \
           "ground_truth=..., extra_info=..., bonus=...)" in e["message"]


def test_preset_amounts_the_function_does_not_take(tmp_path, train):
    """reward_fn=strict_format with only the path changed: its three amounts stay in reward_kwargs; the fix drops
    them (re-checked), and typed back it passes."""
    f = write(tmp_path, GOOD)
    out, text, plan, job = run_with(tmp_path, train, f, "reward_fn=strict_format")
    e = assert_refused(out, text, plan, job, "reward_fn_result")
    assert "unexpected keyword argument 'correct_score'" in e["message"] and "a reward_fn preset's" in e["message"]
    drop = " ".join(f"~{KEY}.reward_kwargs.{k}" for k in ("correct_score", "format_score", "missing_penalty"))
    assert e["fix"] == drop and e["checked"].startswith("re-checked: the preflight passes"), e
    out, text, plan, job = run_with(tmp_path / "again", train, f, "reward_fn=strict_format", *shlex.split(drop))
    assert planned(out), text


def test_refused_when_launching_too(tmp_path, train):
    """Without preflight.only (a real launch): refused by the preflight, before verl's main_ppo and Ray."""
    f = write(tmp_path, "def compute_score(**kwargs):\n    return 'good'\n")
    out, text, plan, job = run_with(tmp_path, train, f, only=False)
    assert_refused(out, text, plan, job, "reward_fn_result")


# ---- the shipped rewards pass their own probe, with their preset's data; a constant one still warns ---------------

# each conf/reward_fn option: the preset that picks it, and how its data is made (a small copy, in tmp_path)
SHIPPED = {"countdown": ("countdown_smollm2", "grpo_lab.tasks.countdown", ("--train", "64", "--test", "16")),
           "strict_format": ("learn_smollm2", "grpo_lab.tasks.arith", ("--train-size", "64", "--test-size", "16")),
           "verl_default": ("smoke", None, ())}


def test_every_shipped_reward_is_in_the_table():
    from conftest import options

    assert sorted(SHIPPED) == options("reward_fn")


@pytest.mark.parametrize("reward_fn", sorted(SHIPPED))
def test_shipped_reward_passes_its_probe_with_its_presets_data(tmp_path, reward_fn):
    """`python run.py experiment=<preset>` on the preset's own data: no reward_fn_* error or warning (the countdown
    reward's answers are "<answer>expr</answer>", not GSM8K's "#### n": its probe_answers gives answers of that
    shape)."""
    from conftest import run_module, write_rows

    preset, generator, sizes = SHIPPED[reward_fn]
    data = tmp_path / "data"
    if generator:
        made = run_module(generator, "--out", data, *sizes)
        assert made.returncode == 0, made.stderr
    else:
        data.mkdir()
        write_rows(data / "train.parquet", 256)
        write_rows(data / "test.parquet", 16)
    job = tmp_path / "job"
    out = run_py("preflight.only=true", f"experiment={preset}", "hardware=h200x1", f"train_file={data}/train.parquet",
                 f"test_file={data}/test.parquet", f"hydra.run.dir={job}")
    text = out.stdout + out.stderr
    plan = json.loads((job / "plan.json").read_text())
    verl = json.loads(json.dumps(__import__("yaml").safe_load((job / "verl_config.yaml").read_text())))
    assert verl["reward"]["custom_reward_function"]["path"] == (
        None if reward_fn == "verl_default" else str(ROOT / "grpo_lab" / "tasks" / "rewards" / f"{reward_fn}.py"))
    mine = [p for p in plan["errors"] + plan["warnings"] if p["rule"].startswith("reward_fn")]
    assert mine == [], mine
    assert "[reward_fn" not in text, text


def test_probe_uses_the_files_own_answers_and_a_constant_reward_still_warns(tmp_path, train):
    """A reward file's probe_answers(ground_truth, extra_info) gives the answers tried; a reward that scores every
    answer alike is warned, with its own answers or with those built from the row."""
    tagged = write(tmp_path, """\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0 if solution_str == f"<ans>{ground_truth}</ans>" else 0.0

        def probe_answers(ground_truth, extra_info):
            assert extra_info["index"] == 4, extra_info  # the row's own extra_info
            return [f"<ans>{ground_truth}</ans>", "<ans>nope</ans>", ""]
        """, "tagged.py")
    out, text, plan, job = run_with(tmp_path / "a", train, tagged)
    assert planned(out) and not [w for w in plan["warnings"] if w["rule"].startswith("reward_fn")], text
    constant = write(tmp_path, "def compute_score(**kwargs):\n    return 0.5\n", "constant.py")
    out, text, plan, job = run_with(tmp_path / "b", train, constant)
    (w,) = [w for w in plan["warnings"] if w["rule"] == "reward_fn_result"]
    assert planned(out) and "gave every sample answer the same score 0.5" in w["message"]
    assert "answers built from the row's ground truth" in w["message"] and "#### 8" in w["message"]  # a wrong one
    assert "define probe_answers(ground_truth, extra_info)" in w["message"]
    constant_own = write(tmp_path, "def compute_score(**kwargs):\n    return 0.5\n\n"
                                   "def probe_answers(ground_truth, extra_info):\n    return ['a', 'b']\n", "c2.py")
    out, text, plan, job = run_with(tmp_path / "c", train, constant_own)
    (w,) = [w for w in plan["warnings"] if w["rule"] == "reward_fn_result"]
    assert "same score 0.5 (a, b; answers probe_answers in the reward file" in w["message"], w["message"]


def test_own_answers_that_fail_are_warned_and_the_rows_answers_used(tmp_path, train):
    fails = "\ndef probe_answers(ground_truth, extra_info):\n    return ground_truth['target']\n"
    f = write(tmp_path, GOOD.replace('assert data_source == "my_source", data_source  # the probe uses the training '
                                     'parquet\'s first row', "pass") + fails)
    (p,) = check(tmp_path, f, train=train)
    assert p.rule == "reward_fn_result" and p.level == "warn"
    assert "probe_answers raised TypeError" in p.message and "answers built from the row's ground truth" in p.message


# ---- the rules on a composed config ------------------------------------------------------------------------------

def check(tmp_path, path, name="compute_score", kwargs=None, train=None):
    verl, lab = composed("reward_fn=strict_format")
    verl["reward"]["custom_reward_function"] = {"path": str(path), "name": name, "reward_kwargs": kwargs or {}}
    if train:
        verl["data"]["train_files"] = str(train)
    r = run_preflight(Run.build(verl, lab, {}), launching=False)
    return [p for p in r.errors + r.warnings if p.rule.startswith("reward_fn")]


def test_shipped_strict_format_passes(train, tmp_path):
    assert check(tmp_path, ROOT / "grpo_lab" / "tasks" / "rewards" / "strict_format.py") == []
    assert check(tmp_path, ROOT / "grpo_lab" / "tasks" / "rewards" / "strict_format.py", train=train) == []
    verl, lab = composed("experiment=learn_smollm2", "hardware=h200x1")
    assert not [p for p in run_preflight(Run.build(verl, lab, {}), launching=False).errors if "reward" in p.rule]


def test_no_custom_file_no_probe(monkeypatch):
    monkeypatch.setattr(reward_probe, "_run_child", lambda *a: pytest.fail("probed without a custom file"))
    verl, lab = composed("reward_fn=verl_default")
    assert not [p for p in run_preflight(Run.build(verl, lab, {}), launching=False).errors if "reward" in p.rule]


def test_missing_file_of_a_preset(tmp_path):
    """The preset's file gone (reward_fn=strict_format): the fix offers the preset of verl's scorer too."""
    verl, lab = composed("reward_fn=strict_format")
    verl["reward"]["custom_reward_function"]["path"] = str(tmp_path / "gone.py")
    (p,) = [p for p in run_preflight(Run.build(verl, lab, {}), launching=False).errors if p.rule == "reward_fn_file"]
    assert f"the reward file {tmp_path / 'gone.py'} does not exist" in p.message
    assert p.alternatives == [f"{KEY}.path=null", "reward_fn=verl_default"], p.fix


def test_empty_name(tmp_path):
    (p,) = check(tmp_path, write(tmp_path, ANY), name="")
    assert p.rule == "reward_fn_file" and f"{KEY}.name is empty" in p.message
    assert p.fix == f"{KEY}.name=compute_score" and p.checked.startswith("re-checked: the preflight passes")


def test_close_function_name_is_the_fix(tmp_path):
    (p,) = check(tmp_path, write(tmp_path, ANY), name="compute_scores")
    assert p.rule == "reward_fn_file" and p.fix == f"{KEY}.name=compute_score", p.fix
    assert p.checked.startswith("re-checked: the preflight passes")


def test_syntax_error_names_the_line(tmp_path):
    f = write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 1\n")
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_file" and "SyntaxError" in p.message and f"{f}:1" in p.message


def test_exit_at_import_does_not_take_the_launcher_down(tmp_path):
    f = write(tmp_path, "import sys\nsys.exit(3)\n")
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_file" and "raised SystemExit: 3" in p.message and f"{f}:2" in p.message
    f2 = write(tmp_path, "import os\nos._exit(4)\n", "hard_exit.py")
    (p,) = check(tmp_path, f2)
    assert p.rule == "reward_fn_file" and "exit code 4" in p.message and p.level == "error"
    assert not [m for m in sys.modules if m.startswith("custom_module_")]  # nothing imported here


def test_a_hanging_file_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(reward_probe, "TIMEOUT_S", 1.0)
    f = write(tmp_path, "import time\ntime.sleep(60)\ndef compute_score(**kw):\n    return 1.0\n")
    t = time.monotonic()
    (p,) = check(tmp_path, f)
    assert time.monotonic() - t < 15
    assert p.rule == "reward_fn_file" and p.level == "warn" and "did not finish within 1 s" in p.message


def test_nan_is_refused_and_constant_scores_warned(tmp_path):
    f = write(tmp_path, "def compute_score(**kw):\n    return float('nan')\n")
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_result" and p.level == "error" and "nan" in p.message
    f = write(tmp_path, "def compute_score(**kw):\n    return 0\n", "zero.py")
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_result" and p.level == "warn" and "the same score 0" in p.message


def test_async_function_and_numpy_scores_pass(tmp_path):
    f = write(tmp_path, """\
        import numpy as np

        async def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            return {"score": np.float32(solution_str.endswith(str(ground_truth))), "acc": True}
        """)
    assert check(tmp_path, f) == []


def test_keys_that_differ_between_answers_are_warned(tmp_path):
    f = write(tmp_path, """\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if not solution_str:
                return {"score": -1.0}
            return {"score": float(str(ground_truth) in solution_str), "acc": 1.0}
        """)
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_result" and p.level == "warn" and "different keys" in p.message


@pytest.mark.parametrize("body,says", [("return {'acc': 1.0}", "returned a dict without 'score'"),
                                       ("return {'score': None}", "(a NoneType as 'score')"),
                                       ("return [1.0]", "(a list)")])
def test_other_results_that_are_no_number(tmp_path, body, says):
    f = write(tmp_path, f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    {body}\n")
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_result" and p.level == "error" and says in p.message and str(f) in p.message


# ---- the doctor, on SYNTHETIC logs around verl 0.9.1's own texts (tests/fixtures/README.md) ------------------------

SYN = ROOT / "tests" / "fixtures" / "synthetic"


def test_doctor_reward_file_failed_to_load():
    (d,) = verdict.diagnose((SYN / "reward_fn_import_error.log").read_text())
    assert d.id == "reward_fn_load" and "Error loading module from module_path='/home/me/my_reward.py'" in d.evidence
    assert "ModuleNotFoundError: No module named 'my_grader', at /home/me/my_reward.py:3" in d.title
    assert d.overrides == [] and "python run.py ... preflight.only=true" in d.remedy


def test_doctor_reward_function_raised_while_scoring():
    (d,) = verdict.diagnose((SYN / "reward_fn_raised_in_scoring.log").read_text())
    assert d.id == "reward_fn_raised" and d.evidence == "IndexError: list index out of range"
    assert "(/home/me/my_reward.py:2 in compute_score)" in d.title and "preflight.only=true" in d.remedy


def test_nested_reward_kwargs_reach_the_function_as_verl_sends_them(tmp_path):
    f = write(tmp_path, """\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, weights=None, names=None):
            assert weights == {"right": 1.0, "format": 0.5} and names == ["a", "b"], (weights, names)
            return weights["right"] if solution_str == ground_truth else 0.0
        """)
    assert check(tmp_path, f, kwargs={"weights": {"right": 1.0, "format": 0.5}, "names": ["a", "b"]}) == []


def test_name_that_is_not_a_function(tmp_path):
    f = write(tmp_path, "compute_score = 1.0\n\ndef grade(data_source, solution_str, ground_truth, extra_info=None):\n"
                        "    return 1.0\n")
    (p,) = check(tmp_path, f)
    assert p.rule == "reward_fn_file" and "`compute_score` is a float, not a function" in p.message
    assert "it defines: grade" in p.message and "not callable" in p.message


# ---- reward_fn_data_source: no reward file, and verl's own scorer does not know the rows' data_source ----------------

def test_verl_default_scorer_with_rows_it_does_not_know_is_refused(tmp_path):
    from conftest import run_module

    data = tmp_path / "arith"
    assert run_module("grpo_lab.tasks.arith", "--out", data, "--train-size", "64", "--test-size", "16").returncode == 0
    files = (f"train_file={data / 'train.parquet'}", f"test_file={data / 'test.parquet'}")
    out = run_py("preflight.only=true", "experiment=learn_smollm2", "hardware=h200x1", "reward_fn=verl_default",
                 *files, f"hydra.run.dir={tmp_path / 'a'}")
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    e = assert_refused(out, out.stdout + out.stderr, plan, tmp_path / "a", "reward_fn_data_source")
    assert "'arith_mixed_oneshot' is not one verl's own scorer knows" in e["message"]
    assert "NotImplementedError" in e["message"] and e["fix"] == "reward_fn=strict_format"
    # the fix typed back (the preset's own reward) passes
    good = run_py("preflight.only=true", "experiment=learn_smollm2", "hardware=h200x1", "reward_fn=strict_format",
                  *files, f"hydra.run.dir={tmp_path / 'b'}")
    assert planned(good), good.stdout + good.stderr


def test_verl_knows_its_own_sources_from_its_scorer():
    from grpo_lab.verl_schema import schema

    names, prefixes = schema().data_sources, schema().data_source_prefixes
    assert {"openai/gsm8k", "lighteval/MATH", "hiyouga/geometry3k"} <= names and "aime" in prefixes
    assert "arith_mixed_oneshot" not in names and "own_qa" not in names
