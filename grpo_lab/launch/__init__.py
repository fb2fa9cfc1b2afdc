"""Stage 3, the hand-over to verl: one job's files, verl's PPO entrypoint, the watchers of a running job, and SLURM.
"""
