"""benchmarks/gpu/session_lib.sh, the GPU session scripts' verbs: a background chain ended early by `stop` skips its
later phases and still packs the job it was running (a session short on device time keeps what it measured)."""

from __future__ import annotations

import os
import subprocess
import time

from conftest import ROOT

SCRIPT = """#!/usr/bin/env bash
set -uo pipefail
cd "{root}"
source benchmarks/gpu/session_lib.sh
case "$1" in
  slow) timed slow 300 sleep 300; pack slow ;;
  after) timed after 10 true; pack after ;;
  chain|bg|collect|stop) common_verb "$0" "$@" ;;
esac
"""


def test_stop_ends_the_running_job_packs_it_and_skips_the_rest(tmp_path):
    script = tmp_path / "session.sh"
    script.write_text(SCRIPT.format(root=ROOT))
    # PAR=1: no cleanup (it would stop every Ray and vLLM process of the machine, other tests' included)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "BG_OUT": str(tmp_path / "bg"), "PAR": "1"}
    run = lambda *a: subprocess.run(["bash", str(script), *a], text=True, capture_output=True, timeout=60, env=env)  # noqa: E731
    assert "started in the background" in run("bg", "slow", "after").stdout
    pid_file = tmp_path / "bg" / "logs" / ".job.pid"
    for _ in range(100):
        if pid_file.is_file() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    t0 = time.monotonic()
    proc = run("stop", "30")
    assert proc.returncode == 0 and "chain stopped" in proc.stdout, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 20
    times = (tmp_path / "bg" / "times.txt").read_text()
    assert times.startswith("slow rc=") and "slow rc=0 " not in times and "after" not in times
    assert "after skipped (stop)" in (tmp_path / "bg" / "chain.txt").read_text()
    assert (tmp_path / "bg" / "slow.tgz").is_file() and not (tmp_path / "bg" / "after.tgz").exists()
    assert not os.path.exists(f"/proc/{pid}") and not pid_file.exists()
    run("collect", "1")
    assert (tmp_path / "out" / "slow.tgz").is_file()
