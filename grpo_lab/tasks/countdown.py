"""Countdown problems (reach a target with given numbers and + - * /), offline and deterministic: a second task with
its own reward (grpo_lab/tasks/rewards/countdown.py), for SmolLM2-135M-Instruct or any chat model.

    python -m grpo_lab.tasks.countdown --out data/countdown                # make countdown: the countdown preset's data
    python -m grpo_lab.tasks.countdown --out DIR --train 512 --test 64 --seed 1

How problems are made, the prompt and the rows: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import operator
import random
import sys
from pathlib import Path

from grpo_lab.tasks.data import build_once, cli_build, distinct, gsm8k_row

FORMAT_VERSION = 1
STAMP = "grpo_lab_countdown.json"
DATA_SOURCE = "countdown"
MAX_NUMBER = 99
SIZES = (3, 4)  # how many numbers a problem has, drawn alike
TRAIN_ROWS, TEST_ROWS = 2048, 128  # what `make` writes by default (docs/presets.md)
# every intermediate value of a generating expression stays in 1..MAX_VALUE (a 135M model does small arithmetic)
MAX_VALUE = 999
ONESHOT = ("Use the numbers to make the target with +, -, * and /; use each number at most once. "
           "Write only the expression inside <answer></answer>. Example:\n"
           "Numbers: 2, 7, 5. Target: 19.\n<answer>2 * 7 + 5</answer>")
# precedence of each operator, for writing an expression with only the parentheses it needs
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


def _combine(left: tuple, right: tuple, op: str) -> tuple | None:
    """(text, value, precedence) of `left op right`, or None when the value leaves 1..MAX_VALUE or is not whole."""
    (lt, lv, lp), (rt, rv, rp) = left, right
    if op == "/" and (rv in (0, 1) or lv % rv):  # exact divisions only, and not by 1 (a no-op)
        return None
    value = _OPS[op](lv, rv)
    if not 1 <= value <= MAX_VALUE:
        return None
    prec = _PREC[op]
    if lp < prec:
        lt = f"({lt})"
    if rp < prec or (rp == prec and op in "-/"):
        rt = f"({rt})"
    return f"{lt} {op} {rt}", value, prec


def problem(rng: random.Random) -> tuple[list[int], int, str]:
    """(numbers, target, expression) of one random problem: the expression uses every number once."""
    while True:
        numbers = [rng.randint(1, MAX_NUMBER) for _ in range(rng.choice(SIZES))]
        pool = [(str(n), n, 3) for n in numbers]
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            node = _combine(pool[i], pool[j], rng.choice("+-*/"))
            if node is None:
                break
            pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [node]
        if len(pool) == 1 and pool[0][1] not in numbers:  # a target among the numbers is no problem at all
            shown = numbers[:]
            rng.shuffle(shown)
            return shown, pool[0][1], pool[0][0]


def question(numbers: list[int], target: int) -> str:
    return f"Numbers: {', '.join(map(str, numbers))}. Target: {target}."


def records(n: int, seed: int, exclude: frozenset | set = frozenset()) -> list[dict]:
    """n distinct problems {numbers, target, expression}; none whose (sorted numbers, target) is in exclude."""
    return distinct(lambda rng: dict(zip(("numbers", "target", "expression"), problem(rng))), n,
                    random.Random(f"countdown-{seed}"), _key, exclude,
                    f"found fewer than {n} distinct countdown problems; ask for fewer")


def _key(rec: dict) -> tuple:
    return tuple(sorted(rec["numbers"])), rec["target"]


def row(rec: dict, split: str, index: int) -> dict:
    """One verl row: gsm8k_row's layout with the countdown prompt, ground truth and reference answer."""
    numbers, target, expr = rec["numbers"], rec["target"], rec["expression"]
    asked = question(numbers, target)
    out = gsm8k_row(asked, f"{expr} = {target}\n#### {target}", split, index, DATA_SOURCE, f"{ONESHOT}\n\n{asked}")
    out["reward_model"]["ground_truth"] = {"target": target, "numbers": numbers}
    out["extra_info"]["answer"] = f"<answer>{expr}</answer>"
    return out


def rows(n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict]]:
    """{"train": verl rows, "test": verl rows} with no problem in both."""
    test = records(n_test, seed + 1)
    train = records(n_train, seed, exclude={_key(r) for r in test})
    return {split: [row(r, split, i) for i, r in enumerate(recs)] for split, recs in (("train", train), ("test", test))}


def make(out: str | Path, n_train: int, n_test: int, seed: int, force: bool = False) -> Path:
    settings = {"version": FORMAT_VERSION, "train": n_train, "test": n_test, "seed": seed}
    return build_once(out, STAMP, settings, lambda: rows(n_train, n_test, seed), force,
                      f"data_source {DATA_SOURCE}, seed {seed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.countdown", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/countdown")
    return cli_build(parser, argv, ("--train", "--train-size"), ("--test", "--test-size"), (TRAIN_ROWS, TEST_ROWS),
                     lambda a: make(a.out, a.train_size, a.test_size, a.seed, a.force),
                     "next: python run.py experiment=countdown_smollm2 hardware=h200x1 preflight.only=true   "
                     "(needs make smollm2)")


if __name__ == "__main__":
    sys.exit(main())
