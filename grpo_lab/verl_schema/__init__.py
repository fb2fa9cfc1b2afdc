"""One home for what grpo-lab reads from the installed verl: its Hydra configs and the composed `ppo_trainer` tree.
"""
