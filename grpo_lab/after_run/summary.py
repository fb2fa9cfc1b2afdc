"""The summary of a Hydra multirun sweep: one row per job, as Markdown, CSV and a plot against the swept value.
Each row, the swept key and the Hydra callback: docs/after_run.md."""

from __future__ import annotations

import argparse
import logging
import math
import numbers
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_lab import facts
from grpo_lab.after_run import metrics as M

if TYPE_CHECKING:  # pandas and the doctor are imported where used: Hydra instantiates the callback before every run
    import pandas as pd

    from grpo_lab.after_run import doctor

from hydra.experimental.callback import Callback

log = logging.getLogger(__name__)

TRAINED = ["steps", "step_time_s", "gen_time_s", "throughput_tok_s_gpu", "peak_train_mem_gib", "last_score",
           "val_first", "val_last", "val_step"]
PLANNED_COLUMNS = ["gen_peak_gb", "train_peak_gb", "sync_peak_gb", "card_gb", "kv_tokens", "planned_step_s",
                   "planned_run", "verdict"]  # read from each job's plan.json

OK, UNFINISHED, OTHER, KILLED, PLANNED = "ok", "unfinished", "other failure", "killed", "planned"


def job_dirs(sweep_dir: str | Path) -> list[Path]:
    """The job dirs of a sweep: subdirs that look like a Hydra job (job<N>, or any with .hydra/ or a train.log)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        return []
    out = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and (
        re.fullmatch(r"job\d+", d.name) or d.name.isdigit() or (d / ".hydra").is_dir()
        or (d / "train.log").exists() or (d / "status.json").exists())]
    return sorted(out, key=lambda p: (int(m.group(1)) if (m := re.search(r"(\d+)$", p.name)) else 1 << 30, p.name))


def read_overrides(job_dir: Path) -> list[str]:
    try:
        import yaml

        data = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
        return [str(x) for x in data] if isinstance(data, list) else []
    except Exception:
        return []


def _by_key(overrides: list[str]) -> dict[str, str]:
    """Each override's key (its +/~ dropped) -> its value."""
    return {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in overrides if "=" in o}


def swept_keys(overrides: list[list[str]]) -> list[str]:
    """Override keys whose value differs across the jobs (in first-seen order)."""
    jobs = [_by_key(ovs) for ovs in overrides]
    order = dict.fromkeys(k for job in jobs for k in job)
    return [k for k in order if len({job.get(k, "<unset>") for job in jobs}) > 1]


def job_status(job_dir: Path) -> tuple[str, str, list[doctor.Diagnosis]]:
    """(status word, diagnosis text, diagnoses) of one job."""
    from grpo_lab.after_run import doctor

    status = doctor.read_json(job_dir / "status.json")
    st = status.get("status")
    if st == "ok":
        return (PLANNED if status.get("note") == "planned" else OK), "", []
    gone = doctor.gone_running(status)
    if st == "running" and not gone:
        return UNFINISHED, "", []
    refused = doctor.refusal(job_dir)
    if refused is not None:  # the preflight refused it: its rules, not a traceback
        return doctor.failure_class([refused]), refused.title, [refused]
    diags = doctor.diagnose_path(job_dir)[1] if (job_dir / "train.log").exists() else []
    if st == "failed":
        return doctor.failure_class(diags), "; ".join(d.title for d in diags) or str(status.get("error") or ""), diags
    # no status.json, or "running" with its process gone: a job killed hard, or one that never started
    errors = [d for d in diags if d.id not in ("stopped_without_error",)]
    if errors:
        return doctor.failure_class(errors), "; ".join(d.title for d in errors), errors
    if gone:
        return KILLED, f"killed: {gone}", diags
    return UNFINISHED, "; ".join(d.title for d in diags), diags


def summarize_job(job_dir: Path, status: tuple[str, str, list[doctor.Diagnosis]]) -> dict[str, Any]:
    """One job's row of the summary, with its job_status."""
    df = M.read_metrics(job_dir)
    steps = M.training_steps(df)
    word, diag_text, _ = status
    mem = M.train_series(df, "actor/perf/max_memory_allocated_gb")
    val_col = M.primary_val_column(df)  # what a learning-rate sweep is chosen by
    val = {int(k): float(v) for k, v in M.series(df, val_col).items()} if val_col else {}  # by step, in order
    return {
        "job": job_dir.name,
        "status": word,
        "steps": int(steps.max()) if len(steps) else 0,
        "step_time_s": M.steady_mean(M.train_series(df, "timing_s/step")),
        "gen_time_s": M.steady_mean(M.train_series(df, "timing_s/gen")),
        "throughput_tok_s_gpu": M.steady_mean(M.train_series(df, "perf/throughput")),
        "peak_train_mem_gib": float(mem.max()) if not mem.empty else None,
        "last_score": M.last(M.train_series(df, "critic/score/mean")),
        "val_first": val[min(val)] if val else None,
        "val_last": val[max(val)] if val else None,
        "val_step": max(val) if val else None,
        "_val": val,
        "diagnosis": diag_text,
        "overrides": " ".join(read_overrides(job_dir)),
        **plan_cells(job_dir),
        **({"verdict": "refused"} if word.startswith("refused") else {}),  # the memory may fit; the job did not run
    }


