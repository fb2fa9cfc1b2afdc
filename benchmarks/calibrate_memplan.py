"""Replay every recorded GPU job through the memory plan and compare the plan with what the job measured.

    python benchmarks/calibrate_memplan.py            # print plan vs measured per job and per regime; exit 1 when a
                                                      # job is outside the stated accuracy
                                                      # (grpo_lab/memory/calibration.py)
    python benchmarks/calibrate_memplan.py --write    # also write benchmarks/gpu/memplan_calibration.{json,md}
    make calibrate                                    # the same as --write

A job is a folder under benchmarks/gpu/results/ with the verl_config.yaml it ran with. The plan is made from that
config exactly as the preflight makes it (grpo_lab.memory.settings.settings_from_verl, the model's facts
from conf/model/ by the model folder's name, the card from the job's plan.json). Measured:

* training: the largest `actor/perf/max_memory_reserved_gb` (and `..._allocated_gb`) in its metrics.jsonl: verl's
  torch-allocator peak of the trainer process so far (verl never resets it), in GiB; against the plan's
  `trainer_allocator` peak (the largest of the update, the log-prob passes and the weight syncs);
* kv_cache: vLLM's `Available KV cache memory: X GiB` in its train.log (or the job's own `make report` text);
  a job launched side by side with others (hydra/launcher=side_by_side) is listed but not held to it: vLLM sizes
  its cache from what is free while it profiles, which the other jobs change (the preflight's side_by_side_jobs
  rule warns and prints the pin);
* trainer CUDA context: verl's `device memory used/total (GB)` minus `memory reserved (GB)` after the first FSDP
  build, for a job alone on the card: the CUDA context and NCCL's buffers, which torch's allocator does not see.

Folders that measured something but have no verl_config.yaml are listed as not replayed. Also replayed: the
training sub-phases of `benchmarks/gpu/memplan_bench.py` (FSDP2, no vLLM), from its recorded JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from grpo_lab.labconf import Lab  # noqa: E402
from grpo_lab.memory import calibration, memplan  # noqa: E402
from grpo_lab.memory.settings import settings_from_verl  # noqa: E402

RESULTS = ROOT / "benchmarks" / "gpu" / "results"
BENCH_JSON = RESULTS / "2026-12-02" / "memplan" / "memplan_h200.json"
GIB_GB = 2**30 / 1e9  # verl and vLLM print GiB (verl labels them "GB"); the plan's unit is 1e9 bytes
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_KV = re.compile(r"Available KV cache memory: (-?[0-9.]+) GiB")
_KV_REPORT = re.compile(r"vLLM's KV cache ([0-9.]+) GB")
_FSDP = re.compile(r"(Before|After) FSDP, memory allocated \(GB\): ([0-9.]+), memory reserved \(GB\): ([0-9.]+), "
                   r"device memory used/total \(GB\): ([0-9.]+)/")


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=LOADER)


def model_facts() -> dict[str, dict[str, Any]]:
    """conf/model's lab.model facts (each option as Hydra composes it) by the model folder's name (data/<name>) and by
    hub id."""
    from grpo_lab.facts import conf_options

    out = {}
    for doc in conf_options("model").values():
        model = (doc.get("lab") or {}).get("model") or {}
        for key in (str(doc.get("model_path") or "").rstrip("/").rsplit("/", 1)[-1], model.get("hub_id")):
            if key:
                out.setdefault(key, model)
    return out


def training_measured(job: Path) -> dict[str, float] | None:
    f = job / "metrics.jsonl"
    if not f.is_file():
        return None
    reserved, allocated, steps = [], [], 0
    for line in f.read_text().splitlines():
        try:
            data = json.loads(line).get("data", {})
        except ValueError:
            continue  # a line cut short when the job was killed
        if "actor/perf/max_memory_reserved_gb" in data:
            steps += 1
            reserved.append(float(data["actor/perf/max_memory_reserved_gb"]))
            allocated.append(float(data.get("actor/perf/max_memory_allocated_gb", 0.0)))
    if not reserved:
        return None
    return {"reserved_gb": round(max(reserved) * GIB_GB, 3), "allocated_gb": round(max(allocated) * GIB_GB, 3),
            "steps": steps}


def kv_measured(job: Path) -> list[float]:
    log = job / "train.log"
    if log.is_file():
        return [round(float(x) * GIB_GB, 3) for x in _KV.findall(log.read_text(errors="replace"))]
    report = job / "report.txt"
    if report.is_file():
        return [float(x) for x in _KV_REPORT.findall(report.read_text())]
    return []


def trainer_context(job: Path) -> float | None:
    """GB the trainer process holds outside torch's allocator after its first FSDP build, when alone on the card."""
    log = job / "train.log"
    if not log.is_file():
        return None
    found = _FSDP.findall(log.read_text(errors="replace"))
    before = [float(u) for when, _, _, u in found if when == "Before"]
    after = [(float(r), float(u)) for when, _, r, u in found if when == "After"]
    if not before or not after or before[0] > 1.0:  # another process was on the card already
        return None
    reserved, used = after[0]
    return round((used - reserved) * GIB_GB, 3)


