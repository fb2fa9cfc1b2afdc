"""The countdown task (issue 12, item 1): grpo_lab/tasks/countdown.py (make countdown) writes verl rows whose every
problem is solvable, grpo_lab/tasks/rewards/countdown.py scores answers without running them, verl's own loaders read
both (its RLHFDataset the rows, its get_custom_reward_fn the reward file named by conf/reward_fn/countdown.yaml), and
the preset passes the preflight."""

from __future__ import annotations

import json
import re
from collections import Counter

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, compose_split, planned, run_module, run_py
from omegaconf import OmegaConf

from grpo_lab.tasks import countdown
from grpo_lab.tasks.rewards import countdown as reward
from grpo_lab.tasks.rewards.countdown import compute_score
from grpo_lab.verl_keys import get

SRC = countdown.DATA_SOURCE
VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}
PRESET = ("experiment=countdown_smollm2", "hardware=h200x1")


def _cli(*args):
    return run_module("grpo_lab.tasks.countdown", *args)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("countdown") / "countdown"
    proc = _cli("--out", str(out), "--train", "300", "--test", "40", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


# ---- the generator ----

def test_cli_writes_parquet_rows_in_verls_layout(made):
    out, stdout = made
    assert "train 300 rows, test 40 rows" in stdout and "next: python run.py experiment=countdown_smollm2" in stdout
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (300, 40)
    for row in train[:5] + test[:5]:
        assert set(row) == VERL_COLUMNS and row["data_source"] == "countdown"
        assert row["reward_model"]["style"] == "rule"
        gt = row["reward_model"]["ground_truth"]
        assert set(gt) == {"target", "numbers"} and 3 <= len(gt["numbers"]) <= 4
        (msg,) = row["prompt"]
        assert msg["role"] == "user" and "<answer>2 * 7 + 5</answer>" in msg["content"]  # the one-shot example
        assert msg["content"].endswith(f"Numbers: {', '.join(map(str, gt['numbers']))}. Target: {gt['target']}.")
    assert [r["extra_info"]["index"] for r in test] == list(range(40))
    assert {r["extra_info"]["split"] for r in train} == {"train"}
    keys = lambda rows: {(tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])),  # noqa: E731
                          r["reward_model"]["ground_truth"]["target"]) for r in rows}
    assert len(keys(train)) == 300 and not keys(train) & keys(test)


def test_every_problem_is_solvable_by_its_generating_expression():
    rows = countdown.rows(n_train=1500, n_test=100, seed=11)
    for row in rows["train"] + rows["test"]:
        gt, ref = row["reward_model"]["ground_truth"], row["extra_info"]["answer"]
        assert compute_score(SRC, ref, gt) == {"score": 1.0, "acc": 1.0, "formatted": 1.0, "valid": 1.0}, (gt, ref)
        used = [int(n) for n in re.findall(r"\d+", ref)]
        assert sorted(used) == sorted(gt["numbers"])  # every number exactly once
        assert all(1 <= n <= countdown.MAX_NUMBER for n in gt["numbers"]) and gt["target"] not in gt["numbers"]
        assert 1 <= gt["target"] <= countdown.MAX_VALUE
    sizes = Counter(len(r["reward_model"]["ground_truth"]["numbers"]) for r in rows["train"])
    assert set(sizes) == {3, 4}


def test_deterministic_with_the_seed(made, tmp_path):
    assert countdown.rows(50, 10, seed=3) == countdown.rows(50, 10, seed=3)
    assert countdown.rows(50, 10, seed=3) != countdown.rows(50, 10, seed=4)
    out, _ = made
    again = tmp_path / "again"
    assert _cli("--out", str(again), "--train-size", "300", "--test-size", "40", "--seed", "5").returncode == 0
    assert pq.read_table(again / "train.parquet").equals(pq.read_table(out / "train.parquet"))
    proc = _cli("--out", str(again), "--train", "300", "--test", "40", "--seed", "5")
    assert proc.returncode == 0 and proc.stdout.startswith("kept")


def test_bad_sizes_write_nothing(tmp_path):
    out = tmp_path / "x"
    proc = _cli("--out", str(out), "--test", "0")
    assert proc.returncode == 2 and "at least 1" in proc.stderr and not out.exists()


# ---- the reward on fixtures ----

