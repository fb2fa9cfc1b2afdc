"""How long the fit's search takes for one config: every conf/model option on every conf/hardware option.

    python benchmarks/fit_speed.py                 # the grid, each config searched --repeat times (default 3)
    python benchmarks/fit_speed.py --repeat 5 --json fit_speed.json

Times `grpo_lab.checks.fit.fit(verl, lab)` alone: the search, the plans before and after, what would fit when nothing
does, and the check of the result with the preflight. Composing the config (Hydra, ~0.3 s a config here) is outside
the clock: it is the same for `make plan`. For each config it prints the fastest of the repeats, the plans evaluated
and the outcome; then the median and the maximum over the grid. The target (issue 13): under 2 s for one config on the
2-core CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("GRPO_LAB_CACHE_DIR", tempfile.mkdtemp(prefix="grpo-lab-fit-speed-"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="searches per config; the fastest counts (default 3)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)

    from conftest import composed, options  # the tests' compose helper: the config run.py would build, no files

    from grpo_lab.checks import fit as F
    from grpo_lab.memory.run import Run

    rows = []
    print(f"{'model':<16} {'hardware':<16} {'search s':>8} {'plans':>6}  outcome")
    for model in options("model"):
        for hw in options("hardware"):
            verl, lab = composed(f"model={model}", f"hardware={hw}")
            times, res = [], None
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                res = F.fit(Run.build(verl, lab))
                times.append(time.perf_counter() - t0)
            assert res is not None
            outcome = ("blocked: " + res.blocked[0].split("]")[0][1:] if res.blocked else
                       ("fits, LoRA" if res.lora else "fits") + f" ({len(res.overrides)} override(s))" if res.ok else
                       "nothing fits: " + "; ".join(w.split(":")[0] for w in res.way_out))
            rows.append({"model": model, "hardware": hw, "seconds": round(min(times), 4),
                         "evaluations": res.evaluations, "ok": res.ok, "lora": res.lora, "outcome": outcome})
            print(f"{model:<16} {hw:<16} {min(times):>8.3f} {res.evaluations:>6}  {outcome}")
    secs = [r["seconds"] for r in rows]
    print(f"\n{len(rows)} configs: median {statistics.median(secs):.3f} s, max {max(secs):.3f} s per config "
          f"(target: under 2 s); {os.cpu_count()} CPU(s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "median_s": statistics.median(secs),
                                               "max_s": max(secs)}, indent=2) + "\n")
    return 0 if max(secs) < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
