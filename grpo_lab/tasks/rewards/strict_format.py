"""A strict-format reward for answers that must end in "#### <number>" (GSM8K's format): correctness, plus a small
bonus for the format and a penalty for a missing "####", so that a model that does not write the format yet still
gets a signal from GRPO.

    reward.custom_reward_function.path=<this file>  reward.custom_reward_function.name=compute_score
    (conf/reward_fn/strict_format.yaml sets both, and the amounts through reward_kwargs)

Standard library only: verl imports this file by path. The score of each kind of answer, and the keys it returns:
docs/tasks.md."""

import re

# "#### 42", "#### -3", "#### 1,234", "#### 2.5"; a trailing full stop is not part of the number
_ANSWER_RE = re.compile(r"#### ?(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
# verl's gsm8k scorer looks only at the end of long answers; so do we (a rambling answer cannot hide one early)
_TAIL_CHARS = 300


def extract_answer(solution_str):
    """The number after the last "#### " in the answer's last 300 characters, commas removed; None when absent."""
    found = _ANSWER_RE.findall(solution_str[-_TAIL_CHARS:])
    return found[-1].replace(",", "") if found else None


def _same_number(a, b):
    try:
        return float(a) == float(str(b).replace(",", "").strip())
    except (TypeError, ValueError):
        return False


def compute_score(data_source, solution_str, ground_truth, extra_info=None, correct_score=1.0, format_score=0.1,
                  missing_penalty=0.1, **kwargs):
    """verl's custom reward signature; the keyword amounts come from reward.custom_reward_function.reward_kwargs."""
    answer = extract_answer(solution_str)
    if answer is None:
        return {"score": -float(missing_penalty), "acc": 0.0, "formatted": 0.0}
    if _same_number(answer, ground_truth):
        return {"score": float(correct_score), "acc": 1.0, "formatted": 1.0}
    return {"score": float(format_score), "acc": 0.0, "formatted": 1.0}
