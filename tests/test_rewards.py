"""The strict-format reward (grpo_lab/tasks/rewards/strict_format.py): scores on fixtures, loading through verl's own
loader with the reward_fn group's settings, and the validation metric name verl gives its `acc`."""

from __future__ import annotations

import pytest
from conftest import ROOT, compose_split
from omegaconf import OmegaConf

from grpo_lab.tasks.rewards.strict_format import compute_score, extract_answer
from grpo_lab.verl_keys import get

SRC = "arith_mixed_oneshot"

# (answer text, ground truth) -> (score, acc, formatted) with the default amounts
FIXTURES = [
    ("23 + 48 = 71\n#### 71", "71", (1.0, 1.0, 1.0)),
    ("#### 71", "71", (1.0, 1.0, 1.0)),
    ("The answer is\n####71.", "71", (1.0, 1.0, 1.0)),                # no space, full stop after the number
    ("12 * 100 = 1,200\n#### 1,200", "1200", (1.0, 1.0, 1.0)),       # commas dropped
    ("5 - 9 = -4\n#### -4", "-4", (1.0, 1.0, 1.0)),
    ("#### 70\nno wait\n#### 71", "71", (1.0, 1.0, 1.0)),             # the last "####" counts
    ("#### 71\nno wait\n#### 70", "71", (0.1, 0.0, 1.0)),
    ("23 + 48 = 17\n#### 17", "71", (0.1, 0.0, 1.0)),                 # format right, number wrong
    ("23 + 48 = 71", "71", (-0.1, 0.0, 0.0)),                          # right number, no format: penalised
    ("The answer is 71.", "71", (-0.1, 0.0, 0.0)),
    ("####", "71", (-0.1, 0.0, 0.0)),                                  # "####" without a number
    ("", "71", (-0.1, 0.0, 0.0)),
    ("#### 2.5", "2.5", (1.0, 1.0, 1.0)),
    ("#### 71" + " blah" * 100, "71", (-0.1, 0.0, 0.0)),               # only the last 300 characters are read
]


@pytest.mark.parametrize("text,truth,expected", FIXTURES)
def test_scores_on_fixtures(text, truth, expected):
    r = compute_score(SRC, text, truth, {})
    assert (r["score"], r["acc"], r["formatted"]) == pytest.approx(expected)


def test_amounts_are_keyword_arguments():
    assert compute_score(SRC, "#### 3", "4", format_score=0.3)["score"] == pytest.approx(0.3)
    assert compute_score(SRC, "four", "4", missing_penalty=0.5)["score"] == pytest.approx(-0.5)
    assert compute_score(SRC, "#### 4", "4", correct_score=2.0)["score"] == pytest.approx(2.0)


def test_extract_answer():
    assert extract_answer("a\n#### 1,234\n") == "1234"
    assert extract_answer("no number") is None


def _reward_section(*overrides):
    verl, _ = compose_split("experiment=learn_smollm2", "hardware=h200x1", *overrides)
    return verl


def test_the_group_selects_the_file_and_verl_loads_it():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    verl = _reward_section()
    crf = get(verl, "reward.custom_reward_function")
    assert crf["path"] == str(ROOT / "grpo_lab" / "tasks" / "rewards" / "strict_format.py")
    assert crf["name"] == "compute_score"
    fn = get_custom_reward_fn(OmegaConf.create(verl))
    assert fn is not None
    # verl merges reward_kwargs into the call: the amounts in conf/reward_fn/strict_format.yaml reach the function
    assert fn(data_source=SRC, solution_str="#### 8", ground_truth="8", extra_info={}) == \
        {"score": 1.0, "acc": 1.0, "formatted": 1.0}
    assert fn(data_source=SRC, solution_str="8", ground_truth="8", extra_info={})["score"] == pytest.approx(-0.1)
    verl = _reward_section("reward.custom_reward_function.reward_kwargs.format_score=0.25")
    fn = get_custom_reward_fn(OmegaConf.create(verl))
    assert fn(data_source=SRC, solution_str="#### 9", ground_truth="8", extra_info={})["score"] == pytest.approx(0.25)


def test_verl_default_option_switches_the_custom_reward_off():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    verl = _reward_section("reward_fn=verl_default")
    assert get(verl, "reward.custom_reward_function.path") is None
    assert get_custom_reward_fn(OmegaConf.create(verl)) is None


def test_presets_without_the_group_keep_verls_scorer():
    verl, lab = compose_split("experiment=smoke_tiny", "hardware=h200x1")
    assert get(verl, "reward.custom_reward_function.path") is None and lab.reward_fn == "verl_default"


def test_acc_is_what_validation_reports_as_core():
    # verl 0.9.1's validation names the extra info: "acc" becomes val-core/<data_source>/acc/mean@1
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    texts = ["#### 3", "3", "#### 4", "#### 5"]
    results = [compute_score(SRC, t, "3") for t in texts]
    infos = {k: [r[k] for r in results] for k in results[0]}
    out = process_validation_metrics([SRC] * 4, [str(i) for i in range(4)], infos)
    assert out[SRC]["acc"]["mean@1"] == pytest.approx(0.25)
    assert out[SRC]["score"]["mean@1"] == pytest.approx((1.0 - 0.1 + 0.1 + 0.1) / 4)
