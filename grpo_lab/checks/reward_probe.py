"""Import a custom reward file and call its function the way verl 0.9.1 will, in a child process, before Ray starts.

    result = probe(path, name, reward_kwargs, train_files)     # a dict: "stage" says how far it got

What verl does with the file, the row and answers tried, the child process: docs/preflight.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

# importing the file and one call per answer must finish within this (a reward that loads a model at import may need
# longer: the result is then "timeout", which the preflight reports as a warning, not a refusal)
TIMEOUT_S = 60.0
PKG_PREFIX, FILE_PREFIX = "pkg://", "file://"
SYNTHETIC_ROW = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42", "style": "rule"},
                 "extra_info": {"split": "train", "index": 0}}
_CACHE: dict[tuple, dict[str, Any]] = {}


def file_of(path: str) -> str | None:
    """The file verl opens for this path (file:// stripped, absolute from here); None for a pkg:// module."""
    if path.startswith(PKG_PREFIX):
        return None
    return os.path.abspath(os.path.expanduser(path.removeprefix(FILE_PREFIX)))


# the module-level function a reward file may define to give its own sample answers (module docstring)
OWN_ANSWERS = "probe_answers"


def answers(ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> list[str]:
    """The sample answers built from a row: right ones in the common formats, the row's reference answer, a wrong
    number and an empty answer."""
    gt = str(ground_truth)
    out = [gt, f"#### {gt}", f"The answer is \\boxed{{{gt}}}."]
    ref = (extra_info or {}).get("answer")
    if isinstance(ref, str) and ref.strip() and ref not in out:
        out.append(ref)
    try:
        wrong = float(gt.replace(",", ""))
    except ValueError:
        pass
    else:
        if math.isfinite(wrong):
            out.append(f"#### {int(wrong) + 1 if wrong == int(wrong) else wrong + 1:g}")
    return out + [""]


def own_answers(module: Any, ground_truth: Any, extra_info: Mapping[str, Any]) -> tuple[list[str] | None, str]:
    """The reward file's probe_answers for this row: (answers, "") ; (None, "") when it has none or gives none for
    this row; (None, why) when it fails or returns something else than a list of texts."""
    fn = getattr(module, OWN_ANSWERS, None)
    if fn is None:
        return None, ""
    if not callable(fn):
        return None, f"{OWN_ANSWERS} is a {type(fn).__name__}, not a function"
    try:
        got = fn(ground_truth, dict(extra_info))
    except Exception as e:  # noqa: BLE001 (a helper of the file: say so, and use the answers built from the row)
        return None, f"{OWN_ANSWERS} raised {type(e).__name__}: {e}"
    if not isinstance(got, (list, tuple)) or not all(isinstance(a, str) for a in got):
        return None, f"{OWN_ANSWERS} returned {type(got).__name__}, not a list of answer texts"
    return (list(got) or None), ""


def is_number(x: Any) -> bool:
    """What verl can write into its float32 rm_scores tensor: float(x) works and x is not text."""
    if isinstance(x, (str, bytes, dict, list, tuple)) or x is None:
        return False
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return True


def first_train_file(train_files: Any) -> str | None:
    """The first of data.train_files that is a file here (facts.local_files: remote ones are skipped)."""
    from grpo_lab.facts import local_files  # here, not at the top: the child runs this file without grpo_lab

    items = train_files if isinstance(train_files, (list, tuple)) else [train_files]
    return next((p for item in items for p in local_files(item) or () if os.path.isfile(p)), None)


def probe(path: str, name: str, reward_kwargs: Mapping[str, Any] | None, train_files: Any = None) -> dict[str, Any]:
    """Run the child on this reward function; the result dict (cached per file version, function, kwargs and row)."""
    f = file_of(path)
    train = first_train_file(train_files)
    stamp = lambda p: (p, os.stat(p).st_mtime_ns, os.stat(p).st_size) if p and os.path.isfile(p) else (p,)  # noqa
    kwargs = dict(reward_kwargs or {})
    key = (path, stamp(f), name, json.dumps(kwargs, sort_keys=True, default=str), stamp(train))
    if key not in _CACHE:
        _CACHE[key] = _run_child({"path": path, "file": f, "name": name, "reward_kwargs": kwargs, "train_file": train},
                                 TIMEOUT_S)
    return _CACHE[key]


def _run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    from grpo_lab.progress import waiting  # here, not at the top: the child runs this file without grpo_lab

    with tempfile.TemporaryDirectory(prefix="grpo-lab-reward-probe-") as tmp:
        spec_path, out_path, err_path = (os.path.join(tmp, n) for n in ("spec.json", "out.json", "stderr.txt"))
        with open(spec_path, "w") as fh:
            json.dump(spec, fh, default=str)
        code = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"
        with open(err_path, "wb") as err:
            # stdout/stderr to a file, not a pipe: a process the file starts cannot keep us waiting on a pipe
            proc = subprocess.Popen([sys.executable, "-c", code, spec_path, out_path], stdin=subprocess.DEVNULL,
                                    stdout=err, stderr=err, start_new_session=True)
            try:
                with waiting(f"reward probe: {spec['name']} of {spec['file'] or spec['path']} still running "
                             f"(gives up at {timeout:g} s)"):
                    rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return {"stage": "timeout", "timeout_s": timeout}
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
        try:
            with open(out_path) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            with open(err_path, "rb") as fh:
                tail = fh.read()[-1500:].decode("utf-8", "replace").strip()
            return {"stage": "crash", "exit_code": rc, "stderr": tail}


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and what it started, nothing else
    proc.wait()


# ---------------------------------------------------------------------------------------------------------------------
# the child


def _where(exc: BaseException, file: str | None) -> dict[str, Any]:
    """The line of the reward file the exception passed through last, and the line it was raised at."""
    import linecache
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, SyntaxError) and exc.filename:
        out["file_line"] = f"{exc.filename}:{exc.lineno}"
        out["code"] = (exc.text or "").strip()
        return out
    mine = [fr for fr in frames if file and os.path.abspath(fr.filename) == file]
    if mine:
        fr = mine[-1]
        out["file_line"] = f"{fr.filename}:{fr.lineno}"
        out["code"] = (fr.line or linecache.getline(fr.filename, fr.lineno)).strip()
    if frames and (not mine or frames[-1] is not mine[-1]):
        out["raised_at"] = f"{frames[-1].filename}:{frames[-1].lineno}"
    return out


def _first_row(train_file: str | None) -> tuple[dict[str, Any], str]:
    if not train_file:
        return dict(SYNTHETIC_ROW), "a synthetic row (no training parquet here)"
    try:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(train_file)
        cols = [c for c in ("data_source", "reward_model", "extra_info") if c in pf.schema_arrow.names]
        batch = next(pf.iter_batches(batch_size=1, columns=cols))
        row = batch.to_pylist()[0]
    except Exception as e:  # noqa: BLE001 (any unreadable file: the synthetic row, and say why)
        return dict(SYNTHETIC_ROW), f"a synthetic row ({train_file} unreadable: {type(e).__name__}: {e})"
    rm = row.get("reward_model") if isinstance(row.get("reward_model"), dict) else {}
    if "ground_truth" not in rm:
        return dict(SYNTHETIC_ROW), f"a synthetic row ({train_file}'s first row has no reward_model.ground_truth)"
    return {"data_source": row.get("data_source"), "reward_model": rm,
            "extra_info": row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}}, \
        f"the first row of {train_file}"


