"""How fast a bad config is refused: `python run.py <mistake>` against raw `python -m verl.trainer.main_ppo`.

    python benchmarks/preflight_speed.py                                   # the mistake: ppo_mini_batch_size=7
    python benchmarks/preflight_speed.py --mistake rollout_gpu_mem_util=1.5 --repeat 5
    python benchmarks/preflight_speed.py --skip-raw --json speed.json      # grpo-lab only (seconds, not minutes)

For grpo-lab it prints the wall time from the command to its refusal, the share of it spent importing Python modules
(`python -X importtime`, top-level imports summed), the interpreter's own start-up, and where the rest goes (Hydra
composing the config, twice in run mode, the preflight itself), and checks that the error names the mistake and that
Ray never started. The runs share a cache folder of their own (grpo_lab/verl_schema/verl_cache.py): the first one reads
verl's schema (a child process imports verl and Hydra composes its ~40 config files) and stores it, and is reported on
its own line (what the first command after installing or changing verl costs); the median is of the runs after it.
--no-verl-cache measures with the cache off.
Then it runs raw verl with the same settings and the same mistake (the overrides grpo_lab.launch.rawcmd derives from the
composed config) until its first error or --raw-timeout seconds, and prints the same columns. Both get the same
GSM8K-sized train/test parquet files (made in a temporary folder) and HF_HUB_OFFLINE=1, so neither waits on a
download. The target (issue 5): at most 2 s for grpo-lab on a CPU machine, and Ray never started.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KNOB_TO_VERL = {"ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
                "rollout_gpu_mem_util": "actor_rollout_ref.rollout.gpu_memory_utilization",
                "train_batch_size": "data.train_batch_size", "rollout_n": "actor_rollout_ref.rollout.n",
                "rollout_tp": "actor_rollout_ref.rollout.tensor_model_parallel_size",
                "ppo_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"}
TARGET_S = 2.0  # issue 5: a bad config refused within this on a CPU machine
RAY_STARTED = re.compile(r"Started a local Ray instance|ray init kwargs")
# a fatal-looking line: a traceback, an exception line, Hydra's "Error executing job", grpo-lab's refusal
EXCEPTION_LINE = re.compile(r"^\s*(\(\w+ pid=\d+\)\s*)?[\w.]*(Error|Exception)\b: ")
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|Error executing job|^\s*\[\w+\] |REFUSED|"
                        + EXCEPTION_LINE.pattern)


def write_data(folder: Path) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(n: int, split: str):
        return pa.table({
            "data_source": ["openai/gsm8k"] * n,
            "prompt": [[{"role": "user", "content": f"What is {i} + 1? Let's think step by step."}] for i in range(n)],
            "ability": ["math"] * n,
            "reward_model": [{"style": "rule", "ground_truth": str(i + 1)} for i in range(n)],
            "extra_info": [{"split": split, "index": i} for i in range(n)]})

    train, test = folder / "train.parquet", folder / "test.parquet"
    pq.write_table(table(7473, "train"), train)
    pq.write_table(table(1319, "test"), test)
    return train, test


def import_seconds(stderr: str) -> float:
    """Total of the top-level imports in `python -X importtime` output (cumulative microseconds, unindented names)."""
    total = 0
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if m and m.group(2) == "":
            total += int(m.group(1))
    return total / 1e6


def run_timed(cmd: list[str], env: dict, timeout: float, cwd: Path = ROOT) -> dict:
    """Run a command in its own session; time to exit and to the first error-looking line; kill it all on timeout."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[tuple[float, str]] = []
    timed_out = False
    try:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = timeout - (time.time() - t0)
            if left <= 0:
                timed_out = True
                break
            if not sel.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                if proc.poll() is not None:
                    break
                continue
            lines.append((time.time() - t0, line.rstrip("\n")))
    finally:
        if proc.poll() is None:
            _kill_session(proc)
        proc.wait()
    wall = time.time() - t0
    first_error = next(((t, text) for t, text in lines if ERROR_LINE.search(text)), None)
    return {"cmd": cmd, "returncode": proc.returncode, "timed_out": timed_out, "wall_s": round(wall, 2),
            "first_error_s": round(first_error[0], 2) if first_error else None,
            "first_error": first_error[1][:300] if first_error else None,
            "ray_started": any(RAY_STARTED.search(text) for _, text in lines),
            "output": "\n".join(text for _, text in lines)}


