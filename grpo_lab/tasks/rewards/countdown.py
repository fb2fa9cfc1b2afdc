"""The countdown reward: reach the target with the given numbers, answer as "<answer>(3 + 5) * 2</answer>".

    reward.custom_reward_function.path=<this file>  reward.custom_reward_function.name=compute_score
    (conf/reward_fn/countdown.yaml sets both, and the amounts below through reward_kwargs)

The score of each kind of answer, and probe_answers: docs/tasks.md.
"""

import ast
import json
import re
from collections import Counter
from fractions import Fraction

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
# as the strict-format reward: only the end of a long answer is read (a rambling answer cannot hide one early)
_TAIL_CHARS = 300
# longer expressions are refused before parsing (four numbers need about 25 characters)
_MAX_EXPR_CHARS = 200
# the only characters an expression may have: no letters at all, so no names, and no 0x10 or 1_0 spellings either
_EXPR_CHARS_RE = re.compile(r"[0-9+\-*/() \t\n]*")
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}


class Malformed(ValueError):
    """The expression is not made of whole numbers, + - * / and parentheses."""


def extract_expression(solution_str):
    """The text inside the last <answer>...</answer> of the answer's last 300 characters, stripped; None if absent."""
    found = _ANSWER_RE.findall(solution_str[-_TAIL_CHARS:])
    return found[-1].strip() if found else None


def parse_expression(expr):
    """(ast tree, the numbers it uses) of an arithmetic expression; Malformed for anything else. Nothing is run."""
    if not expr or len(expr) > _MAX_EXPR_CHARS:
        raise Malformed(f"empty or longer than {_MAX_EXPR_CHARS} characters")
    if not _EXPR_CHARS_RE.fullmatch(expr):
        raise Malformed("only digits, + - * / and parentheses are allowed")
    try:
        tree = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Malformed(str(exc)) from None
    numbers = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPS:
                raise Malformed(f"{type(node.op).__name__} is not allowed (only + - * /)")
            stack += [node.left, node.right]
        elif isinstance(node, ast.Constant) and type(node.value) is int:  # not bool, float, str
            numbers.append(node.value)
        else:
            raise Malformed(f"{type(node).__name__} is not allowed")
    return tree, numbers


def evaluate(tree):
    """The exact value of a tree from parse_expression; ZeroDivisionError on a division by zero."""
    if isinstance(tree, ast.Constant):
        return Fraction(tree.value)
    return _OPS[type(tree.op)](evaluate(tree.left), evaluate(tree.right))


def read_ground_truth(ground_truth):
    """(target, numbers) from {"target", "numbers"} (a mapping, or a JSON string of one)."""
    if isinstance(ground_truth, (str, bytes)):
        ground_truth = json.loads(ground_truth)
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def check(expr, target, numbers):
    """"correct", "wrong" (valid expression, other value) or "invalid" for one expression."""
    try:
        tree, used = parse_expression(expr)
    except Malformed:
        return "invalid"
    if Counter(used) - Counter(numbers):  # a number not given, or used more often than given
        return "invalid"
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return "wrong"
    return "correct" if value == target else "wrong"


def compute_score(data_source, solution_str, ground_truth, extra_info=None, correct_score=1.0, format_score=0.1,
                  invalid_score=0.0, missing_penalty=0.1, **kwargs):
    """verl's custom reward signature; the keyword amounts come from reward.custom_reward_function.reward_kwargs."""
    expr = extract_expression(solution_str)
    if expr is None:
        return {"score": -float(missing_penalty), "acc": 0.0, "formatted": 0.0, "valid": 0.0}
    target, numbers = read_ground_truth(ground_truth)
    verdict = check(expr, target, numbers)
    score = {"correct": correct_score, "wrong": format_score, "invalid": invalid_score}[verdict]
    return {"score": float(score), "acc": float(verdict == "correct"), "formatted": 1.0,
            "valid": float(verdict != "invalid")}


def probe_answers(ground_truth, extra_info=None):
    """Sample answers for grpo-lab's reward probe, one of each kind above: the row's reference answer (right; the
    generator writes it as extra_info["answer"]), the numbers added up (a valid expression, most often of another
    value), a number that is not given (invalid) and no tag at all. [] for a row that is not a countdown one."""
    try:
        target, numbers = read_ground_truth(ground_truth)
    except (TypeError, ValueError, KeyError, IndexError):
        return []
    given = " + ".join(map(str, numbers))
    not_given = max(numbers) + target + 1
    out = [f"<answer>{given}</answer>", f"<answer>{not_given} - {numbers[0]}</answer>", f"{target}"]
    reference = (extra_info or {}).get("answer")
    return [reference] + out if isinstance(reference, str) else out
