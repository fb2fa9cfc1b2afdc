"""hydra/launcher=slurm: hydra-submitit-launcher's SlurmLauncher, with grpo-lab's checks before any sbatch.

Hydra instantiates launchers only from the hydra_plugins package, so the class lives here; what it checks and the
sbatch preview are in grpo_lab/launch/slurm.py. Without hydra-submitit-launcher installed this module defines nothing
(Hydra imports every module here on each start), and conf/hydra/launcher/slurm.yaml cannot compose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError:  # pip install hydra-submitit-launcher==1.2.0 (requirements-gpu.txt)
    _SubmititSlurmLauncher = None

if _SubmititSlurmLauncher is not None:

    class GrpoLabSlurmLauncher(_SubmititSlurmLauncher):
        """One sbatch job (array task) per sweep point, refused before submitting when it cannot run."""

        def sbatch_preview(self, n_jobs: int = 1) -> str:
            from grpo_lab.launch.slurm import sbatch_preview

            return sbatch_preview(self.params, n_jobs)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from omegaconf import OmegaConf

            from grpo_lab.launch.slurm import check_before_submit

            nnodes = OmegaConf.select(self.config, "trainer.nnodes", default=None) if self.config is not None else None
            check_before_submit(self.params, job_overrides, None if nnodes is None else int(nnodes))
            return super().launch(job_overrides, initial_job_idx)
