"""What the preflight must not wave through (issue 28, "Trust, third pass"), through `python run.py` as a user types
it: a plan with no card size (no memory verdict)."""

from __future__ import annotations

import json
import shlex

from conftest import planned, run_py

H16_4B = ("hardware=rtx4080_16gbx4", "model=qwen3_4b")


def _refused(tmp_path, name: str, *args: str) -> tuple[dict, str]:
    """python run.py preflight.only=true ARGS, refused without a traceback: (plan.json, stdout)."""
    out = run_py("preflight.only=true", *args, f"hydra.run.dir={tmp_path / name}")
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads((tmp_path / name / "plan.json").read_text()), out.stdout


def test_no_card_size_is_refused_not_planned_as_ok(tmp_path):
    """lab.hardware.gpu_memory_gb 0, -16 or null gave "memory plan skipped" and "plan OK", even for a 4B on 16 GB
    cards that the 16 GB card refuses with five memory errors: each is refused, with the hardware option's size."""
    for name, value, args, size in (("null", "null", H16_4B, "16"), ("neg", "-16", (), "32"), ("zero", "0", (), "32")):
        plan, stdout = _refused(tmp_path, name, *args, f"lab.hardware.gpu_memory_gb={value}")
        (e,) = plan["errors"]
        assert e["rule"] == "card_memory_unknown" and "phases" not in plan["memory"], plan["errors"]
        assert e["message"].startswith(f"lab.hardware.gpu_memory_gb={value} is no card size")
        assert f"says {size}" in e["message"] and e["fix"].startswith(f"lab.hardware.gpu_memory_gb={size}")
    # the guide's machine: its card size alone, printed and appended as typed, plans with a memory verdict
    assert e["fix"] == "lab.hardware.gpu_memory_gb=32" and f"fix: {e['fix']}" in stdout
    good = run_py("preflight.only=true", "lab.hardware.gpu_memory_gb=0", *shlex.split(e["fix"]),
                  f"hydra.run.dir={tmp_path / 'good'}")
    assert planned(good) and "Memory plan per GPU (32 GB cards" in good.stdout, good.stdout[-2000:]
