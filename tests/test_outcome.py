"""A sweep's exit code (grpo_lab/launch/outcome.py): read from each job's status.json at the end of the multirun, so
that jobs run in other processes (side by side, SLURM) count as much as jobs run in this one. Through run.py:
tests/test_refusals.py (a refused job, exit 2) and tests/test_preflight_readiness.py (plans not ready here, exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_lab.launch.outcome import NOT_READY_EXIT, REFUSED_EXIT, SweepOutcomeCallback, sweep_outcome


def _job(sweep: Path, name: str, **status) -> Path:
    job = sweep / name
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps(status))
    return job


def _sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep"
    _job(sweep, "job0", status="ok", exit=0)
    _job(sweep, "job10", status="failed", exit=REFUSED_EXIT, error="1 problem(s) above")
    _job(sweep, "job2", status="failed", exit=REFUSED_EXIT, error="1 problem(s) above")
    _job(sweep, "job3", status="ok", exit=NOT_READY_EXIT, ready_here=False)
    _job(sweep, "job4", status="failed", exit=1, error="RuntimeError: boom")  # a crash is not a refusal
    _job(sweep, "job5", status="running")
    (sweep / "job6").mkdir()
    (sweep / "job6" / "status.json").write_text("{not json")
    return sweep


def test_refused_and_not_ready_jobs_are_read_from_their_status_in_job_order(tmp_path):
    sweep = _sweep(tmp_path)
    out = sweep_outcome(sweep)
    assert out.refused == [str(sweep / "job2"), str(sweep / "job10")]
    assert out.not_ready == [str(sweep / "job3")]
    assert out.exit_code == REFUSED_EXIT
    assert out.message() == (f"grpo-lab: 2 sweep job(s) refused: {sweep / 'job2'}, {sweep / 'job10'} (their "
                             f"plan.json and the sweep's summary.md say why)")


def _end(sweep: Path) -> None:
    SweepOutcomeCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))


def test_the_callback_ends_the_sweep_with_its_exit_code(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    with pytest.raises(SystemExit) as e:
        _end(sweep)
    assert e.value.code == REFUSED_EXIT and "2 sweep job(s) refused" in capsys.readouterr().err
    for name in ("job2", "job10"):
        (sweep / name / "status.json").unlink()
    with pytest.raises(SystemExit) as e:
        _end(sweep)
    assert e.value.code == NOT_READY_EXIT
    assert "1 sweep job(s) planned OK but not ready to launch here" in capsys.readouterr().err
    (sweep / "job3" / "status.json").unlink()
    _end(sweep)  # every job passed (or crashed: Hydra reports that itself): no word, no exit
    assert capsys.readouterr().err == ""


def test_the_sweep_ends_after_its_summary_is_written(tmp_path):
    # conf/config.yaml's callbacks as Hydra runs them at the end of a multirun (last-listed first)
    from conftest import CONF
    from hydra._internal.callbacks import Callbacks

    sweep = tmp_path / "sweep"
    _job(sweep, "job0", status="failed", exit=REFUSED_EXIT, error="1 problem(s) above")
    (sweep / "multirun.yaml").write_text("{}")
    callbacks = OmegaConf.load(Path(CONF) / "config.yaml").hydra.callbacks
    config = OmegaConf.create({"hydra": {"callbacks": callbacks, "sweep": {"dir": str(sweep)}}})
    with pytest.raises(SystemExit) as e:
        Callbacks(config).on_multirun_end(config=config)
    assert e.value.code == REFUSED_EXIT
    assert (sweep / "summary.md").is_file()