def _kill_session(proc: subprocess.Popen) -> None:
    """End the command and everything it started in its session (Ray's processes too), by process group id."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def ours(args, train: Path, test: Path, tmp: Path, env: dict) -> dict:
    base = [sys.executable, str(ROOT / "run.py"), args.mistake, f"train_file={train}", f"test_file={test}"]
    first = run_timed(base + [f"hydra.run.dir={tmp / 'job_first'}"], env, timeout=120)
    runs = []
    for i in range(args.repeat):
        runs.append(run_timed(base + [f"hydra.run.dir={tmp / f'job{i}'}"], env, timeout=120))
    walls = [r["wall_s"] for r in runs]
    imp = subprocess.run([sys.executable, "-X", "importtime", *base[1:], f"hydra.run.dir={tmp / 'job_imp'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    startup = min(_wall([sys.executable, "-c", "pass"], env) for _ in range(3))
    phases = in_process_phases(args, train, test, env)
    last = runs[-1]
    rule = rule_for(args.mistake)
    return {"name": "grpo-lab: python run.py", "wall_s": round(statistics.median(walls), 2), "walls": walls,
            "first_run_s": first["wall_s"],
            "returncode": last["returncode"], "ray_started": any(r["ray_started"] for r in runs),
            "names_the_mistake": bool(rule and f"[{rule}]" in last["output"]),
            "import_s": round(import_seconds(imp.stderr), 2), "python_startup_s": round(startup, 3),
            "phases_s": phases, "first_error": next((ln for ln in last["output"].splitlines() if f"[{rule}]" in ln),
                                                    last["first_error"]),
            "output_tail": last["output"][-1500:]}


def _wall(cmd: list[str], env: dict) -> float:
    t = time.time()
    subprocess.run(cmd, env=env, capture_output=True)
    return time.time() - t


def in_process_phases(args, train: Path, test: Path, env: dict) -> dict:
    """In a fresh interpreter: Hydra composing twice (as run.py does: hydra.get_mode, then the run), split,
    preflight."""
    code = f"""
import json, sys, time
t0 = time.time()
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from grpo_lab.launch.prepare import split
t1 = time.time()
with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base=None):
    overrides = {[args.mistake, f'train_file={train}', f'test_file={test}']!r}
    compose("config", overrides=overrides, return_hydra_config=True)
    t2 = time.time()
    cfg = compose("config", overrides=overrides, return_hydra_config=True)