def plan_cells(job_dir: Path) -> dict[str, Any]:
    """The what-if cells of a job from its plan.json: planned peaks, card, KV cache, time, verdict (None: not there)."""
    from grpo_lab.after_run import doctor
    from grpo_lab.memory.timeplan import duration

    plan = doctor.read_json(job_dir / "plan.json")
    mem, t = plan.get("memory") or {}, plan.get("time") or {}
    phases = mem.get("phases") or {}
    peaks = {f"{short}_peak_gb": M.finite_float((phases.get(name) or {}).get("peak_gb_per_gpu"))
             for short, name in (("gen", "generation"), ("train", "training"), ("sync", "weight_sync"))}
    run_s = M.finite_float(t.get("run_s")) if t.get("steps", 1) else None  # steps unknown: start-up and 1 step only
    return {**peaks, "card_gb": M.finite_float(mem.get("card_gb")),
            "kv_tokens": (mem.get("kv_cache") or {}).get("tokens"), "planned_step_s": M.finite_float(t.get("step_s")),
            "planned_run": run_s and duration(run_s), "verdict": (mem.get("verdict") or {}).get("overall")}


def summary_table(sweep_dir: Path, diagnoses: dict[str, list[doctor.Diagnosis]]) -> tuple[pd.DataFrame, list[str]]:
    """One row per job (swept keys as their own columns, after `job`), and the swept keys; `diagnoses` is filled
    with each job's doctor findings, by job name."""
    dirs = job_dirs(sweep_dir)
    statuses = [job_status(d) for d in dirs]
    diagnoses.update({d.name: st[2] for d, st in zip(dirs, statuses)})
    rows = [summarize_job(d, st) for d, st in zip(dirs, statuses)]
    overrides = [read_overrides(d) for d in dirs]
    keys = swept_keys(overrides)
    for row, ovs in zip(rows, overrides):
        row.update({k: _by_key(ovs).get(k) for k in keys})
    import pandas as pd

    # nothing trained (planned or refused): no training columns
    plan_only = all(r["status"] == PLANNED or r["status"].startswith("refused") for r in rows)
    what_if = plan_only or any(r["status"] == PLANNED for r in rows)
    cols = ["status", *([] if plan_only else TRAINED), *(PLANNED_COLUMNS if what_if else []), "diagnosis", "overrides"]
    table = pd.DataFrame(rows, columns=["job", *keys, *cols])
    table.attrs["val_ranking"] = val_ranking(rows, keys)
    return table, keys


def val_ranking(rows: list[dict[str, Any]], keys: list[str]) -> str | None:
    """The jobs ranked by validation at the last step that every validated job reached (not by their last values:
    jobs that stop at different steps would be ranked by time)."""
    validated = [r for r in rows if r.get("_val")]
    if len(validated) < 2:
        return None
    common = set.intersection(*(set(r["_val"]) for r in validated))
    if not common:
        return None
    step = max(common)
    if all(step == min(r["_val"]) for r in validated):  # only the validation before training is shared
        return None

    def name(r: dict[str, Any]) -> str:
        swept = ", ".join(f"{k}={r.get(k)}" for k in keys)
        return f"{r['job']} ({swept})" if swept else str(r["job"])

    ranked = sorted(validated, key=lambda r: -r["_val"][step])
    first = ranked[0]
    gain = first["_val"][step] - first["_val"][min(first["_val"])]
    return (f"Validation at step {step}, the last step every validated job reached: "
            + ", ".join(f"{name(r)} {r['_val'][step]:.3g}" for r in ranked)
            + f". Best: {name(first)}, {gain * 100:+.1f} points since step {min(first['_val'])}.")



def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, (float, numbers.Integral)) and not isinstance(v, bool):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v).replace("|", "\\|")


