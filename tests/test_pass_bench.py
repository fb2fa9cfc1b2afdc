"""benchmarks/gpu/pass_bench.py runs as its header says on a CPU (the GPU test machine runs it at full size)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu" / "pass_bench.py"


def test_the_cpu_command_times_three_passes_both_ways_within_their_budgets(tmp_path):
    out = tmp_path / "pass.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--size", "tiny", "--seqs", "8", "--response", "64",
                        "--update-tokens", "300", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["passes"].keys() == {"old_log_prob", "reference", "update"}
    assert "Using Torch backend for fused kernels" in p.stdout + p.stderr  # verl's FusedLinearForPPO was patched in
    for name, row in res["passes"].items():
        assert row["guide_s"] > 0 and row["fused_s"] > 0 and row["ratio"] == row["guide_s"] / row["fused_s"]
        assert f"  {name}" in p.stdout
    # 8 answers of 35 + 16..64 tokens: one micro-batch of 4,096, several of 300 (no micro-batch above its budget)
    assert res["passes"]["old_log_prob"]["micro_batches"] == 1
    update = res["passes"]["update"]
    assert update["micro_batches"] >= -(-update["tokens"] // 300) > 1
    assert update["tokens"] == res["passes"]["reference"]["tokens"]


def test_the_budget_bench_cpu_command_times_each_budget_packed_and_padded(tmp_path):
    out = tmp_path / "budgets.json"
    p = subprocess.run([sys.executable, str(SCRIPT.parent / "budget_bench.py"), "--size", "tiny", "--seqs", "8",
                        "--response", "64", "--budgets", "256,1024", "--lora-rank", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["checkpointing"], r["layout"], r["budget"]) for r in rows} == {
        (c, lay, b) for c in (True, False) for lay in ("packed", "padded") for b in (256, 1024)}
    for r in rows:
        assert r["update_s"] > 0 and r["old_log_prob_s"] > 0 and r["largest"] <= r["budget"]
        # padded to each micro-batch's longest answer: at least the answers' own tokens (lengths spread 16-64)
        assert r["padded_tokens"] > r["tokens"]
    by_budget = {r["budget"]: r["micro_batches"] for r in rows}
    assert by_budget[256] > by_budget[1024] == 1
