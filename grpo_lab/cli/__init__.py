"""Stage 1, the command line: argv parsed once (Hydra's grammar), the official script's knobs, the composed config
resolved and split into verl's part and grpo-lab's own, and every changed default named.
"""
