"""Rules on the custom reward file (reward.custom_reward_function.{path,name,reward_kwargs}, conf/reward_fn/).

    reward_fn_file    the file exists, imports, and defines the function `name` (callable)
    reward_fn_result  the function, called as verl calls it, returns a number or a dict with a numeric "score"
    reward_fn_data_source  without a file: verl's own scorer knows every data_source of the data files

Why verl's own checks come too late, and what is not refused: docs/preflight.md.
"""

from __future__ import annotations

import difflib
import functools
import os
from typing import Any, Iterable, Mapping

from grpo_lab import facts
from grpo_lab.checks import reward_probe
from grpo_lab.checks.rules import ALT, Ctx, Problem, error, rule, thaw, warn
from grpo_lab.verl_schema import schema

KEY = "reward.custom_reward_function"
BACK = "reward_fn=verl_default"  # the config-group choice back to verl's own scorer (conf/reward_fn/verl_default.yaml)
NEEDS = ("verl needs a number (int, float or bool) or a dict with a numeric 'score' (its other keys are logged, "
         "e.g. 'acc')")


def _cfg(c: Ctx) -> tuple[str | None, str, dict[str, Any]]:
    cfg = c.get(KEY, {}) or {}
    if not isinstance(cfg, Mapping):
        return None, "", {}
    kwargs = cfg.get("reward_kwargs") or {}
    return cfg.get("path") or None, str(cfg.get("name") or ""), thaw(kwargs) if isinstance(kwargs, Mapping) else {}


def _probe(c: Ctx) -> dict[str, Any] | None:
    """The probe's result for this config, or None when there is nothing to probe (no path, missing, no name)."""
    path, name, kwargs = _cfg(c)
    if not path or not name:
        return None
    f = reward_probe.file_of(str(path))
    if f is not None and not os.path.isfile(f):
        return None
    return reward_probe.probe(str(path), name, kwargs, c.get("data.train_files"))


def _at(r: Mapping[str, Any]) -> str:
    out = ""
    if r.get("file_line"):
        out += f" at {r['file_line']}" + (f": `{r['code']}`" if r.get("code") else "")
    if r.get("raised_at"):
        out += f" (raised in {r['raised_at']})"
    return out


ROOT = str(facts.ROOT)


def _in_repo(f: str) -> list[str]:
    """The same file under the repository, when the path was made from the launch directory (a path written as
    ${hydra:runtime.cwd}/grpo_lab/tasks/rewards/...: launched from elsewhere, it points at nothing; the presets use
    ${lab_pkg:...} instead)."""
    cwd = os.getcwd()
    if not f.startswith(cwd + os.sep) or cwd == ROOT:
        return []
    there = os.path.join(ROOT, os.path.relpath(f, cwd))
    return [there] if os.path.isfile(there) else []


def _close_files(f: str) -> list[str]:
    folder, base = os.path.split(f)
    if not os.path.isdir(folder):
        return []
    names = [n for n in os.listdir(folder) if n.endswith(".py")]
    return [os.path.join(folder, n) for n in difflib.get_close_matches(base, names, n=2, cutoff=0.6)]