def _jsonable(x: Any) -> Any:
    try:
        json.dumps(x)
        return x
    except (TypeError, ValueError):
        return repr(x)[:300]


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio
    import importlib
    import importlib.util
    import inspect

    path, file, name = spec["path"], spec["file"], spec["name"]
    # import, as verl.utils.import_utils.load_module does
    try:
        if file is None:
            module = importlib.import_module(path[len(PKG_PREFIX):].replace("/", "."))
        else:
            spec_ = importlib.util.spec_from_file_location(f"custom_module_{hash(file)}", file)
            if spec_ is None or spec_.loader is None:
                return {"stage": "import", "type": "ImportError", "message": f"Could not load module from {file}"}
            module = importlib.util.module_from_spec(spec_)
            spec_.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 (SystemExit at import too: verl's worker would die of it)
        return {"stage": "import", **_where(e, file)}
    fn = getattr(module, name, None)
    mod_name = getattr(module, "__name__", None)
    defined = sorted(k for k, v in vars(module).items()
                     if callable(v) and not k.startswith("_") and k != OWN_ANSWERS
                     and getattr(v, "__module__", None) == mod_name)
    if fn is None or not callable(fn):
        return {"stage": "name", "found": None if fn is None else type(fn).__name__, "callables": defined}
    row, row_from = _first_row(spec.get("train_file"))
    # the keyword arguments verl passes that the function does not take (none when it has **kwargs)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = not params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    sent = ["data_source", "solution_str", "ground_truth", "extra_info", *spec["reward_kwargs"]]
    unaccepted = [] if takes_any else [k for k in sent
                                       if k not in params or params[k].kind == params[k].POSITIONAL_ONLY]
    gt = row["reward_model"]["ground_truth"]
    mine, answers_error = own_answers(module, gt, row.get("extra_info") or {})
    answers_from = f"{OWN_ANSWERS} in the reward file" if mine else "built from the row's ground truth"
    calls = []
    for answer in mine or answers(gt, row.get("extra_info")):
        extra_info = dict(row.get("extra_info") or {})
        extra_info.update(num_turns=2, rollout_reward_scores={})  # what verl's reward managers add
        kwargs = {"data_source": row["data_source"], "solution_str": answer, "ground_truth": gt,
                  "extra_info": extra_info, **spec["reward_kwargs"]}
        try:
            result = asyncio.run(fn(**kwargs)) if inspect.iscoroutinefunction(fn) else fn(**kwargs)
        except BaseException as e:  # noqa: BLE001
            return {"stage": "call", "answer": answer, "row_from": row_from,
                    "data_source": _jsonable(row["data_source"]), "ground_truth": _jsonable(gt),
                    "unaccepted": unaccepted, **_where(e, file)}
        score = result.get("score") if isinstance(result, dict) else result
        calls.append({"answer": answer, "result": _jsonable(result) if isinstance(result, dict) else repr(result)[:300],
                      "type": type(result).__name__, "is_dict": isinstance(result, dict),
                      "has_score": isinstance(result, dict) and "score" in result,
                      "score_type": type(score).__name__, "number": is_number(score),
                      "score": float(score) if is_number(score) else None,
                      "keys": sorted(map(str, result)) if isinstance(result, dict) else None})
    return {"stage": "ok", "row_from": row_from, "data_source": _jsonable(row["data_source"]),
            "ground_truth": _jsonable(gt), "calls": calls, "callables": defined, "answers_from": answers_from,
            "own_answers": hasattr(module, OWN_ANSWERS), "answers_error": answers_error,
            "synthetic_row": row_from.startswith("a synthetic row")}


def _main(argv: Iterable[str]) -> None:
    spec_path, out_path = list(argv)[:2]
    with open(spec_path) as fh:
        spec = json.load(fh)
    with contextlib.redirect_stdout(sys.stderr):  # the file's prints stay out of the way
        result = _child(spec)
    for c in result.get("calls", []):
        if c.get("score") is not None and not math.isfinite(c["score"]):
            c["score"] = repr(c["score"])  # nan / inf: JSON has no such numbers
            c["finite"] = False
    with open(out_path, "w") as fh:
        json.dump(result, fh, default=str)
    sys.stdout.flush()
    os._exit(0)  # threads or atexit handlers the file left behind must not keep the child alive


if __name__ == "__main__":
    _main(sys.argv[1:])