def side_by_side(job: Path) -> bool:
    """Launched beside other jobs: by Hydra's joblib launcher (n_jobs > 1), or by a GPU script's side-by-side chains
    (benchmarks/gpu/session_lib.sh `par`), which the recorded folder says with a SIDE_BY_SIDE file."""
    if (job / "SIDE_BY_SIDE").is_file() or (job.parent / "SIDE_BY_SIDE").is_file():
        return True
    for f in (job / ".hydra" / "hydra.yaml", job.parent / "multirun.yaml"):
        if f.is_file():
            doc = _yaml(f) or {}
            launcher = (doc.get("hydra") or {}).get("launcher") or {}
            if int(launcher.get("n_jobs") or 1) > 1:
                return True
    return False


def job_model_facts(job: Path) -> dict[str, Any]:
    """The model group's facts the job was composed with (its .hydra/config.yaml's lab.model): a model folder of
    another name, e.g. the random-weight Qwen3 of grpo_lab.tasks.qwen3_random, planned as the group of its size."""
    doc = _yaml(job / ".hydra" / "config.yaml") or {}
    model = (doc.get("lab") or {}).get("model") or {}
    if not model.get("hidden_size"):
        raise KeyError(f"{rel(job)}: model folder not in conf/model and no lab.model in .hydra/config.yaml")
    return model


