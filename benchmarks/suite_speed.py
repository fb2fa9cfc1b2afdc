"""How long the CPU test suite takes at two commits, on this machine, in the same hour: alternating runs.

    python benchmarks/suite_speed.py --base dde5200                       # make test-fast's tests, 2 rounds
    python benchmarks/suite_speed.py --base dde5200 --full --rounds 1     # the whole suite (~15 min a run on 2 cores)
    python benchmarks/suite_speed.py --base HEAD~5 -- tests/test_facts.py # a selection (pytest's arguments)

This 2-core machine's speed swings by 30-50% within a day, so a suite time recorded at another hour says little about
the code (benchmarks/README.md). Here each commit gets a clean clone of this repository (nothing untracked, no caches),
sharing this checkout's .venv, and runs pytest as the Makefile does (pytest-xdist, one worker a core, bytecode caches
on); the commits take turns, base first. It prints each run's pytest seconds and test count, the medians and their
ratio. Keep the machine otherwise quiet while it runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pytest's last line: "1518 passed, 26 skipped in 862.11s (0:14:22)"
SUMMARY = re.compile(r"(\d+) passed.* in ([\d.]+)s")


def clone(rev: str, where: Path) -> Path:
    """A clean clone of this repository at `rev`, with this checkout's .venv linked in."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", rev], check=True)
    (where / ".venv").symlink_to(ROOT / ".venv")
    return where


def run_suite(checkout: Path, args: list[str]) -> tuple[float, int]:
    """(pytest's seconds, tests passed) of one run; exits when pytest's summary line is missing."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}  # as the Makefile: bytecode caches on
    proc = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-n", "auto", "--dist",
                           "loadgroup", *args], cwd=checkout, env=env, text=True, capture_output=True)
    found = SUMMARY.findall(proc.stdout)
    if not found:
        sys.exit(f"suite_speed: no pytest summary in {checkout} (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    passed, seconds = found[-1]
    return float(seconds), int(passed)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the commit to compare with")
    p.add_argument("--head", default="HEAD", help="the commit measured (default: HEAD)")
    p.add_argument("--full", action="store_true", help="the whole suite (default: the tests not marked slow)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("pytest_args", nargs="*", help="a selection instead (after --)")
    a = p.parse_args(argv)
    args = a.pytest_args or ([] if a.full else ["-m", "not slow"])
    if not (ROOT / ".venv" / "bin" / "python").exists():
        sys.exit("suite_speed: no .venv here: make .venv/.installed first")
    tmp = Path(tempfile.mkdtemp(prefix="grpo-lab-suite-speed-"))
    try:
        revs = {"base": a.base, "head": a.head}
        checkouts = {name: clone(rev, tmp / name) for name, rev in revs.items()}
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in revs}
        for r in range(1, a.rounds + 1):
            for name in revs:
                seconds, passed = run_suite(checkouts[name], args)
                runs[name].append((seconds, passed))
                print(f"round {r}  {name} {revs[name]:<12} {seconds:8.1f} s  {passed} passed", flush=True)
        medians = {name: statistics.median(s for s, _ in runs[name]) for name in revs}
        print(f"pytest {' '.join(args) or '(all)'}: median head {medians['head']:.1f} s, base {medians['base']:.1f} s, "
              f"head/base {medians['head'] / medians['base']:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