@rule("reward_fn_file", kind="reward", phase="reward")
def reward_fn_file(c: Ctx) -> Iterable[Problem]:
    path, name, kwargs = _cfg(c)
    if not path:
        return
    path = str(path)
    if not name:
        yield error(f"{KEY}.path={path} is set but {KEY}.name is empty: verl asserts a function name and its reward "
                    f"workers fail after Ray has started", f"{KEY}.name=compute_score")
        return
    f = reward_probe.file_of(path)
    if f is not None and not os.path.isfile(f):
        shown = path if path == f else f"{path} (from here: {f})"
        repo, near = _in_repo(f), _close_files(f)
        hint = f" Files with a close name there: {', '.join(near)}." if near else ""
        if repo:
            hint = (f" The path was made from the launch directory ({os.getcwd()}): the file is in the repository "
                    f"({repo[0]}); run from {ROOT}, or give the path.") + hint
        what = "is a folder, not a file" if os.path.isdir(f) else "does not exist"
        # back to verl's scorer: the preset, when another one set the path; `path=null` also when the path was
        # typed on the command line (it wins over any preset)
        back = ([BACK] if c.lab.reward_fn not in (None, "verl_default") else []) + [f"{KEY}.path=null"]
        yield error(f"the reward file {shown} {what}: verl's reward workers would fail with 'Custom module file not "
                    f"found' after Ray and the model have started.{hint} Point {KEY}.path at your file "
                    f"(python run.py {KEY}.path=/abs/path/to/reward.py), or go back to verl's own scorer by "
                    f"data_source ({' or '.join(back)})", ALT.join([f"{KEY}.path={p}" for p in repo + near] + back))
        return
    r = _probe(c)
    if r is None:
        return
    where = f or path
    stage = r.get("stage")
    if stage == "import":
        yield error(f"importing the reward file {where} (as verl's reward workers will) raised {r.get('type')}: "
                    f"{r.get('message')}{_at(r)}. Fix the file; verl would fail the same way after Ray and the model "
                    f"have started ('Error loading module from ...')", "")
    elif stage == "name":
        found = r.get("callables") or []
        have = f"it defines: {', '.join(found)}" if found else "it defines no public function"
        what = f"is a {r['found']}, not a function" if r.get("found") else "is not defined"
        close = difflib.get_close_matches(name, found, n=1, cutoff=0.5)
        fixes = [f"{KEY}.name={n}" for n in close]
        fails = ("fail when they call it (TypeError: not callable)" if r.get("found") else
                 "fail with 'Object not found in module'")
        yield error(f"{KEY}.name={name}: `{name}` {what} in the reward file {where} ({have}); verl's reward workers "
                    f"would {fails}, after Ray and the model have started. Name the function verl calls "
                    f"(python run.py {KEY}.name=<function>) or define `{name}` in the file", ALT.join(fixes))
    elif stage == "timeout":
        yield warn(f"the reward file {where}: importing it and calling `{name}` on its sample answers did not finish "
                   f"within {r.get('timeout_s'):g} s, so it was not checked. verl calls it once per answer "
                   f"(train_batch_size x rollout.n per step): if it hangs there, training hangs at the first scoring")
    elif stage == "crash":
        yield error(f"the reward file {where}: the process that imported it and called `{name}` ended without a "
                    f"result (exit code {r.get('exit_code')}; a sys.exit/os._exit or a crash in the file?): "
                    f"{(r.get('stderr') or '')[-600:]}. verl's reward worker would die the same way", "")


def _fmt(x: Any) -> str:
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= 120 else s[:117] + "..."


@rule("reward_fn_result", kind="reward", phase="reward")
def reward_fn_result(c: Ctx) -> Iterable[Problem]:
    r = _probe(c)
    if not r or r.get("stage") not in ("call", "ok"):
        return
    path, name, kwargs = _cfg(c)
    where = reward_probe.file_of(str(path)) or str(path)
    sample = f"data_source={_fmt(r.get('data_source'))}, ground_truth={_fmt(r.get('ground_truth'))} " \
             f"({r.get('row_from')})"
    call = (f"{name}(data_source=..., solution_str=..., ground_truth=..., extra_info=..."
            + "".join(f", {k}=..." for k in kwargs) + ")")
    if r["stage"] == "call":
        hint, fix = "", ""
        unaccepted = [k for k in r.get("unaccepted") or [] if k in kwargs]
        if r.get("type") == "TypeError" and ("argument" in str(r.get("message")) or r.get("unaccepted")):
            hint = (f" verl calls it with keyword arguments only: {call}"
                    + (f" (from {KEY}.reward_kwargs: {', '.join(kwargs)})" if kwargs else "")
                    + "; give the function those parameters, or **kwargs"
                    + (f", or drop the reward_kwargs it does not take ({', '.join(unaccepted)}: a reward_fn preset's "
                       f"amounts stay when only the path is changed)" if unaccepted else "") + ".")
            if unaccepted and len(unaccepted) == len(r.get("unaccepted") or []):  # all of them reward_kwargs
                fix = " ".join(f"~{KEY}.reward_kwargs.{k}" for k in unaccepted)
        yield error(f"the reward function {where}:{name} raised {r.get('type')}: {r.get('message')}{_at(r)}, called "
                    f"as verl will call it with the answer {_fmt(r.get('answer'))} on {sample}.{hint} Fix the "
                    f"function: in verl this fails the first step that meets such an answer", fix)
        return
    calls = r.get("calls") or []
    for call_ in calls:
        ans = _fmt(call_["answer"])
        if call_["is_dict"] and not call_["has_score"]:
            yield error(f"the reward function {where}:{name} returned a dict without 'score' for the answer {ans} "
                        f"({_fmt(call_['result'])}): verl's reward manager reads result['score'] (KeyError). {NEEDS}. "
                        f"Fix the function's return value", "")
            return
        if not call_["number"]:
            got = f"{call_['score_type']} as 'score'" if call_["is_dict"] else call_["type"]
            yield error(f"the reward function {where}:{name} returned {_fmt(call_['result'])} (a {got}) for the "
                        f"answer {ans} on {sample}: {NEEDS}; verl writes the score into a float tensor and fails "
                        f"there. Fix the function's return value, e.g. return float(score)", "")
            return
        if call_.get("finite") is False:
            yield error(f"the reward function {where}:{name} returned a score of {call_['score']} for the answer "
                        f"{ans}: a non-finite reward makes the group's advantages NaN and the update NaN. Fix the "
                        f"function so that every answer gets a finite score", "")
            return
    keys = {tuple(c_["keys"]) for c_ in calls if c_["is_dict"]}
    if len(keys) > 1:
        yield warn(f"the reward function {where}:{name} returns dicts with different keys for different answers "
                   f"({' vs '.join(str(list(k)) for k in sorted(keys))}): verl makes one column per key from the "
                   f"first answer's keys (with trainer.use_v1=false its agent loop raises KeyError on an answer "
                   f"that lacks one). Return the same keys for every answer")
    own = reward_probe.OWN_ANSWERS
    if r.get("answers_error"):
        yield warn(f"the reward file {where}: {r['answers_error']} on {sample}; the probe tried answers built from the "
                   f"row's ground truth instead. Make {own}(ground_truth, extra_info) return a list of answer texts "
                   f"(an empty list for a row that is not its task's)")
    if r.get("synthetic_row") and r.get("own_answers"):
        return  # the file shapes its answers to its own task, and this row is no row of it: equal scores say nothing
    scores = [c_["score"] for c_ in calls]
    if len(calls) > 1 and len(set(scores)) == 1:
        tried = ", ".join(_fmt(c_["answer"]) for c_ in calls)
        shaped = ("" if r.get("answers_from", "").startswith(own) else
                  f" If your task's answers have a shape of their own, define {own}(ground_truth, extra_info) in the "
                  f"file: it returns sample answers for a row (a right one, a wrong one, a malformed one) and the "
                  f"probe scores those (README, 'Your own task')")
        yield warn(f"the reward function {where}:{name} gave every sample answer the same score {scores[0]:g} "
                   f"({tried}; answers {r.get('answers_from', 'built from the row')}; {sample}): if it scores all "
                   f"answers alike, every group's rewards are equal and GRPO's advantages are 0 (nothing is learned). "
                   f"Check that it can tell a right answer from a wrong one.{shaped}")


