"""The memory plan the checks and the fit use: what one GRPO step of verl 0.9.1 puts on each GPU, per engine, calibrated
against the recorded GPU runs.
"""
