#!/usr/bin/env python
"""grpo-lab: GRPO with verl, composed from config groups.

    python run.py                                  # the guide's Qwen3-1.7B run on 4x RTX 4080 32 GB
    python run.py experiment=smoke                 # the guide's 3-step smoke test (make smoke)
    python run.py model=qwen3_4b variant=dapo      # other group options (see README)
    python run.py preflight.only=true              # check and plan only, nothing starts (make plan)
    python run.py --cfg job --resolve              # print the composed config
    python run.py -m rollout_gpu_mem_util=0.3,0.4,0.5     # a sweep, one job after another
    python run.py --help                           # the groups, short keys and make targets (conf/hydra/help/)

Any verl key can be overridden (actor_rollout_ref.actor.fsdp_config.optimizer_offload=true), and the official
script's environment variables work too (ROLLOUT_GPU_MEM_UTIL=0.5 python run.py).
"""

import sys

import hydra
from omegaconf import DictConfig

from grpo_lab.cli.config import unwritable_run_dir, use_run_dirs
from grpo_lab.cli.overrides import CommandLine, prepare, tree_if_needed


def main(cli: CommandLine) -> None:
    """Hydra's app, on the command line parsed once: Hydra reads it from sys.argv, each job gets it as `cli`.
    A job refused or not ready here exits 2 or 3; a sweep of them, at its end (a Hydra callback, launch/outcome.py)."""

    @hydra.main(config_path="conf", config_name="config", version_base=None)
    def job(cfg: DictConfig) -> str:
        from grpo_lab.after_run import doctor
        from grpo_lab.launch.job import launch_job
        from grpo_lab.launch.slurm import serve_ray_worker

        # a SLURM job of several nodes runs this on each node: all but the first are Ray worker nodes
        # (grpo_lab/launch/slurm.py)
        return serve_ray_worker(cfg) or launch_job(cfg, cli, doctor)

    sys.argv = [sys.argv[0], *cli.argv]  # the command line, then the environment's knobs
    job()


if __name__ == "__main__":
    # the command line parsed once (grpo_lab/cli/overrides.py): a mistake is refused here, before composing; the
    # environment's knobs are added as overrides
    cli = prepare(sys.argv)
    why = "" if cli.only_prints else unwritable_run_dir(cli)  # before Hydra makes the run folder
    if why:
        print(f"grpo-lab: error: {why}", file=sys.stderr)
        sys.exit(2)
    use_run_dirs(create=not cli.only_prints)  # hydra.run.dir's resolver: no run folder when Hydra only prints
    # verl's composed ppo_trainer comes from the schema cache (grpo_lab/verl_schema); picking a verl group option needs
    # verl's own tree
    with tree_if_needed(cli):
        main(cli)
