"""grpo-lab: GRPO fine-tuning of Qwen3 with verl on small GPU boxes. See README.md."""

from omegaconf import OmegaConf

__version__ = "0.1.0"


def _numbers(*xs: object) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)


# `${lab_sum:a,b}` in conf/: the one piece of arithmetic the configs need (vLLM's max_model_len = prompt + response).
# Registered on import of the package, which run.py, the Hydra searchpath plugin and the tests all do first.
# A part that is no number (max_response_length=abc) gives null: the preflight's value_types names the part.
if not OmegaConf.has_resolver("lab_sum"):
    OmegaConf.register_new_resolver("lab_sum", lambda *xs: sum(xs) if _numbers(*xs) else None)

# `${lab_fraction:n,f}` in conf/variant/dapo.yaml: int(n x f), at least 1 (DAPO's overlong ramp, a share of the limit);
# null when n or f is no number, as lab_sum
if not OmegaConf.has_resolver("lab_fraction"):
    OmegaConf.register_new_resolver("lab_fraction", lambda n, f: max(1, int(n * f)) if _numbers(n, f) else None)

# `${lab_unique_dir:path}` in conf/config.yaml's hydra.run.dir and hydra.sweep.dir: one folder per run (grpo_lab/cli/config.py)
# (run.py registers it again, with create=False, when Hydra only prints)
if not OmegaConf.has_resolver("lab_unique_dir"):
    from grpo_lab.cli.config import use_run_dirs

    use_run_dirs(create=True)

# `${lab_pkg:tasks/rewards/strict_format.py}` in conf/reward_fn/: a file shipped inside this package, by absolute path, so a
# shipped reward is found wherever run.py is launched from (`${hydra:runtime.cwd}` is the launch folder)
if not OmegaConf.has_resolver("lab_pkg"):
    import os as _os

    OmegaConf.register_new_resolver("lab_pkg", lambda rel: _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), rel))

# `${lab_help:groups,...}` in conf/hydra/help/grpo_lab.yaml: the lists of `python run.py --help`, made from conf/ when it
# is printed (grpo_lab/cli/help.py)
if not OmegaConf.has_resolver("lab_help"):
    def _lab_help(part, choices=None):
        from grpo_lab.cli.help import section

        return section(part, choices)

    OmegaConf.register_new_resolver("lab_help", _lab_help)
