"""grpo-lab: GRPO fine-tuning of Qwen3 with verl on small GPU boxes. See README.md."""

__version__ = "0.1.0"
