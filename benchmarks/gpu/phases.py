"""Where a verl start-up goes: read a log stamped by stamp.py and print the time of each milestone.

    python3 benchmarks/gpu/phases.py LOG [LOG ...]       (one column per log)

Milestones are verl 0.9.1's own log lines (see ../shared/recorded/ for a full log).
"""

from __future__ import annotations

import re
import sys

MILESTONES = [
    ("ray.init called", r"ray init kwargs"),
    ("Ray started", r"Started a local Ray instance"),
    ("TaskRunner up (verl imported)", r"\(TaskRunnerV1 pid=\d+\)|\(TaskRunner pid=\d+\)"),
    ("datasets ready", r"train and validate dataloader initialized"),
    ("worker group created", r"create worker group"),
    ("actor+ref initialized", r"actor and ref model engine initialized"),
    ("vLLM server process up", r"\(vLLMHttpServer pid=\d+\)"),
    # the next five need vLLM's INFO lines (VLLM_LOGGING_LEVEL=INFO in the launching shell; verl sets WARN)
    ("vLLM config resolved", r"Resolved architecture"),
    ("vLLM engine core up", r"\(EngineCore pid=\d+\)|EngineCore"),
    ("vLLM worker process up", r"\(Worker pid=\d+\)"),
    ("vLLM model loaded", r"Model loading took"),
    ("vLLM engine initialized", r"init engine \(profile"),
    ("vLLM server serving", r"Detected the chat template content format|api_router"),
    ("ready to fit", r"all initialize finished, ready to fit"),
    ("step 1 done", r"step:1 "),
    ("step 2 done", r"step:2 "),
    ("step 3 done", r"step:3 "),
    ("last line", r"."),
]


def milestones(path: str) -> dict[str, float]:
    found: dict[str, float] = {}
    last = None
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"\s*(\d+\.\d+) (.*)", line)
            if not m:
                continue
            t, text = float(m.group(1)), m.group(2)
            last = t
            for name, pattern in MILESTONES[:-1]:
                if name not in found and re.search(pattern, text):
                    found[name] = t
    if last is not None:
        found["last line"] = last
    return found


def main(paths: list[str]) -> None:
    tables = [milestones(p) for p in paths]
    print(f"{'milestone (s since launch)':32}" + "".join(f"{p.rsplit('/', 1)[-1][:22]:>24}" for p in paths))
    for name, _ in MILESTONES:
        print(f"{name:32}" + "".join(f"{t[name]:24.1f}" if name in t else f"{'-':>24}" for t in tables))


if __name__ == "__main__":
    main(sys.argv[1:])
