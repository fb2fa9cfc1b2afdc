"""grpo-lab's typed sections (grpo_lab/labconf.py): a wrong key or type in a hardware file fails at compose, through
`python run.py` as a user types it, with Hydra's own error; the typed view a job reads."""

from __future__ import annotations

import pytest
from conftest import composed, fresh_clone, run_py

from grpo_lab.labconf import Lab


@pytest.mark.slow
@pytest.mark.parametrize("old,new,words", [
    ("cpu_cores: 16", "cpu_core: 16", "Key 'cpu_core' not in 'Hardware'"),
    ("gpu_memory_gb: 32", "gpu_memory_gb: 32 GB", "Value '32 GB' of type 'str' could not be converted to Float"),
])
def test_a_wrong_key_or_type_in_a_hardware_file_fails_at_compose(tmp_path, old, new, words):
    root = fresh_clone(tmp_path / "clone")
    hw = root / "conf" / "hardware" / "rtx4080x4.yaml"
    assert old in hw.read_text()
    hw.write_text(hw.read_text().replace(old, new))
    out = run_py("preflight.only=true", f"hydra.run.dir={tmp_path / 'run'}", root=root, cwd=root)
    assert out.returncode == 1 and words in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr and not (tmp_path / "run" / "plan.json").exists()


def test_the_view_is_typed_and_reads_older_run_folders():
    _, lab = composed("hardware=h200x4_as_rtx4080x4")
    assert lab.hardware.gpu_memory_gb == 32 and lab.hardware.emulate.real_gpu_memory_gb == 139.8
    assert lab.preflight.strict is True and lab.side_by_side_jobs == 1 and lab.model.name == "qwen3_1_7b"
    old = Lab.of({"hardware": {"gpu_memory_gb": 16, "gone": 1}, "model": None, "variant": "dapo"})
    assert old.hardware.gpu_memory_gb == 16 and old.model.name is None and old.variant == "dapo"
