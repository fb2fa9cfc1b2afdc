"""Progress on work that can take more than 5 s (grpo_lab/progress.py, docs/cli.md): the reward probe's wait through
`python run.py`, whose console is tee'd into train.log, prints a whole line naming the function and the seconds, and
make doctor still reads that train.log; the helper make capacity, make smollm2 and make fit share draws a bar on a
terminal (a pty), whole lines in a pipe, and nothing for work shorter than its delay."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from dataclasses import replace

from conftest import ROOT, run_py

from grpo_lab.after_run.doctor import verdict

SLOW_REWARD = """\
import time

time.sleep(7)  # a grader that loads something big at import


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip().endswith(str(ground_truth)))
"""


def test_slow_reward_probe_prints_a_line_and_train_log_stays_readable(tmp_path):
    f = tmp_path / "slow_reward.py"
    f.write_text(SLOW_REWARD)
    job = tmp_path / "job"
    out = run_py("preflight.only=true", f"reward.custom_reward_function.path={f}", f"hydra.run.dir={job}")
    line = re.compile(rf"^grpo-lab: reward probe: compute_score of {re.escape(str(f))} still running "
                      rf"\(gives up at 60 s\): (\d+) s$", re.M)
    shown = [int(s) for s in line.findall(out.stdout + out.stderr)]
    assert len(shown) == 1 and 5 <= shown[0] <= 7, out.stdout + out.stderr  # one line after 5 s, the next at 20 s
    assert "preflight: plan OK" in out.stdout and "[reward_fn" not in out.stdout, out.stdout
    log = (job / "train.log").read_text()
    assert len(line.findall(log)) == 1 and "\r" not in log
    without = "".join(x for x in log.splitlines(keepends=True) if not line.match(x.rstrip("\n")))
    same = [replace(d, line=0) for d in verdict.diagnose(without)]  # the same diagnoses, one line further down
    assert [replace(d, line=0) for d in verdict.diagnose(log)] == same and same
    made = subprocess.run([sys.executable, "-m", "grpo_lab.after_run.doctor", str(job / "train.log")], cwd=ROOT,
                          capture_output=True, text=True)  # = make doctor LOG=...
    assert made.returncode == 0 and "no known failure signature" in made.stdout, made.stdout + made.stderr


FAKE = """\
import time
from grpo_lab import progress
progress.DELAY_S, progress.LINE_EVERY_S = {delay}, 0.5
for _ in progress.progress(range(20), "fake capacity", unit="configs"):
    time.sleep(0.1)
with progress.waiting("fake conversion"):
    time.sleep(1.5)
print("done")
"""


def on_a_terminal(delay: float) -> str:
    """The fake slow loop's output, its stdout and stderr a terminal (a pty of 100 columns)."""
    cmd = [sys.executable, "-c", FAKE.format(delay=delay)]
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sub, stderr=sub)
    os.close(sub)
    got = b""
    while chunk := _read(main):
        got += chunk
    proc.wait(timeout=60)
    os.close(main)
    return got.decode()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # the child closed the pty
        return b""


def test_progress_bar_on_a_terminal_lines_in_a_pipe_nothing_when_quick():
    term = on_a_terminal(0.5)
    assert "\r" in term and re.search(r"fake capacity: +\d+%\|", term), repr(term)  # a bar, redrawn
    assert "\rgrpo-lab: fake conversion: 1 s" in term, repr(term)  # seconds, nothing to fill
    piped = subprocess.run([sys.executable, "-c", FAKE.format(delay=0.5)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = piped.stderr.splitlines()
    assert "\r" not in piped.stderr and lines and all(re.fullmatch(
        r"grpo-lab: fake capacity: \d+/20 configs, \d+ s|grpo-lab: fake conversion: \d+ s", x) for x in lines), lines
    assert 2 <= len(lines) <= 6, lines  # one after the delay, then one per LINE_EVERY_S
    quick = subprocess.run([sys.executable, "-c", FAKE.format(delay=30)], cwd=ROOT, capture_output=True, text=True)
    assert quick.stdout == "done\n" and quick.stderr == "", quick.stderr