def replay(job: Path, facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    verl = _yaml(job / "verl_config.yaml")
    plan_json = json.loads((job / "plan.json").read_text()) if (job / "plan.json").is_file() else {}
    mem = plan_json.get("memory") or {}
    model_path = str(verl["actor_rollout_ref"]["model"]["path"]).rstrip("/")
    info = facts.get(model_path.rsplit("/", 1)[-1]) or job_model_facts(job)
    arch = memplan.Arch.from_mapping(info, source=f"conf/model ({info['name']})")
    lab = Lab.of({"hardware": {"gpu_memory_gb": mem.get("card_gb") or 139.8,
                               "host_ram_gb": (mem.get("host_ram") or {}).get("capacity_gb")}})
    s = settings_from_verl(verl, lab)
    plan = memplan.memory_plan(arch, s, remedies=False)
    alloc = plan.get("trainer_allocator")
    out: dict[str, Any] = {"job": rel(job), "model": info["name"], "regime": calibration.regime_of(arch, s),
                           "side_by_side": side_by_side(job)}
    tm = training_measured(job)
    if tm:
        if alloc:
            # verl logs the peak at the end of each update, before that step's weight sync: a job that logged one
            # step went through the first sync and one step's passes, not a sync with AdamW's moments
            peaks = {k: v for k, v in alloc["peaks_gb"].items() if tm["steps"] > 1 or k != "weight_sync"}
            what = max(peaks, key=peaks.get)
            planned = peaks[what]
        else:  # a plan from before the trainer's allocator was planned: its card-level training phase
            planned, what = plan["phases"]["training"]["peak_gb_per_gpu"], "training phase (card-level)"
        out["training"] = {**tm, "planned_gb": planned, "planned_what": what.replace("_", " "),
                           "ratio": round(planned / tm["reserved_gb"], 3),
                           "ratio_allocated": round(planned / tm["allocated_gb"], 3)}
    kv = kv_measured(job)
    if kv:
        planned = plan["kv_cache"]["kv_cache_gb"]
        out["kv_cache"] = {"measured_gb": kv, "planned_gb": planned,
                           "ratio": round(planned / min(kv), 3) if min(kv) > 0 else None}
    ctx = trainer_context(job)
    if ctx is not None and not out["side_by_side"]:
        out["trainer_context_gb"] = ctx
    return out


def bench_rows() -> list[dict[str, Any]]:
    """memplan_bench's recorded rows (FSDP2, one GPU, no vLLM), predicted again by the current plan."""
    if not BENCH_JSON.is_file():
        return []
    spec = importlib.util.spec_from_file_location("memplan_bench", ROOT / "benchmarks" / "gpu" / "memplan_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rec = json.loads(BENCH_JSON.read_text())
    seq = int(rec.get("seq_len", 1536))
    args = SimpleNamespace(attn=rec.get("attn", "sdpa"), tokens=rec["tokens"], log_prob_tokens=rec["log_prob_tokens"],
                           prompt=seq // 3, response=seq - seq // 3, entropy=rec.get("entropy", "compiled"))
    out = []
    for row in rec["rows"]:
        arch = bench.load_arch(row["model"])
        pred = bench.predicted(arch, row, args, rec["card_gb"])
        for what, got in row["measured"].items():
            out.append({"model": row["model"], "gc": row["gc"], "offload": row["offload"], "what": what,
                        "measured_gb": round(got / 1e9, 3), "planned_gb": round(pred[what] / 1e9, 3),
                        "ratio": round(pred[what] / got, 3)})
    return out


def summarise(jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    regimes: dict[str, dict[str, Any]] = {}
    for j in jobs:
        for quantity in ("training", "kv_cache"):
            m = j.get(quantity)
            if not m or m.get("ratio") is None or (quantity == "kv_cache" and j["side_by_side"]):
                continue
            row = regimes.setdefault(j["regime"], {}).setdefault(quantity, {"runs": 0, "jobs": []})
            row["runs"] += 1
            row["jobs"].append(j["job"])
            row["ratio_min"] = min(row.get("ratio_min", 9e9), m["ratio"])
            row["ratio_max"] = max(row.get("ratio_max", 0.0), m["ratio"])
            if "ratio_allocated" in m:  # what must fit (torch empties its cache and retries before an OOM)
                row["allocated_ratio_min"] = min(row.get("allocated_ratio_min", 9e9), m["ratio_allocated"])
                row["allocated_ratio_max"] = max(row.get("allocated_ratio_max", 0.0), m["ratio_allocated"])
    return regimes


def collect(results: Path = RESULTS) -> dict[str, Any]:
    facts = model_facts()
    jobs, skipped = [], []
    for d in sorted(p for p in results.rglob("*") if p.is_dir()):
        measured = any((d / f).is_file() for f in ("metrics.jsonl", "train.log", "report.txt"))
        if (d / "verl_config.yaml").is_file():
            j = replay(d, facts)
            if "training" in j or "kv_cache" in j:
                jobs.append(j)
            else:
                skipped.append({"job": rel(d), "why": "nothing measured (no training step, no vLLM KV line)"})
        elif measured:
            tm = training_measured(d)
            skipped.append({"job": rel(d), "why": "no verl_config.yaml recorded: not replayed",
                            **({"training_measured_gb": tm["reserved_gb"]} if tm else {})})
    contexts = [j["trainer_context_gb"] for j in jobs if "trainer_context_gb" in j]
    return {"command": calibration.COMMAND, "stated": calibration.STATED,
            "unmeasured_margin": calibration.UNMEASURED_MARGIN,
            "units": "GB = 1e9 bytes (verl's and vLLM's GiB converted)",
            "regimes": summarise(jobs), "jobs": jobs, "not_replayed": skipped,
            "trainer_context_gb": {"runs": len(contexts), "min": min(contexts), "max": max(contexts),
                                   "planned": memplan.TRAINER_CUDA_CONTEXT_GB} if contexts else None,
            "bench": bench_rows()}


def outside(result: dict[str, Any]) -> list[str]:
    """Jobs outside the stated accuracy (side-by-side KV caches excepted, see the module docstring)."""
    bad = []
    for j in result["jobs"]:
        for quantity, tol in calibration.STATED.items():
            m = j.get(quantity)
            if not m or (quantity == "kv_cache" and j["side_by_side"]):
                continue
            # training: held to the allocated peak, what an out-of-memory error depends on (the caching allocator
            # frees its cache and retries before it raises); the reserved peak is shown beside it
            ratio = m.get("ratio_allocated") if quantity == "training" else m.get("ratio")
            if ratio is None or abs(ratio - 1.0) > tol:
                measured = m.get("allocated_gb") if quantity == "training" else m.get("measured_gb")
                bad.append(f"{j['job']}: {quantity} plan {m['planned_gb']} GB vs measured {measured} GB "
                           f"{'allocated ' if quantity == 'training' else ''}(ratio {ratio}, stated "
                           f"{1 - tol:.2f}-{1 + tol:.2f})")
    return bad


def render(result: dict[str, Any]) -> str:
    st = result["stated"]
    out = ["# Memory plan vs the recorded GPU runs", "",
           f"Written by `{result['command']}` (`make calibrate`); do not edit by hand. Plan / measured, "
           f"{result['units']}. Stated accuracy: training within {st['training']:.0%} of verl's allocated peak "
           "(what an out-of-memory error depends on: torch's caching allocator frees its cache and retries before it "
           "raises; the reserved peak is shown beside it), "
           f"vLLM's KV cache within {st['kv_cache']:.0%}. A regime with no recorded run is \"not measured\": its "
           f"verdicts refuse only above the card by more than {result['unmeasured_margin']:.0%} "
           "(grpo_lab/memory/calibration.py). A measured regime's margin is the plan's largest overshoot of the "
           "allocated peak (torch empties its cache and retries before it raises an out-of-memory error); what "
           "torch reserves above it (its cache, fragmentation) is not knowable before the run and shows as "
           "plan / measured < 1.",
           "", "## Per regime", "",
           "| regime | quantity | runs | plan / measured | plan / allocated peak | margin for refusals |",
           "|---|---|---|---|---|---|"]
    for regime, rows in result["regimes"].items():
        for quantity, row in rows.items():
            alloc = (f"{row['allocated_ratio_min']:.2f}-{row['allocated_ratio_max']:.2f}"
                     if "allocated_ratio_max" in row else "-")
            margin = f"{calibration.margin_of(row):.0%}" if quantity == "training" else "-"
            out.append(f"| {regime} | {quantity} | {row['runs']} | {row['ratio_min']:.2f}-{row['ratio_max']:.2f} | "
                       f"{alloc} | {margin} |")
    out += ["", "Every regime not in this table (e.g. several GPUs, SGLang, a mixture of experts, 10B parameters and "
            "more): not measured.", "", "## Per job", "",
            "| job | regime | training: plan (its peak) / reserved (allocated) GB | ratio | "
            "KV cache: plan / measured GB | ratio |",
            "|---|---|---|---|---|---|"]
    for j in result["jobs"]:
        t, k = j.get("training"), j.get("kv_cache")
        tr = f"{t['planned_gb']} ({t['planned_what']}) / {t['reserved_gb']} ({t['allocated_gb']})" if t else "-"
        kv = f"{k['planned_gb']} / {', '.join(str(x) for x in k['measured_gb'])}" if k else "-"
        kr = (f"{k['ratio']}" + (" (side by side: not held to it)" if j["side_by_side"] else "")) if k else "-"
        out.append(f"| {j['job']} | {j['regime']} | {tr} | {t['ratio'] if t else '-'} | {kv} | {kr} |")
    ctx = result.get("trainer_context_gb")
    if ctx:
        out += ["", f"Trainer CUDA context + NCCL buffers (outside torch's allocator, so outside verl's peak): "
                f"{ctx['min']}-{ctx['max']} GB on {ctx['runs']} job(s) alone on the card; the plan's "
                f"TRAINER_CUDA_CONTEXT_GB is {ctx['planned']} GB."]
    if result["not_replayed"]:
        out += ["", "## Not replayed", ""]
        out += [f"- {s['job']}: {s['why']}" + (f" (measured {s['training_measured_gb']} GB reserved)"
                                             if "training_measured_gb" in s else "") for s in result["not_replayed"]]
    if result["bench"]:
        ratios = [b["ratio"] for b in result["bench"]]
        out += ["", "## memplan_bench (training sub-phases only: FSDP2, one GPU, no vLLM, torch's allocated peak)", "",
                f"{len(ratios)} rows from `{rel(BENCH_JSON)}`, plan / measured {min(ratios):.2f}-{max(ratios):.2f}."]
    return "\n".join(out) + "\n"


def run_cli(argv: list[str] | None, doc: str, table: Path, md: Path, collect: Any, render: Any, outside: Any, *,
            fail_on_write: bool = True) -> int:
    """The calibration scripts' command line: print the table; --write (the repository's files) or --json PATH; exit 1
    when a job is outside the stated accuracy (with --write too unless fail_on_write is off)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {rel(table)} and {rel(md)}")
    ap.add_argument("--json", help="write the result here (instead of the repository's table)")
    ap.add_argument("--results", default=str(RESULTS), help="the folder of recorded jobs (default: %(default)s)")
    args = ap.parse_args(argv)
    result = collect(Path(args.results).resolve())
    text = render(result)
    print(text)
    if args.write or args.json:
        (Path(args.json) if args.json else table).write_text(json.dumps(result, indent=1) + "\n")
        if args.write:
            md.write_text(text)
    bad = outside(result)
    for b in bad:
        print(f"OUTSIDE THE STATED ACCURACY: {b}", file=sys.stderr)
    return 1 if bad and (fail_on_write or not args.write) else 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, __doc__, calibration.TABLE, ROOT / calibration.TABLE_MD, collect, render, outside)


if __name__ == "__main__":
    sys.exit(main())
