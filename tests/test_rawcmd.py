"""grpo_lab.launch.rawcmd: the raw verl command it prints gives verl exactly the config run.py gives it."""

from __future__ import annotations

import pytest
from conftest import CONF, compose_split
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from grpo_lab.launch.prepare import split
from grpo_lab.launch.rawcmd import raw_overrides
from grpo_lab.verl_schema.verl_paths import verl_config_dir


def _raw_config(overrides: list[str]) -> dict:
    """What `python -m verl.trainer.main_ppo <overrides>` composes (verl's own Hydra main, config ppo_trainer)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        verl, _ = split(compose("ppo_trainer", overrides=overrides))
    GlobalHydra.instance().clear()
    return verl


@pytest.mark.parametrize("job", [["hardware=rtx4080x4"], ["experiment=smoke_tiny", "hardware=h200x1"],
                                 ["model=qwen3_8b_lora", "variant=dapo"]])
def test_raw_command_round_trips(job):
    args = raw_overrides(job, str(CONF))
    GlobalHydra.instance().clear()
    ours, _ = compose_split(*job)
    GlobalHydra.instance().clear()
    assert _raw_config(args) == ours


def test_string_env_vars_stay_strings():
    # seen on the GPU machine: NCCL_P2P_DISABLE=1 unquoted became an int, and Ray refuses non-string env vars
    args = raw_overrides(["hardware=rtx4080x4"], str(CONF))
    assert "++ray_kwargs.ray_init.runtime_env.env_vars.NCCL_P2P_DISABLE='1'" in args
    assert _raw_config(args)["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["NCCL_P2P_DISABLE"] == "1"


def test_help_and_mistakes_get_messages_not_tracebacks(capsys):
    from grpo_lab.launch.rawcmd import main

    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m grpo_lab.launch.rawcmd")
    assert main(["rollout_gpu_mem_utils=0.5"], environ={}) == 2
    err = capsys.readouterr().err
    assert "did you mean 'rollout_gpu_mem_util'" in err and "Traceback" not in err


def test_environment_knobs_reach_the_raw_command():
    import contextlib
    import io

    from grpo_lab.launch.rawcmd import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--list", "hardware=rtx4080x4"], environ={"ROLLOUT_N": "3"}) == 0
    assert "actor_rollout_ref.rollout.n=3" in buf.getvalue().splitlines()