GT = {"target": 16, "numbers": [3, 5, 2]}
# (answer text) -> (score, acc, formatted, valid) with the default amounts
FIXTURES = [
    ("<answer>(3 + 5) * 2</answer>", (1.0, 1.0, 1.0, 1.0)),
    ("3 + 5 = 8, 8 * 2 = 16\n<answer> (5 + 3)*2 </answer>", (1.0, 1.0, 1.0, 1.0)),   # working before; spaces
    ("<answer>3 * 5 + 2 / 2</answer>", (0.0, 0.0, 1.0, 0.0)),       # 2 used twice
    ("<answer>3 + 5 + 2</answer>", (0.1, 0.0, 1.0, 1.0)),           # valid, 10 is not 16
    ("<answer>3 * 5</answer>", (0.1, 0.0, 1.0, 1.0)),               # a subset of the numbers is allowed (15)
    ("<answer>(3 + 5) * 2</answer> wait <answer>3 * 5</answer>", (0.1, 0.0, 1.0, 1.0)),  # the last tag counts
    ("<answer>3 * 5</answer> wait <answer>(3 + 5) * 2</answer>", (1.0, 1.0, 1.0, 1.0)),
    ("<answer>16</answer>", (0.0, 0.0, 1.0, 0.0)),                  # 16 is not a given number
    ("<answer>(3 + 5) * 2 * 1</answer>", (0.0, 0.0, 1.0, 0.0)),     # 1 is not given
    ("<answer>(3 + 5) * 3</answer>", (0.0, 0.0, 1.0, 0.0)),         # 3 twice but given once
    ("<answer>(3 + 5 * 2</answer>", (0.0, 0.0, 1.0, 0.0)),          # unbalanced
    ("<answer>3 ** 5</answer>", (0.0, 0.0, 1.0, 0.0)),              # no powers
    ("<answer>(3 + 5) // 2</answer>", (0.0, 0.0, 1.0, 0.0)),        # no floor division
    ("<answer>-3 + 5 * 2</answer>", (0.0, 0.0, 1.0, 0.0)),          # no unary signs
    ("<answer>(3 + 5) x 2</answer>", (0.0, 0.0, 1.0, 0.0)),
    ("<answer>(3 + 5) * 2 = 16</answer>", (0.0, 0.0, 1.0, 0.0)),    # only the expression
    ("<answer></answer>", (0.0, 0.0, 1.0, 0.0)),
    ("<answer>5 / (3 - 3)</answer>", (0.0, 0.0, 1.0, 0.0)),         # 3 reused (and 1/0): invalid first
    ("(3 + 5) * 2", (-0.1, 0.0, 0.0, 0.0)),                         # right, but no tag
    ("<answer>(3 + 5) * 2", (-0.1, 0.0, 0.0, 0.0)),                 # unclosed tag
    ("", (-0.1, 0.0, 0.0, 0.0)),
    ("<answer>(3 + 5) * 2</answer>" + " blah" * 100, (-0.1, 0.0, 0.0, 0.0)),  # only the last 300 characters
]


@pytest.mark.parametrize("text,expected", FIXTURES)
def test_scores_on_fixtures(text, expected):
    r = compute_score(SRC, text, GT, {})
    assert (r["score"], r["acc"], r["formatted"], r["valid"]) == pytest.approx(expected)


def test_division_by_zero_is_a_wrong_value_not_a_crash():
    gt = {"target": 4, "numbers": [3, 3, 5]}  # 3 given twice: 5 / (3 - 3) is a valid expression without a value
    assert compute_score(SRC, "<answer>5 / (3 - 3)</answer>", gt)["score"] == pytest.approx(0.1)
    assert compute_score(SRC, "<answer>5 / (3 - 3) + 2</answer>", {"target": 4, "numbers": [5, 3, 3, 2]}) \
        == {"score": 0.1, "acc": 0.0, "formatted": 1.0, "valid": 1.0}


def test_divisions_are_exact_fractions():
    gt = {"target": 24, "numbers": [8, 3, 3, 8]}  # the classic 8 / (3 - 8 / 3) = 24, through the fraction 1/3
    assert compute_score(SRC, "<answer>8 / (3 - 8 / 3)</answer>", gt)["acc"] == 1.0
    assert compute_score(SRC, "<answer>7 / 2</answer>", {"target": 3, "numbers": [7, 2]})["acc"] == 0.0  # not 3


@pytest.mark.parametrize("text", [
    "<answer>__import__('os').system('touch {p}')</answer>",
    "<answer>(lambda: __import__('os').system('touch {p}'))()</answer>",
    "<answer>open('{p}', 'w')</answer>",
    "<answer>[3, 5, 2].__class__</answer>",
    "<answer>3 + 5 and __import__('os').system('touch {p}')</answer>",
    "<answer>0x10</answer>",
    "<answer>1_6</answer>",
    "<answer>" + "(" * 120 + "3" + ")" * 120 + "</answer>",          # over 200 characters: not parsed
    "<answer>" + "9" * 250 + "</answer>",
])
def test_malicious_or_odd_strings_are_malformed_and_never_run(text, tmp_path):
    marker = tmp_path / "ran"
    text = text.replace("{p}", str(marker))
    r = compute_score(SRC, text[-300:] if len(text) > 300 else text, {"target": 16, "numbers": [3, 5, 2, 16]})
    assert r["valid"] == 0.0 and r["acc"] == 0.0 and not marker.exists()
    if len(text) <= 300:
        assert r["score"] == 0.0 and r["formatted"] == 1.0


