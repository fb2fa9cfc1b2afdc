"""The memory plan against the recorded GPU runs (benchmarks/gpu/results/, recorded output of verl 0.9.1 + vLLM 0.24
on the H200 test machine): the calibration script, the table it writes, and the verdicts and texts that follow it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import ROOT, planned, run_py

from grpo_lab.memory import calibration, memplan
from grpo_lab.memory.memplan_phases import training_phase

SCRIPT = ROOT / "benchmarks" / "calibrate_memplan.py"
RESULTS = ROOT / "benchmarks" / "gpu" / "results"
SMOKE_SMOLLM2 = RESULTS / "2026-12-03-smollm2-variants-lora" / "variants_drgrpo_gspo" / "job0"
MOE = ROOT / "tests" / "fixtures" / "synthetic" / "qwen3_30b_a3b"
ONE_GPU_SMALL = "one GPU, 10M-1B parameters, vLLM"


def calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration") / "table.json"
    proc = calibrate("--json", str(out))
    return proc, json.loads(out.read_text())


def test_every_recorded_job_is_within_the_stated_accuracy(replayed):
    proc, res = replayed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trained = [j for j in res["jobs"] if "training" in j]
    # smoke_smollm2 (4 variants; 2026-12-04: DAPO and LoRA), learn_smollm2 (two sweeps, the README re-run, 2026-12-04's
    # solo runs with and without activation checkpointing, 2026-12-06's and 2026-12-07's at the default speed),
    # smoke_tiny
    assert sum(j["model"] == "smollm2_135m" for j in trained) == 15 and any(j["model"] == "tiny_qwen3" for j in trained)
    for j in trained:
        # plan / verl's allocated peak (an out-of-memory error depends on it: the caching allocator frees its cache
        # and retries first); the reserved peak is shown, and p17's (2026-12-04) is 24% above its allocated one
        assert 0.85 <= j["training"]["ratio_allocated"] <= 1.15, j
        assert j["training"]["ratio"] <= j["training"]["ratio_allocated"], j  # reserved >= allocated
        assert j["job"] in proc.stdout and str(j["training"]["planned_gb"]) in proc.stdout
    kv = [j for j in res["jobs"] if "kv_cache" in j and not j["side_by_side"]]
    assert len(kv) >= 7 and all(0.9 <= j["kv_cache"]["ratio"] <= 1.1 for j in kv)
    # the side-by-side sweep's job1 got 1.09 GiB while its neighbours loaded: listed, not held to the accuracy
    job1 = next(j for j in res["jobs"] if j["job"].endswith("2026-12-03-smollm2-lr-sweep/sweep/job1"))
    assert job1["side_by_side"] and job1["kv_cache"]["measured_gb"] == [1.17]
    # recorded folders without the config they ran with are named, not silently skipped
    assert any(s["job"].endswith("2026-12-03/mem_util_sweep/job0") for s in res["not_replayed"])


def test_the_smokes_peak_at_the_weight_sync(replayed):
    """What the plan had missed: verl's peak is the trainer's whole-run allocator peak, and for the smokes that is
    the weight sync (the 4 GiB bucket beside FSDP1's full-state-dict copy), not the update."""
    _, res = replayed
    smoke = next(j for j in res["jobs"] if j["job"].endswith("variants_drgrpo_gspo/job0"))
    assert smoke["training"]["planned_what"] == "weight sync"
    learn = next(j for j in res["jobs"] if j["job"].endswith("2026-12-03-smollm2/sweep/job0"))
    assert learn["training"]["planned_what"] == "update"
    one_step = next(j for j in res["jobs"] if j["job"].endswith("variants_grpo_dapo/job1"))  # cut after step 1
    assert one_step["training"]["steps"] == 1 and one_step["training"]["planned_what"] == "first weight sync"


def test_the_committed_table_is_what_the_script_writes(replayed):
    """Accuracy claims are generated: the table in the repository is the script's output for today's plan."""
    _, res = replayed
    committed = json.loads(calibration.TABLE.read_text())
    assert committed["regimes"] == res["regimes"] and committed["jobs"] == res["jobs"], "run: make calibrate"
    assert committed["command"] == calibration.COMMAND
    md = (ROOT / calibration.TABLE_MD).read_text()
    row = res["regimes"][ONE_GPU_SMALL]["training"]
    assert f"| {ONE_GPU_SMALL} | training | {row['runs']} | {row['ratio_min']:.2f}-{row['ratio_max']:.2f} |" in md


def test_a_job_outside_the_accuracy_fails_the_calibration(tmp_path):
    """A copy of a recorded job whose metrics were edited (labelled: not a real run) to twice the peak."""
    job = tmp_path / "results" / "edited_smoke_smollm2"
    shutil.copytree(SMOKE_SMOLLM2, job)
    lines = []
    for line in (job / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for k in ("actor/perf/max_memory_reserved_gb", "actor/perf/max_memory_allocated_gb"):
            if k in row["data"]:
                row["data"][k] *= 2
        lines.append(json.dumps(row))
    (job / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    proc = calibrate("--results", str(tmp_path / "results"), "--json", str(tmp_path / "t.json"))
    assert proc.returncode == 1
    assert "OUTSIDE THE STATED ACCURACY" in proc.stderr and "edited_smoke_smollm2: training plan 6.63 GB" in proc.stderr


def test_the_docs_and_outputs_quote_the_table():
    train = calibration.entry(ONE_GPU_SMALL, "training")
    kv = calibration.entry(ONE_GPU_SMALL, "kv_cache")
    readme = " ".join((ROOT / "docs" / "fit.md").read_text().split())
    assert (f"the plan was {train['ratio_min']:.2f}-{train['ratio_max']:.2f} of verl's reserved training peak and "
            f"{kv['ratio_min']:.2f}-{kv['ratio_max']:.2f} of vLLM's KV cache") in readme
    assert f"by more than {calibration.UNMEASURED_MARGIN:.0%}" in readme
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("grpo_lab/**/*.py"),
                 *ROOT.glob("benchmarks/**/*.md"), *ROOT.glob("benchmarks/**/*.py")]:
        assert "0.95-1.02" not in path.read_text(), path  # the old training-only bench range, written by hand


def test_make_plan_prints_the_range_of_its_regime(tmp_path):
    # speed=guide: the settings the regime's recorded runs had (the fused log-prob moves the peak to the weight sync)
    p = run_py("experiment=learn_smollm2", "hardware=h200x1", "speed=guide", "preflight.only=true",
               "preflight.verbose=true", f"hydra.run.dir={tmp_path}")
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    line = calibration.accuracy_lines(ONE_GPU_SMALL)[0]
    assert line.startswith("training peak: plan 0.") and f"plan vs recorded runs: {line}" in p.stdout
    assert "trainer's torch allocator peak" in p.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())["memory"]
    cal = plan["calibration"]
    for verdict in ("generation", "training", "weight_sync", "kv_cache", "host_ram"):
        assert {"regime", "measured", "margin"} <= set(cal[verdict]), verdict
    assert cal["training"]["measured"] and cal["training"]["regime"] == ONE_GPU_SMALL
    assert cal["training"]["margin"] == calibration.margin_of(calibration.entry(ONE_GPU_SMALL, "training"))
    assert cal["host_ram"]["measured"] is False
    ta = plan["trainer_allocator"]
    assert ta["peak_of"] == "update" and set(ta["peaks_gb"]) >= {"update", "weight_sync", "first_weight_sync"}


def test_unmeasured_regime_warns_within_the_margin_and_refuses_beyond_it(tmp_path):
    """A Qwen3-30B-A3B configuration like verl's 8 x 80 GB example (the synthetic config of its published numbers):
    a mixture of experts on several GPUs, which no recorded run measured."""
    # speed=guide: the per-token log-prob, whose vocabulary-sized logits put these budgets' training peaks past 80 GB
    common = ("hardware=a100_80gbx8", f"actor_rollout_ref.model.path={MOE}", "rollout_tp=8", "speed=guide",
              "preflight.only=true")
    p = run_py(*common, "ppo_max_token_len_per_gpu=32768", f"hydra.run.dir={tmp_path / 'a'}")
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    peak = plan["memory"]["phases"]["training"]["peak_gb_per_gpu"]
    assert 80 < peak <= 80 * (1 + calibration.UNMEASURED_MARGIN)
    w = next(w for w in plan["warnings"] if w["rule"] == "memory_training")
    assert "may not fit" in w["message"] and f"{peak} GB" in w["message"] and "not measured" in w["message"]
    assert "mixture of experts" in w["message"] and "several GPUs" in w["message"]
    cal = plan["memory"]["calibration"]["training"]
    assert cal["measured"] is False and cal["margin"] == calibration.UNMEASURED_MARGIN
    # beyond the margin it is refused, with the numbers
    p = run_py(*common, "ppo_max_token_len_per_gpu=49152", f"hydra.run.dir={tmp_path / 'b'}")
    assert p.returncode == 2
    assert "[memory_training] training phase: predicted peak" in p.stdout
    assert "beyond the plan's margin of 25%" in p.stdout


def test_measured_regime_refuses_only_beyond_its_measured_error():
    arch = memplan.Arch.from_mapping({"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                                      "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
                                      "vocab_size": 49152, "tie_word_embeddings": True})  # SmolLM2-135M
    base = memplan.Settings(n_gpus=1, card_gb=139.8, use_dynamic_bsz=True, max_prompt_length=256,
                            max_response_length=256, max_model_len=512, gpu_memory_utilization=0.2)
    peak = training_phase(arch, base)["peak_gb_per_gpu"]
    margin = calibration.margin_of(calibration.entry(ONE_GPU_SMALL, "training"))
    assert memplan.memory_plan(arch, base, remedies=False)["calibration"]["training"]["margin"] == margin
    just_over = replace(base, card_gb=peak / (1 + margin / 2))
    well_over = replace(base, card_gb=peak / (1 + margin + 0.02))
    assert memplan.memory_plan(arch, just_over, remedies=False)["verdict"]["training"] == "tight"
    assert memplan.memory_plan(arch, well_over, remedies=False)["verdict"]["training"] == "oom"
