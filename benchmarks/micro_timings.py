"""The small costs docs/ quotes, each measured on this machine: reading verl's schema cache file, a copy of verl's
composed tree (unpickled, deepcopy, OmegaConf.create), Hydra composing verl's config files, composing one conf/ option,
the reward probe's child process, and the plans make fit's search evaluates.

    python benchmarks/micro_timings.py                                        # medians printed
    python benchmarks/micro_timings.py --repeat 30 --out benchmarks/micro_timings.json    # the file docs/ cites

In-process costs are the median of --repeat runs after one warm-up (imports and first-call caches outside the clock);
what a fresh interpreter pays (verl's files composed, the first conf/ option with Hydra's set-up) is the median of
--processes child processes, their imports outside the clock. The schema cache is built first in a folder of its own
(--cache-dir, default a temporary one), untimed. tests/test_docs.py checks docs/ against the --out file; it never
measures.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def timed(fn, repeat: int, *, before=None) -> list[float]:
    """Seconds of fn() for each of `repeat` runs, after one warm-up run; `before` runs untimed ahead of each."""
    out = []
    for i in range(repeat + 1):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        if i:
            out.append(time.perf_counter() - t0)
    return out


def summary(runs: list[float], scale: float = 1.0, digits: int = 4) -> dict:
    """{"median", "min", "max", "runs"} in the unit `scale` gives (1e3: ms)."""
    vals = [round(r * scale, digits) for r in runs]
    return {"median": round(statistics.median(runs) * scale, digits), "min": min(vals), "max": max(vals), "runs": vals}


def in_child(code: str, processes: int) -> list[float]:
    """The float the code prints last, from each of `processes` fresh interpreters (imports outside its clock)."""
    out = []
    for _ in range(processes):
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        out.append(float(proc.stdout.split()[-1]))
    return out


def schema_costs(repeat: int, processes: int) -> dict:
    """verl's schema: the cache file read, the tree's copies for Hydra, and what building the cache composes."""
    from omegaconf import OmegaConf

    from grpo_lab.verl_schema import api, build, verl_cache
    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    root = verl_config_dir()
    t0 = time.perf_counter()
    origin = verl_cache.load(root).origin  # built here when the cache folder has none (a child imports verl)
    built_s = time.perf_counter() - t0
    tree = api.schema(root).tree
    cfg = OmegaConf.create(tree)
    pickled = pickle.dumps(cfg)
    compose = ("import time\nfrom grpo_lab.verl_schema.hydra_internals import compose_folder\n"
               "import hydra._internal.config_loader_impl, hydra.core.plugins\n"
               f"t0 = time.perf_counter(); compose_folder({root!r}, 'ppo_trainer'); print(time.perf_counter() - t0)")
    return {
        "schema_cache_first_s": {"seconds": round(built_s, 2), "origin": origin},
        "schema_file_ms": summary(timed(lambda: verl_cache.load(root), repeat), 1e3, 2),
        "tree_create_ms": summary(timed(lambda: OmegaConf.create(tree), repeat), 1e3, 1),
        "tree_unpickle_ms": summary(timed(lambda: pickle.loads(pickled), repeat), 1e3, 1),
        "tree_deepcopy_ms": summary(timed(lambda: copy.deepcopy(cfg), repeat), 1e3, 1),
        "verl_compose_s": summary(in_child(compose, processes), 1, 3),
        "verl_config_files": len(build.yaml_files(root)),
    }


def conf_option_costs(repeat: int, processes: int) -> dict:
    """facts.conf_options: one conf/ option composed (Hydra set up), and the first option of a fresh process."""
    from grpo_lab import facts

    every = [(g, o) for g in facts.conf_groups() for o in facts.conf_options(g)]
    runs = []
    for _ in range(repeat):
        for g, o in every:
            facts._COMPOSED.pop((g, o), None)
            t0 = time.perf_counter()
            facts.conf_options(g, [o])
            runs.append(time.perf_counter() - t0)
    first = ("import time\nfrom grpo_lab import facts\nimport hydra, omegaconf\n"
             "t0 = time.perf_counter(); facts.conf_option('model', 'qwen3_1_7b'); print(time.perf_counter() - t0)")
    return {"conf_option_ms": {**summary(runs, 1e3, 1), "options": len(every), "runs": []},
            "conf_first_option_ms": summary(in_child(first, processes), 1e3, 1)}


def reward_probe_costs(repeat: int) -> dict:
    """The reward probe's child process, per reward file and row: the countdown reward with its own sample answers on
    a countdown row, and strict_format on a GSM8K-shaped row and on the synthetic one (no train file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_lab.checks import reward_probe
    from grpo_lab.tasks import countdown, tiny
    from grpo_lab.tasks.data import gsm8k_row

    rewards = ROOT / "grpo_lab" / "tasks" / "rewards"
    with tempfile.TemporaryDirectory(prefix="micro_timings_") as d:
        cd, gsm = Path(d) / "countdown.parquet", Path(d) / "arith.parquet"
        pq.write_table(pa.Table.from_pylist(countdown.rows(64, 8)["train"]), cd)
        rows = [gsm8k_row(r["question"], r["answer"], "train", i) for i, r in enumerate(tiny.arith_records(64, 0))]
        pq.write_table(pa.Table.from_pylist(rows), gsm)
        kw = {"correct_score": 1.0, "format_score": 0.1, "missing_penalty": 0.1}
        cases = {"countdown, its own answers": (rewards / "countdown.py", kw | {"invalid_score": 0.0}, cd),
                 "strict_format, a GSM8K-shaped row": (rewards / "strict_format.py", kw, gsm),
                 "strict_format, no train file": (rewards / "strict_format.py", kw, None)}
        def once(path: Path, kwargs: dict, train: Path | None) -> None:
            result = reward_probe.probe(str(path), "compute_score", kwargs, str(train) if train else None)
            assert result.get("stage") == "ok", result

        out = {case: summary(timed(lambda c=c: once(*c), repeat, before=reward_probe._CACHE.clear), 1, 3)
               for case, c in cases.items()}
    return {"reward_probe_s": out}


def fit_costs() -> dict:
    """make fit's search over every model option on every hardware option: the plans evaluated per config (one that
    fits as composed gets no search), and the seconds of each evaluation (FitContext.eval, cached ones left out)."""
    from conftest import composed, options

    from grpo_lab.checks import fit as F
    from grpo_lab.memory import fit_search
    from grpo_lab.memory.run import Run

    spent = []
    plain = fit_search.FitContext.eval

    def clocked(self, s):
        n, t0 = self.evaluations, time.perf_counter()
        out = plain(self, s)
        if self.evaluations > n:
            spent[-1] += time.perf_counter() - t0
        return out

    fit_search.FitContext.eval = clocked
    rows = []
    try:
        for model in options("model"):
            for hw in options("hardware"):
                run = Run.build(*composed(f"model={model}", f"hardware={hw}"))
                spent.append(0.0)
                res = F.fit(run)
                rows.append({"model": model, "hardware": hw, "evaluations": res.evaluations,
                             "changes": len(res.overrides), "fits": res.ok, "lora": res.lora, "s": spent[-1]})
    finally:
        fit_search.FitContext.eval = plain
    evals = [r["evaluations"] for r in rows]
    as_composed = [r["evaluations"] for r in rows if r["fits"] and not r["changes"]]
    per = [r.pop("s") / r["evaluations"] for r in rows if r["evaluations"]]
    return {"fit_evaluations": {"median": statistics.median(evals), "min": min(evals), "max": max(evals),
                                "configs": len(rows), "fitting_as_composed": [min(as_composed), max(as_composed)],
                                "rows": rows},
            "fit_evaluation_ms": summary(per, 1e3, 3) | {"runs": []}}


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="in-process runs of each cost, median reported")
    ap.add_argument("--processes", type=int, default=5, help="fresh interpreters for the per-process costs")
    ap.add_argument("--cache-dir", help="the schema cache folder (default: a new temporary one, built first)")
    ap.add_argument("--skip-fit", action="store_true", help="leave out make fit's search (~1 min on 2 cores)")
    ap.add_argument("--out", help="write the results here (JSON, with the date, commit and core count)")
    args = ap.parse_args(argv)

    os.environ["GRPO_LAB_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="grpo-lab-micro-timings-")
    load = os.getloadavg()[0]
    results = {**schema_costs(args.repeat, args.processes), **conf_option_costs(args.repeat, args.processes),
               **reward_probe_costs(args.repeat), **({} if args.skip_fit else fit_costs())}
    doc = {"date": datetime.date.today().isoformat(), "commit": git_commit(), "cpus": os.cpu_count(),
           "python": sys.version.split()[0], "repeat": args.repeat, "processes": args.processes,
           "load_average_before": round(load, 2), "load_average_after": round(os.getloadavg()[0], 2),
           "command": "python benchmarks/micro_timings.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "results": results}
    for name, r in results.items():
        if isinstance(r, dict) and "median" in r:
            print(f"{name:28} median {r['median']}  [{r.get('min')}, {r.get('max')}]")
        elif isinstance(r, dict) and all(isinstance(v, dict) and "median" in v for v in r.values()):
            for case, v in r.items():
                print(f"{name:28} median {v['median']}  [{v['min']}, {v['max']}]  {case}")
        else:
            print(f"{name:28} {r}")
    print(f"{os.cpu_count()} CPU(s), load average {load:.2f} before, {doc['load_average_after']:.2f} after")
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
