"""Tasks and data: datasets in verl's parquet rows (GSM8K, arithmetic, countdown, your own pairs), the offline models
(tiny Qwen3, SmolLM2, random-weight Qwen3) and the reward functions verl loads by file path.
"""