# ---- verl's own scorer: does it know the rows' data_source? ----------------------------------------------------------

# the sources grpo-lab's own generators write, and the reward_fn option that scores them
OURS = {"countdown": "reward_fn=countdown", "arith_": "reward_fn=strict_format"}


def _data_sources(files: list[str]) -> set[str]:
    out: set[str] = set()
    for f in files:
        if not (f.lower().endswith(".parquet") and os.path.isfile(f)):
            continue
        st = os.stat(f)
        out.update(_file_sources(f, st.st_mtime_ns, st.st_size))
    return out


@functools.lru_cache(maxsize=32)
def _file_sources(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The data_source values of one parquet file, read once per file version (the fix re-checks run the rules again
    and again on the same files)."""
    import pyarrow.parquet as pq  # ~0.3 s, only when a local parquet is there to read

    try:
        return frozenset(str(v) for v in pq.read_table(path, columns=["data_source"]).column(0).unique().to_pylist())
    except Exception:  # unreadable, or no data_source column: rule data_files and verl say so
        return frozenset()


@rule("reward_fn_data_source", kind="reward", phase="reward")
def reward_fn_data_source(c: Ctx) -> Iterable[Problem]:
    path, _, _ = _cfg(c)
    if path or c.get("reward.reward_model.enable", False):
        return  # a custom reward file (rules above) or a reward model scores the rows
    from grpo_lab.checks.inputs import local_files

    files = [f for key in ("data.train_files", "data.val_files") for f in (local_files(c.get(key)) or [])]
    sources = _data_sources(files)
    if not sources:
        return
    # the names and prefixes verl's default_compute_score dispatches on, read once per verl version from the function
    # itself (grpo_lab.verl_schema); any other raises NotImplementedError("Reward function is not implemented for
    # data_source=...") in the reward workers
    verl = schema()
    if verl.data_sources is None:  # verl's scorer could not be read: nothing to compare with
        return
    unknown = sorted(s for s in sources if not verl.knows_data_source(s))
    if not unknown:
        return
    fixes = sorted({fix for s in unknown for src, fix in OURS.items() if s == src or (src.endswith("_")
                                                                                    and s.startswith(src))})
    yield error(f"the data's data_source {', '.join(map(repr, unknown))} is not one verl's own scorer knows "
                f"(reward.custom_reward_function.path is null, so verl's default_compute_score scores every row, and "
                f"raises NotImplementedError for it in the reward workers, after start-up). Pick a reward_fn option "
                f"that scores it, or point {KEY}.path/name at a reward file of yours (README, 'Your own task')",
                fixes[0] if len(fixes) == 1 else "")
