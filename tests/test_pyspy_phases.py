"""benchmarks/gpu/pyspy_phases.py on the recorded py-spy samples of verl's worker (results/2026-12-04-speed)."""

from __future__ import annotations

import importlib.util
import json

from conftest import ROOT

RESULTS = ROOT / "benchmarks" / "gpu" / "results" / "2026-12-04-speed"
spec = importlib.util.spec_from_file_location("pyspy_phases", ROOT / "benchmarks" / "gpu" / "pyspy_phases.py")
pyspy_phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pyspy_phases)


def test_every_sample_lands_in_one_phase_and_one_kind():
    raw = next((RESULTS / "smol_guide.pyspy").glob("WorkerDict.*.txt.gz"))
    rows = pyspy_phases.read_raw(raw)
    table = pyspy_phases.attribute(rows)
    assert sum(sum(k.values()) for k in table.values()) == sum(n for _, n in rows)
    assert {"compute_log_prob", "compute_ref_log_prob", "update_actor"} <= table.keys()
    kinds = {kind for kind, _ in pyspy_phases.KINDS} | {"other"}
    assert all(set(counts) <= kinds for counts in table.values())


def test_kind_is_the_first_marker_in_the_list():
    stack = ["ActorRolloutRefWorker.update_actor (verl/x.py:1)", "Tensor.backward (torch/_tensor.py:2)",
             "logprobs_from_logits_v2 (verl/utils/torch_functional.py:204)"]
    assert pyspy_phases.phase_of(stack) == "update_actor"
    assert pyspy_phases.kind_of(stack).startswith("log-prob row loop")
    assert pyspy_phases.kind_of(stack[:2]) == "backward"
    assert pyspy_phases.phase_of(stack[1:]) == "(outside a worker call)"


def test_verl_timers_are_summed_over_the_steps(capsys):
    metrics = RESULTS / "smol_guide" / "metrics.jsonl"
    steps = [json.loads(line)["data"] for line in metrics.read_text().splitlines()]
    expected = sum(d.get("timing_s/old_log_prob", 0.0) for d in steps)
    raw = next((RESULTS / "smol_guide.pyspy").glob("WorkerDict.*.txt.gz"))
    assert pyspy_phases.main([str(raw), "--metrics", str(metrics)]) == 0
    assert f"verl's timing_s/old_log_prob: {expected:.1f} s" in capsys.readouterr().out


def test_the_fixed_costs_issue_27_names_are_told_apart_on_the_recorded_run():
    raw = next((RESULTS / "smol_guide.pyspy").glob("WorkerDict.*.txt.gz"))
    table = pyspy_phases.attribute(pyspy_phases.read_raw(raw))
    offload, padding = "FSDP parameter offload (to and from host memory)", "padding removed and restored"
    # the model moves to the host once at start-up; the ref pass's offload round trips wait on copies (not sampled)
    assert table["init_model"][offload] > 0 and table["compute_ref_log_prob"][offload] == 0
    assert 0 < table["update_actor"][padding] < table["update_actor"]["batch data movement"]