def to_markdown(table: pd.DataFrame, keys: list[str], sweep_dir: Path,
                diagnoses: dict[str, list[doctor.Diagnosis]]) -> str:
    cols = list(table.columns)
    out = [f"# Sweep summary: {sweep_dir.name}", "",
           f"Swept: {', '.join(f'`{k}`' for k in keys) if keys else '(no override differs across the jobs)'}; "
           f"{len(table)} job(s): " + ", ".join(f"{n} {s}" for s, n in table["status"].value_counts().items()) + ".",
           "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|",
           *("| " + " | ".join(_cell(row[c]) for c in cols) + " |" for _, row in table.iterrows()), ""]
    if "steps" in cols:
        out += ["step_time_s, gen_time_s, throughput_tok_s_gpu: means of timing_s/step, timing_s/gen and "
                "perf/throughput (tokens/s per GPU) without step 1 (warm-up) when a job has 2 steps or more; "
                "peak_train_mem_gib: max of actor/perf/max_memory_allocated_gb (GiB, as verl logs it); last_score: "
                "critic/score/mean of the last step; val_first, val_last, val_step: the job's main validation metric "
                "(val-core/.../mean@N) at its first and last validation, and the step of the last.", ""]
    if "verdict" in cols:
        out += ["From each job's plan.json: gen_peak_gb, train_peak_gb, sync_peak_gb: the memory plan's peak per "
                "GPU (GB) in generation, training and weight sync, on a card of card_gb; kv_tokens: the KV cache in "
                "tokens; planned_step_s, planned_run: the time plan's steady step and whole run (- where the plan "
                "has none); verdict: the memory plan's overall verdict (refused: the preflight refused the job).", ""]
    if table.attrs.get("val_ranking"):
        out += [table.attrs["val_ranking"], ""]
    failed = table[~table["status"].isin([OK, UNFINISHED, PLANNED])]
    if len(failed):
        out.append("## Failed jobs")
        for _, row in failed.iterrows():
            out.append(f"- {row['job']} ({row['status']}): {row['diagnosis'] or 'no known signature'}")
            out += [f"  - try: `{' '.join(dg.overrides)}`" for dg in diagnoses[str(row["job"])] if dg.overrides]
        out.append("")
    return "\n".join(out)


def plot_summary(table: pd.DataFrame, keys: list[str], path: Path) -> Path | None:
    if table.empty:
        return None
    from matplotlib.figure import Figure

    labels = [", ".join(str(r[k]) for k in keys) for _, r in table.iterrows()] if keys else list(table["job"])
    xlabel = ", ".join(keys) if keys else "job"
    numeric = len(keys) == 1 and all(M.finite_float(v) is not None for v in table[keys[0]])
    xs = [M.finite_float(v) for v in table[keys[0]]] if numeric else list(range(len(labels)))
    plan = "steps" not in table.columns  # a what-if sweep: the plan's peaks, KV cache and time
    panels = [("throughput (tokens/s per GPU)", ["throughput_tok_s_gpu"]), ("time per step (s)", ["step_time_s"])]
    if plan:
        panels = [("planned peak per GPU (GB)", ["gen_peak_gb", "train_peak_gb", "sync_peak_gb", "card_gb"]),
                  ("KV cache (tokens)", ["kv_tokens"])]
        if table["planned_step_s"].notna().any():
            panels.append(("predicted time per step (s)", ["planned_step_s"]))
    fig = Figure(figsize=(5.5 * len(panels), 4.5), dpi=80)
    for ax, (title, cols) in zip(fig.subplots(1, len(panels)), panels):
        for col in cols:
            points = []
            for x, (_, row) in zip(xs, table.iterrows()):
                y = M.finite_float(row[col])
                good = row["status"] in (OK, PLANNED) or (y is not None and (row["status"] == UNFINISHED or plan))
                if good and y is not None:
                    points.append((x, y))
                if col == cols[0] and (not good or row["status"] not in (OK, PLANNED, UNFINISHED)):
                    at = (x, y if good and y is not None else 0)
                    ax.scatter(*at, marker="x", color="red", s=80, zorder=3, clip_on=False)
                    ax.annotate(str(row["status"]), at, textcoords="offset points", xytext=(0, 8), ha="center",
                                fontsize=8, color="red")
            if points:
                style = {"linestyle": "--", "color": "gray"} if col == "card_gb" else {"marker": "o"}
                ax.plot(*zip(*sorted(points, key=lambda p: p[0])), label=col, **style)
        if len(cols) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if not numeric:
            ax.set_xticks(xs)
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"sweep {path.parent.name}")
    fig.tight_layout()
    fig.savefig(path)
    return path


