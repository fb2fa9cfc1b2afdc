"""What run.py adds before verl starts: time from the command to verl's `ray init kwargs` line, grpo-lab vs raw verl.

    python benchmarks/launcher_overhead.py [--repeat 3]

Both run the same job (experiment=smoke_tiny hardware=h200x1 on files made by grpo_lab.tasks.tiny; raw verl gets the
overrides grpo_lab.launch.rawcmd derives from the composed config, computed before the clock starts). Everything after
that line is verl's own code in both, so the difference is the launcher's cost: composing with our groups, the
preflight, writing the job folder, tee-ing the output. Runs on a CPU machine: CUDA_VISIBLE_DEVICES=0 lets the
preflight's GPU check pass (with a stand-in `nvidia-smi -L` that lists one GPU), and each process is stopped at that
line, before Ray starts anything.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MARK = "ray init kwargs"


def time_to_mark(cmd: list[str], env: dict[str, str], timeout: float = 300) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    tail = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line])[-20:]
            if MARK in line:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                break
        raise RuntimeError(f"{cmd[:3]} never reached '{MARK}':\n{''.join(tail)}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from grpo_lab.launch.rawcmd import raw_overrides

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "grpo_lab.tasks.tiny", "--out", tmp], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        job = ["experiment=smoke_tiny", "hardware=h200x1", f"model_path={tmp}/tiny-qwen3",
               f"train_file={tmp}/arith_tiny/train.parquet", f"test_file={tmp}/arith_tiny/test.parquet"]
        raw_args = raw_overrides(job, str(ROOT / "conf"))
        fake = Path(tmp) / "bin"
        fake.mkdir()
        (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in for the launcher benchmark'\n")
        (fake / "nvidia-smi").chmod(0o755)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
               "PATH": f"{fake}:{os.environ['PATH']}"}
        ours_cmd = [sys.executable, "run.py", *job, f"hydra.run.dir={tmp}/job"]
        raw_cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *raw_args]
        ours, raw = [], []
        for _ in range(args.repeat):  # interleaved, so that cache warmth favours neither
            raw.append(time_to_mark(raw_cmd, env))
            ours.append(time_to_mark(ours_cmd, env))
    ray_cli = Path(sys.executable).with_name("ray")
    if ray_cli.exists():  # nothing should be left, but never leave a Ray behind
        subprocess.run([str(ray_cli), "stop", "--force"], capture_output=True)
    r, o = statistics.median(raw), statistics.median(ours)
    print(f"seconds from the command to verl's '{MARK}' (median of {args.repeat}; each: raw {raw}, ours {ours})")
    print(f"  raw verl (python -m verl.trainer.main_ppo): {r:6.2f}")
    print(f"  grpo-lab (python run.py):                   {o:6.2f}")
    print(f"  launcher overhead: {o - r:+.2f} s  (ratio {o / r:.2f}; target: under 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
