"""Synthetic arithmetic tasks for a small pretrained chat model (SmolLM2-135M-Instruct), offline and deterministic.

    python -m grpo_lab.tasks.arith --out data/arith_oneshot                # make arith-oneshot: the learn preset's data
    python -m grpo_lab.tasks.arith --out DIR --task chain --style gsm8k    # another task / prompt phrasing

The tasks, the prompt styles and the rows: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from grpo_lab.tasks.data import INSTRUCTION, QUESTION, build_once, cli_build, distinct, gsm8k_record, gsm8k_row
from grpo_lab.tasks.tiny import arith_problem

FORMAT_VERSION = 1
STAMP = "grpo_lab_arith.json"
TASKS = ("sums", "mixed", "chain")
SUMS = (0, 99)  # the operands of a sums problem, both ends included
TRAIN_ROWS, TEST_ROWS = 2048, 128  # what `make` writes by default (docs/presets.md)
STYLES = ("gsm8k", "oneshot")
ONESHOT = 'Solve the problem and write the final answer after "####". Example:\nWhat is 12 + 7?\n12 + 7 = 19\n#### 19'


def problem(task: str, rng: random.Random) -> tuple[str, str, int]:
    """(question, expression, value) of one random problem of the task."""
    if task == "sums":
        a, b = rng.randint(*SUMS), rng.randint(*SUMS)
        return f"What is {a} + {b}?", f"{a} + {b}", a + b
    if task == "mixed":
        return arith_problem(rng)
    if task == "chain":
        if rng.random() < 0.5:
            a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
            expr, value = f"{a} + {b} - {c}", a + b - c
        else:
            a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(10, 99)
            expr, value = f"{a} * {b} + {c}", a * b + c
        return f"What is {expr}?", expr, value
    raise ValueError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")


def prompt_text(question: str, style: str) -> str:
    if style == "gsm8k":
        return f"{question} {INSTRUCTION}"
    if style == "oneshot":
        return f"{ONESHOT}\n\nProblem: {question}"
    raise ValueError(f"unknown style {style!r}: choose one of {', '.join(STYLES)}")


def records(task: str, n: int, seed: int, exclude: frozenset[str] | set[str] = frozenset()) -> list[dict]:
    """n distinct problems {question, answer ("expr = value\\n#### value")}, none of whose questions is in exclude."""
    return distinct(lambda rng: gsm8k_record(*problem(task, rng)), n, random.Random(f"{task}-{seed}"), QUESTION,
                    exclude, f"task {task!r} has fewer than {n} distinct problems; ask for fewer")


def rows(task: str, style: str, n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict]]:
    """{"train": verl rows, "test": verl rows} with disjoint questions."""
    test = records(task, n_test, seed + 1)
    train = records(task, n_train, seed, exclude={r["question"] for r in test})
    return {split: [gsm8k_row(r["question"], r["answer"], split, i, f"arith_{task}_{style}",
                              prompt_text(r["question"], style)) for i, r in enumerate(recs)]
            for split, recs in (("train", train), ("test", test))}


def make(out: str | Path, task: str, style: str, n_train: int, n_test: int, seed: int, force: bool = False) -> Path:
    settings = {"version": FORMAT_VERSION, "task": task, "style": style, "train": n_train, "test": n_test,
                "seed": seed}
    return build_once(out, STAMP, settings, lambda: rows(task, style, n_train, n_test, seed), force,
                      f"task {task}, style {style}, data_source arith_{task}_{style}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.arith", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/arith_oneshot")
    parser.add_argument("--task", choices=TASKS, default="mixed")
    parser.add_argument("--style", choices=STYLES, default="oneshot")
    return cli_build(parser, argv, ("--train-size",), ("--test-size",), (TRAIN_ROWS, TEST_ROWS),
                     lambda a: make(a.out, a.task, a.style, a.train_size, a.test_size, a.seed, a.force),
                     "next: python run.py experiment=learn_smollm2 hardware=h200x1 preflight.only=true   "
                     "(needs make smollm2)")


if __name__ == "__main__":
    sys.exit(main())
