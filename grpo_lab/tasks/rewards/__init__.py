"""Reward functions that verl loads by file path (reward.custom_reward_function.path; conf/reward_fn/ selects one).

Each file stands alone (standard library only): verl's loader imports it by path inside its reward workers.
"""