def test_parse_expression_names_what_is_wrong():
    with pytest.raises(reward.Malformed, match="only digits"):
        reward.parse_expression("__import__('os')")
    with pytest.raises(reward.Malformed, match="Pow is not allowed"):
        reward.parse_expression("2 ** 99999999")
    assert sorted(reward.parse_expression("(3 + 5) * 2")[1]) == [2, 3, 5]


def test_ground_truth_as_a_json_string_and_amounts_as_keywords():
    text = json.dumps(GT)
    assert compute_score(SRC, "<answer>(3 + 5) * 2</answer>", text)["acc"] == 1.0
    assert compute_score(SRC, "<answer>3 + 5</answer>", GT, format_score=0.3)["score"] == pytest.approx(0.3)
    assert compute_score(SRC, "<answer>3 + 3</answer>", GT, invalid_score=-0.2)["score"] == pytest.approx(-0.2)
    assert compute_score(SRC, "16", GT, missing_penalty=0.5)["score"] == pytest.approx(-0.5)
    assert compute_score(SRC, "<answer>(3 + 5) * 2</answer>", GT, correct_score=2.0)["score"] == pytest.approx(2.0)


# ---- through verl's own loaders ----

def test_verls_dataset_hands_the_reward_a_ground_truth_it_scores(made, tmp_path, monkeypatch):
    """verl's RLHFDataset reads the parquet and its collate_fn batches the rows (as the trainer does): the ground
    truth reaches the reward as the dict the row holds, and every reference answer scores 1.0."""
    import datasets
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    out, _ = made
    ds = RLHFDataset(data_files=[str(out / "test.parquet")], tokenizer=None,
                     config=OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "c")}))
    batch = collate_fn([ds[i] for i in range(len(ds))])
    assert len(batch["reward_model"]) == 40
    for rm, extra, source in zip(batch["reward_model"], batch["extra_info"], batch["data_source"]):
        gt = rm["ground_truth"]
        assert isinstance(gt, dict) and isinstance(gt["numbers"], list)
        assert compute_score(source, extra["answer"], gt, extra)["acc"] == 1.0


def test_the_preset_selects_the_file_and_verl_loads_it():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    verl, lab = compose_split(*PRESET)
    assert lab.reward_fn == "countdown" and lab.dataset.name == "countdown"
    assert get(verl, "data.train_files") == str(ROOT / "data" / "countdown" / "train.parquet")
    crf = get(verl, "reward.custom_reward_function")
    assert crf["path"] == str(ROOT / "grpo_lab" / "tasks" / "rewards" / "countdown.py")
    assert crf["name"] == "compute_score"
    fn = get_custom_reward_fn(OmegaConf.create(verl))
    assert fn is not None
    # verl merges reward_kwargs into the call: the amounts in conf/reward_fn/countdown.yaml reach the function
    assert fn(data_source=SRC, solution_str="<answer>(3 + 5) * 2</answer>", ground_truth=GT, extra_info={}) == \
        {"score": 1.0, "acc": 1.0, "formatted": 1.0, "valid": 1.0}
    assert fn(data_source=SRC, solution_str="16", ground_truth=GT, extra_info={})["score"] == pytest.approx(-0.1)
    assert fn(data_source=SRC, solution_str="<answer>__import__('os')</answer>", ground_truth=GT,
              extra_info={})["score"] == pytest.approx(0.0)
    verl, _ = compose_split(*PRESET, "reward.custom_reward_function.reward_kwargs.invalid_score=-0.05")
    fn = get_custom_reward_fn(OmegaConf.create(verl))
    assert fn(data_source=SRC, solution_str="<answer>3 * 3</answer>", ground_truth=GT,
              extra_info={})["score"] == pytest.approx(-0.05)


def test_acc_is_what_validation_reports_as_core():
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    texts = ["<answer>(3 + 5) * 2</answer>", "<answer>3 + 5</answer>", "<answer>3 + 3</answer>", "16"]
    results = [compute_score(SRC, t, GT) for t in texts]
    infos = {k: [r[k] for r in results] for k in results[0]}
    out = process_validation_metrics([SRC] * 4, [str(i) for i in range(4)], infos)
    assert out[SRC]["acc"]["mean@1"] == pytest.approx(0.25)
    assert out[SRC]["valid"]["mean@1"] == pytest.approx(0.5)


def test_the_preset_passes_the_preflight_on_made_data(made, tmp_path):
    out, _ = made
    proc = run_py(*PRESET, "preflight.only=true", "preflight.verbose=true", f"train_file={out}/train.parquet",
                  f"test_file={out}/test.parquet", f"hydra.run.dir={tmp_path}/run")
    text = proc.stdout + proc.stderr
    assert planned(proc), text[-3000:]
    # the preflight counted the made file's rows: 300 / 64 prompts a step
    assert "300 train rows / 64 = 4 steps per epoch" in text, text[-3000:]
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["errors"] == []
