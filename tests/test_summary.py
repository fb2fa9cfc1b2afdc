"""The sweep summary and its Hydra callback, on fake sweep dirs laid out as grpo-lab's multirun writes them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import planned, run_module, run_py
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from grpo_lab.after_run import report as R
from grpo_lab.after_run import summary as S

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("grpo_lab_fixtures_synth", FIXTURES / "synth.py")
synth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth)

BASE = ["experiment=qwen3_1_7b_gsm8k", "trainer.total_training_steps=20"]


def make_sweep(root: Path, utils=(0.3, 0.4, 0.5), failed_log: Path | None = None,
               error: str | None = "RayTaskError(OutOfMemoryError)") -> Path:
    """Three jobs over rollout_gpu_mem_util; the last one failed with the given log (and status.json error) and wrote
    no metrics."""
    sweep = root / "2026-12-03_10-00-00_qwen3_1_7b_grpo"
    sweep.mkdir(parents=True)
    task = [*BASE, "rollout_gpu_mem_util=" + ",".join(map(str, utils))]
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"mode": "MULTIRUN", "overrides": {"task": task}}}))
    failed_log = failed_log or synth.SYNTHETIC / "oom_training_update_actor.log"
    for i, u in enumerate(utils):
        ov = [*BASE, f"rollout_gpu_mem_util={u}"]
        if i < len(utils) - 1:
            n = 20
            curves = synth.healthy_curves(n, seed=i)
            curves["perf/throughput"] = synth.noisy(lambda s, u=u: 4000 * u, 30, seed=i)
            curves["timing_s/step"] = synth.noisy(lambda s, u=u: 40 / u, 1, seed=i)
            synth.write_job(sweep / f"job{i}", lines=synth.metrics_lines(n, curves), overrides=ov,
                            verl=synth.verl_config(util=u), log="step:1 - x:1\n")
        else:
            synth.write_job(sweep / f"job{i}", log=failed_log, status="failed", overrides=ov,
                            error=error, verl=synth.verl_config(util=u))
    return sweep


def test_sweep_with_a_failed_job_gets_a_full_summary(tmp_path):
    sweep = make_sweep(tmp_path)
    table = S.summarize_sweep(sweep)
    for name in ("summary.md", "summary.csv", "summary.png"):
        assert (sweep / name).exists(), name
    assert (sweep / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert list(table["job"]) == ["job0", "job1", "job2"]
    assert list(table.columns[:2]) == ["job", "rollout_gpu_mem_util"]
    assert list(table["rollout_gpu_mem_util"]) == ["0.3", "0.4", "0.5"]
    assert list(table["status"]) == ["ok", "ok", "OOM in training"]
    assert list(table["steps"]) == [20, 20, 0]
    ok = table.iloc[1]
    assert ok["throughput_tok_s_gpu"] == pytest.approx(1600, rel=0.05)
    assert ok["step_time_s"] == pytest.approx(100, rel=0.05)
    assert ok["gen_time_s"] == pytest.approx(60, rel=0.1)
    assert ok["peak_train_mem_gib"] == 18.5 and 0 < ok["last_score"] <= 1
    assert "rollout_gpu_mem_util=0.4" in ok["overrides"]
    bad = table.iloc[2]
    assert pd.isna(bad["throughput_tok_s_gpu"]) and pd.isna(bad["last_score"])
    assert "training phase" in bad["diagnosis"]
    md = (sweep / "summary.md").read_text()
    assert "Swept: `rollout_gpu_mem_util`" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| job")]
    assert len(rows) == 4 and rows[0].startswith("| job | rollout_gpu_mem_util | status")  # header + 3 jobs
    assert rows[3].startswith("| job2 | 0.5 | OOM in training | 0 | - |")
    # the failed job's config is partial and names no card: no memory plan, so no override to try is made up
    assert "- job2 (OOM in training): CUDA out of memory in the training phase" in md
    assert "optimizer_offload" not in md
    csv = pd.read_csv(sweep / "summary.csv")
    assert len(csv) == 3 and csv.loc[2, "status"] == "OOM in training"


def test_generation_oom_unfinished_and_empty_jobs(tmp_path):
    sweep = make_sweep(tmp_path, failed_log=synth.SYNTHETIC / "oom_generation_vllm_sampler.log")
    # a job still running, and one that never wrote anything but its Hydra dir
    synth.write_job(sweep / "job3", lines=synth.metrics_lines(4, synth.healthy_curves(4)), status="running",
                    overrides=[*BASE, "rollout_gpu_mem_util=0.6"])
    synth.write_job(sweep / "job4", status=None, overrides=[*BASE, "rollout_gpu_mem_util=0.7"])
    table = S.summarize_sweep(sweep, plots=False)
    assert list(table["status"]) == ["ok", "ok", "OOM in generation", "unfinished", "unfinished"]
    assert list(table["steps"]) == [20, 20, 0, 4, 0]


def test_hang_without_status_is_other_failure(tmp_path):
    # killed by hand after the hang: status.json's error is the interrupt, not an OOM (the doctor reads it too)
    sweep = make_sweep(tmp_path, failed_log=synth.RECORDED_HANG_LOG, error="KeyboardInterrupt: ")
    table = S.summarize_sweep(sweep, plots=False)
    assert table.iloc[2]["status"] == "other failure"
    assert "too few CPUs" in table.iloc[2]["diagnosis"]


def test_swept_keys():
    assert S.swept_keys([["a=1", "b=2"], ["a=1", "b=3"]]) == ["b"]
    assert S.swept_keys([["a=1"], ["a=1", "+c=x"]]) == ["c"]
    assert S.swept_keys([["a=1"], ["a=1"]]) == []


def test_report_cli_delegates_sweep_dirs(tmp_path, capsys):
    sweep = make_sweep(tmp_path)
    assert R.is_sweep_dir(sweep) and not R.is_sweep_dir(sweep / "job0")
    assert R.main([str(sweep), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "Sweep summary" in out and "OOM in training" in out
    assert (sweep / "summary.csv").exists() and not (sweep / "summary.png").exists()


def _hydra_cfg(job_dir: Path, sweep_dir: Path, mode: str = "MULTIRUN"):
    from hydra.types import RunMode

    cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(job_dir)}, "sweep": {"dir": str(sweep_dir)}},
                            "model_path": "x"})
    cfg.hydra.mode = RunMode[mode]
    return cfg


def test_callback_remakes_summary_and_diagnoses(tmp_path):
    sweep = make_sweep(tmp_path)
    cb = S.SweepSummaryCallback(plots=False)
    job2 = sweep / "job2"
    ret = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("boom"))
    cb.on_job_end(_hydra_cfg(job2, sweep), ret)
    assert (job2 / "diagnosis.json").exists()
    assert json.loads((job2 / "diagnosis.json").read_text())["diagnoses"][0]["id"] == "oom_training"
    assert "OOM in training" in (sweep / "summary.md").read_text()
    cb.on_job_end(_hydra_cfg(sweep / "job0", sweep), JobReturn(status=JobStatus.COMPLETED, _return_value="trained"))
    assert (sweep / "job0" / "report.json").exists()
    (sweep / "summary.md").unlink()
    cb.on_multirun_end(_hydra_cfg(sweep, sweep))
    assert (sweep / "summary.md").exists()


def test_a_plan_sweeps_summary_is_made_at_its_end_and_after_a_crash(tmp_path):
    """Jobs that only plan (preflight.only, fit) take seconds: the summary is made at the sweep's end, not again after
    each plan or refusal; a job that crashed gets it at once, as its sweep does not reach the end."""
    sweep = make_sweep(tmp_path)
    cb = S.SweepSummaryCallback(plots=False)

    def plan(job: str):
        cfg = _hydra_cfg(sweep / job, sweep)
        cfg.preflight = {"only": True, "fit": False, "fit_write": None}
        return cfg

    cb.on_job_end(plan("job0"), JobReturn(status=JobStatus.COMPLETED, _return_value="planned"))
    status = json.loads((sweep / "job1" / "status.json").read_text())
    (sweep / "job1" / "status.json").write_text(json.dumps({**status, "status": "failed", "exit": 2}))
    cb.on_job_end(plan("job1"), JobReturn(status=JobStatus.COMPLETED, _return_value="refused"))
    assert not (sweep / "summary.md").exists()
    cb.on_job_end(plan("job2"), JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("boom")))
    assert "OOM in training" in (sweep / "summary.md").read_text()
    (sweep / "summary.md").unlink()
    cb.on_multirun_end(_hydra_cfg(sweep, sweep))
    assert (sweep / "summary.md").exists()


def test_callback_never_raises(tmp_path, caplog):
    cb = S.SweepSummaryCallback()
    cb.on_job_end(OmegaConf.create({"nothing": 1}), None)  # no hydra node at all
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "gone")}}}))
    assert "sweep summary callback" in caplog.text
    # a single run (not multirun) writes no sweep summary
    job = synth.write_job(tmp_path / "runs" / "r1", lines=synth.metrics_lines(3, synth.healthy_curves(3)))
    S.SweepSummaryCallback(plots=False).on_job_end(_hydra_cfg(job, tmp_path / "runs", mode="RUN"), None)
    assert (job / "report.json").exists() and not (tmp_path / "runs" / "summary.md").exists()


APP = '''
import importlib.util, sys
from pathlib import Path
import hydra
from hydra.core.hydra_config import HydraConfig
spec = importlib.util.spec_from_file_location("synth", sys.argv.pop(1))
synth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(synth)

@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    job = Path(HydraConfig.get().runtime.output_dir)
    if cfg.rollout_gpu_mem_util > 0.45:
        synth.write_job(job, log=synth.SYNTHETIC / "oom_generation_vllm_sampler.log", status="failed")
        raise RuntimeError("CUDA out of memory")
    synth.write_job(job, lines=synth.metrics_lines(5, synth.healthy_curves(5)), status="ok")

main()
'''


def test_callback_in_a_real_hydra_multirun(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "app.py", str(FIXTURES / "synth.py"), "-m", "+rollout_gpu_mem_util=0.3,0.4,0.5",
         "hydra.sweep.dir=sweep", "hydra.sweep.subdir=job${hydra.job.num}",
         "+hydra.callbacks.summary._target_=grpo_lab.after_run.summary.SweepSummaryCallback",
         "+hydra.callbacks.summary.plots=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)})
    assert "grpo-lab doctor (job2): CUDA out of memory in the generation phase" in proc.stderr + proc.stdout
    table = pd.read_csv(tmp_path / "sweep" / "summary.csv")
    assert list(table["rollout_gpu_mem_util"]) == [0.3, 0.4, 0.5]
    assert list(table["status"]) == ["ok", "ok", "OOM in generation"]
    assert (tmp_path / "sweep" / "job2" / "diagnosis.json").exists()
    assert (tmp_path / "sweep" / "job0" / "report.json").exists()


def test_callback_module_imports_pandas_and_the_doctor_only_when_used():
    # Hydra instantiates the callback before every run, the refusals of a bad config too
    code = ("import sys, grpo_lab.after_run.summary; "
            "print(sorted({'pandas', 'numpy', 'grpo_lab.after_run.doctor'} & set(sys.modules)))")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_validation_first_and_last_of_a_recorded_learning_rate_sweep(tmp_path):
    """Recorded on the GPU test machine (benchmarks/gpu/results/2026-12-03-smollm2): job0 ran 30 steps at lr 1e-5,
    job1 had done its validation before training and one step when the machine went back."""
    import shutil

    sweep = tmp_path / "sweep"
    shutil.copytree(Path(__file__).resolve().parents[1] / "benchmarks/gpu/results/2026-12-03-smollm2/sweep", sweep)
    table = S.summarize_sweep(sweep, plots=False).set_index("job")
    assert table.loc["job0", "val_first"] == pytest.approx(0.09375)
    assert table.loc["job0", "val_last"] == pytest.approx(0.453125)
    assert table.loc["job1", "steps"] == 1 and table.loc["job1", "val_last"] == pytest.approx(0.09375)
    assert "| val_first | val_last |" in (sweep / "summary.md").read_text()


def test_a_sweep_cut_short_is_ranked_at_the_last_step_every_job_validated(tmp_path):
    """Recorded on the GPU test machine (benchmarks/gpu/results/2026-12-03-smollm2-lr-sweep): three learning rates side
    by side; the machine's time ended at step 13 for 3e-6 and 1e-5 (last validation at step 10) and at step 16 for 3e-5
    (last validation at step 15). Last values would compare step 15 with step 10; the ranking uses step 10."""
    import shutil

    sweep = tmp_path / "sweep"
    shutil.copytree(Path(__file__).resolve().parents[1] / "benchmarks/gpu/results/2026-12-03-smollm2-lr-sweep/sweep",
                    sweep)
    table = S.summarize_sweep(sweep, plots=False).set_index("job")
    assert list(table["val_step"]) == [10, 10, 15]
    ranking = ("Validation at step 10, the last step every validated job reached: job2 (actor_lr=3e-05) 0.422, "
               "job0 (actor_lr=3e-06) 0.164, job1 (actor_lr=1e-05) 0.156. Best: job2 (actor_lr=3e-05), +32.8 points "
               "since step 0.")
    assert ranking in (sweep / "summary.md").read_text()
    # what `make report RUN=<sweep>` prints
    proc = run_module("grpo_lab.after_run.report", sweep)
    assert proc.returncode == 0, proc.stderr
    assert ranking in proc.stdout and "| val_last | val_step |" in proc.stdout


def test_no_ranking_without_two_validated_jobs():
    assert S.val_ranking([{"job": "job0", "_val": {0: 0.1, 5: 0.2}}], []) is None
    assert S.val_ranking([{"job": "job0", "_val": {0: 0.1}}, {"job": "job1", "_val": {}}], []) is None
    # no step in common: nothing to compare
    assert S.val_ranking([{"job": "job0", "_val": {5: 0.1}}, {"job": "job1", "_val": {10: 0.3}}], []) is None
    # only the validation before training in common (test_freq swept): nothing learned to compare
    assert S.val_ranking([{"job": "job0", "_val": {0: 0.1, 5: 0.2}}, {"job": "job1", "_val": {0: 0.1, 7: 0.3}}],
                         []) is None


def test_sweep_summary_calls_a_job_whose_process_is_gone_killed(tmp_path):
    sweep = tmp_path / "sweep"
    n = 6
    lines = synth.metrics_lines(n, synth.healthy_curves(n))
    synth.write_job(sweep / "job0", lines=lines, status="running", overrides=["actor_lr=1e-6"],
                    status_extra=synth.live_process())
    gone = synth.gone_process()
    synth.write_job(sweep / "job1", lines=lines, status="running", overrides=["actor_lr=3e-6"], status_extra=gone)
    table = S.summarize_sweep(sweep, plots=False).set_index("job")
    assert list(table["status"]) == ["unfinished", "killed"]
    text = (sweep / "summary.md").read_text()
    assert "## Failed jobs" in text and f"- job1 (killed): killed: its process (pid {gone['pid']}" in text


def _png_pixels(path: Path, rgb: tuple[int, int, int]) -> int:
    """How many pixels of the png at `path` have the colour `rgb` (give or take 8 of 255)."""
    import matplotlib.image

    img = matplotlib.image.imread(path)[..., :3] * 255
    return int((abs(img - rgb) <= 8).all(axis=-1).sum())


C0, C1, C2 = (31, 119, 180), (255, 127, 14), (44, 160, 44)  # matplotlib's first three line colours


def test_a_plan_only_sweep_is_a_what_if_table(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_py("-m", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3,0.4,0.5", "preflight.only=true",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    md = (sweep / "summary.md").read_text()
    assert "3 job(s): 3 planned." in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| job")][1:]
    assert len(rows) == 3 and all(" | planned | " in r for r in rows) and not any("| ok |" in r for r in rows)
    csv = pd.read_csv(sweep / "summary.csv")
    assert list(csv["status"]) == ["planned"] * 3
    assert not {"steps", "throughput_tok_s_gpu", "val_last"} & set(csv.columns)  # nothing trained: not shown
    assert {"planned_step_s", "planned_run"} <= set(csv.columns)
    # more of the card for vLLM: a higher generation peak and a larger KV cache; training and weight sync unchanged
    gen, kv = list(csv["gen_peak_gb"]), list(csv["kv_tokens"])
    assert gen[0] < gen[1] < gen[2] < csv["card_gb"][0] and kv[0] < kv[1] < kv[2], (gen, kv)
    assert csv["train_peak_gb"].nunique() == 1 and csv["sync_peak_gb"].nunique() == 1 and csv["train_peak_gb"][0] > 0
    assert list(csv["verdict"]) == ["fits"] * 3
    png = sweep / "summary.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert min(_png_pixels(png, c) for c in (C0, C1, C2)) > 100  # the three phases' lines are drawn


def _plan(gen: float, kv: int, time: dict | None = None) -> dict:
    phases = {"generation": gen, "training": 40.0, "weight_sync": 30.0}
    mem = {"card_gb": 80.0, "phases": {k: {"peak_gb_per_gpu": v, "verdict": "fits"} for k, v in phases.items()},
           "kv_cache": {"tokens": kv}, "verdict": {"overall": "tight" if gen > 60 else "fits"}}
    return {"memory": mem, "errors": [], **({"time": time} if time is not None else {})}


def test_a_time_plan_shows_in_the_what_if_row(tmp_path):
    sweep = tmp_path / "sweep"
    times = [{"step_s": 42.0, "run_s": 18720.0, "steps": 400, "first_step_s": 60.0, "startup_s": 90.0},
             {"step_s": 30.5, "run_s": 1080.0, "steps": 30}, None]
    for i, t in enumerate(times):
        synth.write_job(sweep / f"job{i}", status="ok", status_extra={"note": "planned", "exit": 3},
                        overrides=[f"rollout_gpu_mem_util={0.5 + i / 10}", "preflight.only=true"],
                        plan=_plan(50.0 + 10 * i, 100000 * (i + 1), t))
    S.summarize_sweep(sweep)
    md = (sweep / "summary.md").read_text()
    assert "| job0 | 0.5 | planned | 50 | 40 | 30 | 80 | 100,000 | 42 | 5.2 h | fits |" in md
    assert "| job1 | 0.6 | planned | 60 | 40 | 30 | 80 | 200,000 | 30.5 | 18 min | fits |" in md
    assert "| job2 | 0.7 | planned | 70 | 40 | 30 | 80 | 300,000 | - | - | tight |" in md  # no time section
    csv = pd.read_csv(sweep / "summary.csv")
    assert list(csv["planned_run"].fillna("-")) == ["5.2 h", "18 min", "-"]
    assert csv["planned_step_s"][0] == 42.0 and pd.isna(csv["planned_step_s"][2])
    # the predicted step time gets a third panel: 3 x 5.5 inches at 80 dpi
    import matplotlib.image

    assert matplotlib.image.imread(sweep / "summary.png").shape[1] == 1320
    # steps unknown (no train file): the run's length is not known either
    assert S.plan_cells(synth.write_job(tmp_path / "j", plan=_plan(1, 1, {"step_s": 9, "run_s": 99, "steps": 0}))
                        )["planned_run"] is None


def test_a_mixed_sweep_keeps_its_trained_rows(tmp_path):
    sweep = make_sweep(tmp_path)
    synth.write_job(sweep / "job3", status="ok", status_extra={"note": "planned", "exit": 3},
                    overrides=[*BASE, "rollout_gpu_mem_util=0.6", "preflight.only=true"], plan=_plan(55.0, 123456))
    table = S.summarize_sweep(sweep)
    assert list(table["status"]) == ["ok", "ok", "OOM in training", "planned"]
    assert list(table["steps"]) == [20, 20, 0, 0]
    assert table.iloc[1]["throughput_tok_s_gpu"] == pytest.approx(1600, rel=0.05)
    assert table.iloc[3]["gen_peak_gb"] == 55.0 and table.iloc[3]["kv_tokens"] == 123456
    md = (sweep / "summary.md").read_text()
    assert "4 job(s): 2 ok, 1 OOM in training, 1 planned." in md
    job2 = next(ln for ln in md.splitlines() if ln.startswith("| job2 "))
    assert job2.startswith("| job2 | 0.5 | - | OOM in training | 0 | - |")  # preflight.only is swept too
    assert "- job3" not in md  # a plan is no failure
