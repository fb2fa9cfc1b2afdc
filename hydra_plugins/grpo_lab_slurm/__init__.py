"""grpo-lab's SLURM launcher (hydra/launcher=slurm): see slurm_launcher.py and grpo_lab/launch/slurm.py."""