t3 = time.time()
HydraConfig.instance().set_config(cfg)
verl, lab = split(cfg)
t4 = time.time()
from grpo_lab.checks.preflight import run_preflight
from grpo_lab.memory.run import Run
r = run_preflight(Run.build(verl, lab), launching=True)
t5 = time.time()
print(json.dumps({{"import_hydra_s": round(t1 - t0, 3), "compose_1_s": round(t2 - t1, 3),
                  "compose_2_s": round(t3 - t2, 3), "resolve_s": round(t4 - t3, 3), "preflight_s": round(t5 - t4, 3)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": out.stderr[-500:]}


def rule_for(mistake: str) -> str | None:
    key = mistake.split("=")[0]
    return {"ppo_mini_batch_size": "mini_batch_divisibility",
            "rollout_gpu_mem_util": "gpu_memory_utilization_range",
            # train_batch_size: no entry, verl 0.9.1's V1 trainer with dynamic batching pads a step that does not
            # split (batch_divisibility warns), so it is not a mistake the default config refuses
            "rollout_tp": "rollout_parallel",
            "ppo_max_token_len_per_gpu": "token_budget"}.get(key)


def raw_overrides(args, train: Path, test: Path) -> list[str]:
    from grpo_lab.launch.rawcmd import raw_overrides as derive

    over = derive([args.mistake, f"train_file={train}", f"test_file={test}"], str(ROOT / "conf"))
    out = []
    for o in over:
        m = re.match(r"^(\+*ray_kwargs\.ray_init\.runtime_env\.env_vars\.\w+)=(.*)$", o)
        out.append(f'{m.group(1)}="{m.group(2)}"' if m else o)  # Ray wants strings: keep verl's run on the mistake
    return out


def raw(args, train: Path, test: Path, env: dict) -> dict:
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *raw_overrides(args, train, test)]
    t = time.time()
    imp = subprocess.run([sys.executable, "-X", "importtime", "-c", "import verl.trainer.main_ppo"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    import_s = import_seconds(imp.stderr) if imp.returncode == 0 else None
    r = run_timed(cmd, env, timeout=args.raw_timeout)
    key = args.mistake.split("=")[0]
    verl_key = KNOB_TO_VERL.get(key, key).split(".")[-1]
    # does an exception message name the setting? (Hydra's "Error executing job with overrides: [...]" lists every
    # override, the mistake too, so it does not count)
    err_lines = [ln for ln in r["output"].splitlines() if EXCEPTION_LINE.search(ln)]
    names = any(verl_key in ln for ln in err_lines)
    return {"name": "raw verl: python -m verl.trainer.main_ppo", "wall_s": r["wall_s"],
            "first_error_s": r["first_error_s"], "returncode": r["returncode"], "timed_out": r["timed_out"],
            "ray_started": r["ray_started"], "names_the_mistake": names, "import_s": round(import_s, 2)
            if import_s is not None else None, "first_error": (err_lines[-1] if err_lines else r["first_error"]),
            "output_tail": r["output"][-3000:], "measured_in_s": round(time.time() - t, 1)}


def table(rows: list[dict]) -> str:
    head = f"{'':44} {'to error s':>10} {'imports s':>10} {'share':>6} {'exit':>5} {'names it':>8} {'Ray':>4}"
    out = [head, "-" * len(head)]
    for r in rows:
        wall = r["wall_s"] if not r.get("timed_out") else f">{r['wall_s']:.0f}"
        imp = r.get("import_s")
        share = f"{100 * imp / r['wall_s']:.0f}%" if imp and r["wall_s"] else "-"
        out.append(f"{r['name']:44} {wall!s:>10} {imp if imp is not None else '-'!s:>10} {share:>6} "
                   f"{r['returncode']!s:>5} {('yes' if r['names_the_mistake'] else 'no'):>8} "
                   f"{('yes' if r['ray_started'] else 'no'):>4}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mistake", default="ppo_mini_batch_size=7", help="the bad override (a grpo-lab knob)")
    ap.add_argument("--repeat", type=int, default=3, help="grpo-lab runs (median reported)")
    ap.add_argument("--raw-timeout", type=float, default=120, help="seconds raw verl gets to reach an error")
    ap.add_argument("--skip-raw", action="store_true", help="only grpo-lab")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--no-verl-cache", action="store_true",
                    help="GRPO_LAB_VERL_CACHE=0: Hydra composes verl's ~40 config files on every run")
    args = ap.parse_args(argv)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_VISIBLE", "ROLLOUT_", "PPO_"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "RAY_USAGE_STATS_ENABLED": "0", "GRPO_LAB_VERL_CACHE": "0" if args.no_verl_cache else "1"})
    with tempfile.TemporaryDirectory(prefix="preflight_speed_") as d:
        tmp = Path(d)
        env["GRPO_LAB_CACHE_DIR"] = str(tmp / "cache")  # empty: the first run builds it
        train, test = write_data(tmp)
        rows = [ours(args, train, test, tmp, env)]
        if not args.skip_raw:
            rows.append(raw(args, train, test, env))
    text = table(rows)
    cache = "off (GRPO_LAB_VERL_CACHE=0)" if args.no_verl_cache else "on"
    print(f"mistake: {args.mistake}   machine: {os.cpu_count()} CPUs   python {sys.version.split()[0]}   "
          f"verl config cache: {cache}")
    print(text)
    o = rows[0]
    ph = o["phases_s"]
    print(f"\ngrpo-lab: median of {args.repeat} = {o['wall_s']} s {o['walls']}; first run "
          f"{o['first_run_s']} s{'' if args.no_verl_cache else ' (builds the cache)'}; "
          f"python start-up {o['python_startup_s']} s; "
          f"in a fresh interpreter: import hydra+grpo_lab {ph.get('import_hydra_s')} s, compose "
          f"{ph.get('compose_1_s')} s, compose again {ph.get('compose_2_s')} s (run.py composes twice: "
          f"hydra.get_mode, then the run), resolve {ph.get('resolve_s')} s, preflight {ph.get('preflight_s')} s "
          f"(the rest: the job's set-up: output dir, .hydra/*.yaml, logs, the output tee)")
    print(f"grpo-lab's error: {o['first_error']}")
    if len(rows) > 1:
        r = rows[1]
        when = f"after {r['first_error_s']} s" if r["first_error_s"] is not None else "none"
        print(f"raw verl: {'timed out at' if r['timed_out'] else 'exited after'} {r['wall_s']} s; first error line "
              f"{when}; Ray started: {r['ray_started']}; its error: {r['first_error']}")
    met = o["wall_s"] <= TARGET_S and not o["ray_started"]
    print(f"target: <= {TARGET_S:g} s and no Ray -> {'met' if met else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"mistake": args.mistake, "rows": rows, "table": text}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
