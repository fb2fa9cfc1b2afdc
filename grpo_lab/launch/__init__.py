"""Stage 3, the hand-over to verl: one job as a pipeline of stages (job.py), its files, verl's PPO entrypoint, the
watchers of a running job, a sweep's exit code (outcome.py), and SLURM.
"""