def summarize_sweep(sweep_dir: str | Path, *, plots: bool = True, write: bool = True) -> pd.DataFrame:
    """Write summary.md, summary.csv and summary.png into the sweep dir (write=False: none); return the table."""
    sweep_dir = Path(sweep_dir)
    diagnoses: dict[str, list[doctor.Diagnosis]] = {}
    table, keys = summary_table(sweep_dir, diagnoses)
    table.attrs["markdown"] = to_markdown(table, keys, sweep_dir, diagnoses)
    if not write:
        return table
    facts.atomic_write(sweep_dir / "summary.csv", table.to_csv(index=False))
    facts.atomic_write(sweep_dir / "summary.md", table.attrs["markdown"])
    if plots:
        try:
            plot_summary(table, keys, sweep_dir / "summary.png")
        except Exception as e:  # the table matters more than the picture
            log.warning("grpo-lab: no summary.png: %s: %s", type(e).__name__, e)
    return table


def format_summary(sweep_dir: str | Path, table: pd.DataFrame, written: bool = True) -> str:
    sweep_dir = Path(sweep_dir)
    text = table.attrs.get("markdown") or table.to_string()
    if not written:
        return f"{text}\nnot written: {sweep_dir} is a recorded sweep outside outputs/ (--write writes it)"
    files = ", ".join(str(sweep_dir / f) for f in ("summary.md", "summary.csv", "summary.png")
                      if (sweep_dir / f).exists())
    return f"{text}\nwritten: {files}"


# ---------------------------------------------------------------------------------------------------------------------
# Hydra callback


class SweepSummaryCallback(Callback):
    """Hydra callback: a failed job's diagnosis.json, each job's report.json, and the sweep summary (registered in
    conf/config.yaml as hydra.callbacks.sweep_summary)."""

    def __init__(self, job_reports: bool = True, plots: bool = True) -> None:
        self.job_reports = job_reports
        self.plots = plots
        self._sweep_dirs: dict[Path, None] = {}  # in the order the jobs name them

    def on_job_end(self, config: Any, job_return: Any = None, **kwargs: Any) -> None:
        try:
            self._job_end(config, job_return)
        except BaseException as e:  # a summary must never break the sweep
            log.warning("grpo-lab: sweep summary callback: %s: %s", type(e).__name__, e)

    def _job_end(self, config: Any, job_return: Any) -> None:
        from grpo_lab.after_run import doctor

        hydra_cfg = config.hydra
        job_dir = Path(str(hydra_cfg.runtime.output_dir))
        status = doctor.read_json(job_dir / "status.json")
        failed = str(getattr(job_return, "status", "")).endswith("FAILED") or status.get("status") == "failed"
        if failed and (job_dir / "train.log").exists():
            diags = doctor.write_diagnosis(job_dir)
            for d in diags:  # "try:" only with something to try
                log.warning("grpo-lab doctor (%s): %s%s", job_dir.name, d.title,
                            f"; try: {' '.join(d.overrides)}" if d.overrides else "")
        if self.job_reports and (job_dir / "metrics.jsonl").exists():
            from grpo_lab.after_run.job_report import make_report

            make_report(job_dir, plots=self.plots)
        if str(hydra_cfg.mode) in ("RunMode.MULTIRUN", "MULTIRUN"):
            sweep = next((d for d in (job_dir.parent, job_dir.parent.parent) if (d / "multirun.yaml").exists()),
                         Path(str(hydra_cfg.sweep.dir)))
            self._sweep_dirs[sweep] = None
            # a plan takes seconds and the sweep's end makes the summary: after each plan it was made again at once
            # (by every worker of jobs side by side, each importing pandas and matplotlib for it). A crash still
            # gets it here, as the sweep's end does not come (a refusal, exit 2, lets the sweep go on)
            if not _planned_only(config, crashed=failed and status.get("exit") != 2):
                summarize_sweep(sweep, plots=self.plots)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            for sweep in self._sweep_dirs or [Path(str(config.hydra.sweep.dir))]:
                if sweep.is_dir():
                    summarize_sweep(sweep, plots=self.plots)
                    log.info("grpo-lab: sweep summary in %s", sweep / "summary.md")
        except BaseException as e:
            log.warning("grpo-lab: sweep summary callback: %s: %s", type(e).__name__, e)


def _planned_only(config: Any, *, crashed: bool) -> bool:
    """A job that only planned (preflight.only, fit), and planned or was refused rather than crashed."""
    from omegaconf import OmegaConf

    preflight = OmegaConf.select(config, "preflight", default=None) or {}
    return not crashed and any(bool(preflight.get(k)) for k in ("only", "fit", "fit_write"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_lab.after_run.summary",
                                 description="Summarise a Hydra sweep dir.")
    ap.add_argument("sweep_dir")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        print(f"grpo-lab summary: {args.sweep_dir} is not a directory", file=sys.stderr)
        return 2
    table = summarize_sweep(args.sweep_dir, plots=not args.no_plots)
    print(format_summary(args.sweep_dir, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
