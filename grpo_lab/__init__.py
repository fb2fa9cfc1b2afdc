"""grpo-lab: GRPO fine-tuning of Qwen3 with verl on small GPU boxes. See README.md."""

from omegaconf import OmegaConf

__version__ = "0.1.0"


def _numbers(*xs: object) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)


# conf/'s resolvers, registered on import of the package (docs/cli.md); `${lab_sum:a,b}`: null when a part is no number
if not OmegaConf.has_resolver("lab_sum"):
    OmegaConf.register_new_resolver("lab_sum", lambda *xs: sum(xs) if _numbers(*xs) else None)

# `${lab_fraction:n,f}` in conf/variant/dapo.yaml: int(n x f), at least 1; null when n or f is no number
if not OmegaConf.has_resolver("lab_fraction"):
    OmegaConf.register_new_resolver("lab_fraction", lambda n, f: max(1, int(n * f)) if _numbers(n, f) else None)

# `${lab_packed:attn_implementation}` in conf/speed/fast.yaml: packed micro-batches (use_remove_padding) unless the
# attention is sdpa or eager, where padded ones attend within each answer instead of across the micro-batch
if not OmegaConf.has_resolver("lab_packed"):
    OmegaConf.register_new_resolver("lab_packed", lambda attn: str(attn) not in ("sdpa", "eager"))

# `${lab_unique_dir:path}`: one folder per run (grpo_lab/cli/config.py; run.py registers it again, create=False)
if not OmegaConf.has_resolver("lab_unique_dir"):
    from grpo_lab.cli.config import use_run_dirs

    use_run_dirs(create=True)

# `${lab_pkg:tasks/rewards/strict_format.py}`: a file shipped inside this package, by absolute path
if not OmegaConf.has_resolver("lab_pkg"):
    from os import path as _path

    OmegaConf.register_new_resolver("lab_pkg", lambda rel: _path.join(_path.dirname(_path.abspath(__file__)), rel))

# `${lab_help:groups,...}`: the lists of `python run.py --help` (grpo_lab/cli/help.py)
if not OmegaConf.has_resolver("lab_help"):
    def _lab_help(part, choices=None):
        from grpo_lab.cli.help import section

        return section(part, choices)

    OmegaConf.register_new_resolver("lab_help", _lab_help)
