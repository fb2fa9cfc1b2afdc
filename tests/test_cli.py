"""What a user types, through the real entry point: `python run.py` (and `make`) in a subprocess with real argv.

- every option of every config group of ours reaches the preflight (one multirun per group, `preflight.only=true`):
  a refusal by the preflight is fine, a Hydra/compose error or a traceback is not; new option files are picked up
- every command written in a config file's header, in README.md and in docs/' bash blocks: the CPU ones run as
  written, the GPU ones are composed and checked with `preflight.only=true` appended (make targets: their run.py
  line, from `make -n`)
- mistakes on the command line are refused before composing, with the closest real name (issue 10, items 1, 7, 9)
- two runs started at once get two folders (item 10)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONF, NOT_READY_EXIT, ROOT, run_py

from grpo_lab.facts import load_yaml

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
BAD = re.compile(r"Traceback \(most recent call last\)|Error executing job|Could not override"
                 r"|ConfigCompositionException|InterpolationResolutionError|MissingConfigException")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _assert_reached_preflight(job: Path, text: str) -> None:
    assert (job / "plan.json").is_file(), f"{job} did not reach the preflight:\n{text[-3000:]}"
    status = json.loads((job / "status.json").read_text())
    assert status["status"] == "ok" or status["exit"] == 2, (job, status)


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_reaches_the_preflight(group, tmp_path):
    options = _options(group)
    # the sweep summary after every job (a plot each time) is tests/test_summary.py's; off here, for speed
    proc = run_py("-m", f"{group}={','.join(options)}", "preflight.only=true", f"hydra.sweep.dir={tmp_path}",
                  "~hydra.callbacks.sweep_summary", timeout=300)
    text = proc.stdout + proc.stderr
    assert not BAD.search(text), text[-4000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.name.startswith("job"))
    assert len(jobs) == len(options), text[-3000:]
    for job in jobs:
        _assert_reached_preflight(job, text)
    chosen = {yaml_choice(job, group) for job in jobs}
    assert chosen == set(options)


def yaml_choice(job: Path, group: str) -> str:

    return load_yaml(job / ".hydra" / "hydra.yaml")["hydra"]["runtime"]["choices"][group]


# ---- commands in the config headers and the README ----

_CMD = re.compile(r"((?:[A-Z_]+=\S+\s+)*(?:python run\.py|make [a-z])[^#`\n]*?)(?=\s{2,}|\)|;|`|,? or |$)")
# commands that are not run here, and why (a new kind of command must be added to a rule below or here)
NOT_RUN = {
    "make test": "the test suite itself",
    "make test-fast": "the test suite itself, without the tests marked slow",
    "make lint": "tests/test_lint.py runs it",
    "make data": "downloads GSM8K from the hub (no hub downloads in tests); tests/test_data.py covers the converter",
    "make setup": "installs the GPU environment",
    "make tiny": "writes the tiny model into data/ of the checkout; tests/test_tiny.py runs grpo_lab.tasks.tiny itself",
    "make own-data": "reads the user's own file; tests/test_own_data.py runs it on files it writes",
    "make doctor": "reads a run's log; tests/test_doctor.py and tests/test_refusals.py run it",
    "make report": "reads a run's folder; tests/test_report.py and tests/test_refusals.py run it",
    "make qwen3-random": "writes Qwen3-size models into data/ of the checkout; tests/test_qwen3_random.py builds "
                         "a reduced one into a tmp dir",
    "make smollm2": "writes the converted model into data/ of the checkout; tests/test_smollm2.py converts into a "
                    "tmp dir",
    "make arith-oneshot": "writes data/ of the checkout; tests/test_arith.py runs the generator",
    "make countdown": "writes data/ of the checkout; tests/test_countdown.py runs the generator",
    "make capacity": "tests/test_capacity.py runs it and compares its table with docs/time_plan.md's",
    "make calibrate": "rewrites benchmarks/gpu/memplan_calibration.* of the checkout; tests/test_calibration.py runs "
                      "the script into a tmp file and compares it with them",
}
# commands for the user's own files or machines, by their first words
NOT_RUN_PREFIX = {
    "python -m grpo_lab.tasks.data own": "reads the user's own file; tests/test_own_data.py runs it on files it writes",
    "ray ": "starts, lists or stops a Ray cluster on the user's nodes",
    "pip install": "installs packages (make test and make setup install these into their environments)",
    "python run.py experiment=my_4b": "runs the file that `make fit ... WRITE=my_4b` writes; tests/test_fit.py "
                                      "composes and plans a written file",
}
GPU_TARGETS = {"smoke", "smoke-tiny", "train", "train-4b", "sweep"}
# CPU targets run as written (through make): plan and fit (WRITE= would write into conf/ of the checkout)
CPU_TARGETS = {"plan", "fit"}


def header_commands() -> set[str]:
    out = set()
    for path in sorted(CONF.rglob("*.yaml")):
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            out |= {m.group(1).strip() for m in _CMD.finditer(line[1:])}
    return out


def readme_commands() -> set[str]:
    """README.md's commands (its bash blocks and inline spans) and those of the bash blocks moved to docs/."""
    text = (ROOT / "README.md").read_text()
    blocks = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    out = set()
    for block in re.findall(r"```bash\n(.*?)```", text + blocks, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = re.split(r"\s+#", cmd)[0].strip()
            if cmd:
                out.add(re.sub(r"\s+", " ", cmd))
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        if span.startswith(("python run.py", "make ")):
            out.add(span.strip())
    return out


def _runnable(cmd: str) -> bool:
    return "<" not in cmd and "..." not in cmd


def _one_group_option(cmd: str) -> bool:
    """`python run.py <group>=<option>`: exactly one job of test_every_option_of_every_group_reaches_the_preflight."""
    words = cmd.split()
    return (len(words) == 3 and words[:2] == ["python", "run.py"] and words[2].partition("=")[0] in GROUPS
            and words[2].partition("=")[2] in _options(words[2].partition("=")[0]))


ALL_COMMANDS = sorted(c for c in header_commands() | readme_commands() if _runnable(c))
COMMANDS = [c for c in ALL_COMMANDS if not _one_group_option(c)]


def test_the_documented_commands_are_found():
    assert "python run.py hardware=a100_80gbx8 rollout=tp2_mem06 model=qwen3_4b" in COMMANDS  # item 1
    assert any(c.startswith("MODEL_PATH=Qwen/Qwen3-0.6B") for c in COMMANDS)
    assert 'make plan ARGS="model=qwen3_4b"' in COMMANDS
    assert "python run.py variant=dapo" in ALL_COMMANDS and "python run.py variant=dapo" not in COMMANDS
    assert len(ALL_COMMANDS) > 35 and len(COMMANDS) > 15


def _split_env(cmd: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(cmd)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    return env, words


def _make_run_line(words: list[str]) -> list[str]:
    """The run.py line a make target runs (make -n: printed, not run)."""
    py = sys.executable
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), *words[1:], f"GPU_PY={py}", f"PY={py}"], text=True,
                          capture_output=True, timeout=60)
    lines = [line for line in proc.stdout.splitlines() if "run.py" in line]
    assert lines, proc.stdout + proc.stderr
    return shlex.split(lines[-1])


@pytest.mark.parametrize("cmd", COMMANDS)
def test_documented_command(cmd, tmp_path):
    env, words = _split_env(cmd)
    if words[0] == "make" and " ".join(words[:2]) in NOT_RUN:
        pytest.skip(f"{cmd}: {NOT_RUN[' '.join(words[:2])]}")  # a documented reason, not a missing feature
    for prefix, why in NOT_RUN_PREFIX.items():
        if " ".join(words).startswith(prefix):
            pytest.skip(f"{cmd}: {why}")
    if words[0] == "make" and words[1] == "fit" and any(w.startswith("WRITE=") for w in words):
        pytest.skip(f"{cmd}: writes conf/experiment/ of the checkout; tests/test_fit.py runs fit_write")
    if words[0] == "make" and words[1] in CPU_TARGETS:  # CPU: run as written, through make
        args = [w for w in words[2:] if not w.startswith("ARGS=")]
        extra = [w[5:] for w in words[2:] if w.startswith("ARGS=")]
        argv = ["make", "-C", str(ROOT), words[1], *args, f"PY={sys.executable}",
                "ARGS=" + " ".join(extra + [f"hydra.run.dir={tmp_path}/run"])]
    elif words[0] == "make":
        assert words[1] in GPU_TARGETS, f"unknown make target in the docs: {cmd} (add it to a rule of this test)"
        line = _make_run_line(words)
        assert line[1] == "run.py", line
        argv = [sys.executable, str(ROOT / "run.py"), *line[2:]]
    else:
        assert words[:2] == ["python", "run.py"], cmd
        argv = [sys.executable, str(ROOT / "run.py"), *words[2:]]
    prints = {"--cfg", "--help", "--hydra-help"} & set(argv)  # Hydra only prints: run as written
    if not prints and words[1] not in CPU_TARGETS:
        argv.append("preflight.only=true")
    if words[1] not in CPU_TARGETS and not prints:
        argv.append(f"hydra.sweep.dir={tmp_path}/sweep" if "-m" in argv else f"hydra.run.dir={tmp_path}/run")
    if "-m" in argv and not prints:
        argv.append("~hydra.callbacks.sweep_summary")  # as in the group test: the summary is test_summary.py's
    full_env = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME", "GRPO_LAB_CACHE_DIR")}
    full_env.update(env)
    proc = subprocess.run(argv, cwd=tmp_path, env=full_env, text=True, capture_output=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert not BAD.search(text), f"{cmd}\n{text[-4000:]}"
    if "--cfg" in argv:
        printed = "actor_rollout_ref:" in proc.stdout or "launcher:" in proc.stdout
        assert proc.returncode == 0 and printed, text[-3000:]
        return
    if prints:  # a help page, and no run folder
        assert proc.returncode == 0 and re.search(r"Config(uration)? groups", proc.stdout), text[-3000:]
        assert not (tmp_path / "outputs").exists()
        return
    if words[:2] == ["make", "fit"]:  # the fit writes fit.json and prints one command (or what would fit)
        assert proc.returncode in (0, 2) and (tmp_path / "run" / "fit.json").is_file(), text[-3000:]
        assert "The command:" in text or "nothing fits" in text.lower(), text[-3000:]
        return
    if "hydra/launcher=slurm" in argv:  # no sbatch here: refused, with the #SBATCH lines it would have sent
        assert proc.returncode == 2 and "#SBATCH --gpus-per-node=" in text, text[-3000:]
        return
    assert proc.returncode in (0, 2, NOT_READY_EXIT), text[-3000:]  # 3: planned, not ready on this machine
    jobs = sorted((tmp_path / "sweep").glob("job*")) if "-m" in argv else [tmp_path / "run"]
    assert jobs, text[-3000:]
    for job in jobs:
        _assert_reached_preflight(job, text)


def test_a_run_name_that_is_no_safe_folder_name_is_refused_before_a_folder_is_made(tmp_path):
    """experiment_name names the run's folder: `my run/1` would nest it and split `make report RUN=...` (issue 28,
    item 6). Typed, swept or from the environment: refused with the safe spelling, and no folder made."""
    for args, env, says in ((["experiment_name=my run/1"], {}, "Write experiment_name=my_run_1 instead"),
                            (["-m", "experiment_name=ok,a b"], {}, "Write experiment_name=a_b instead"),
                            ([], {"EXPERIMENT_NAME": "x/../y"}, "Write EXPERIMENT_NAME=x_.._y instead")):
        proc = run_py(*args, "preflight.only=true", env=env, cwd=tmp_path)
        assert proc.returncode == 2 and says in proc.stderr, (args, env, proc.stderr[-2000:])
        assert "names the run's folders" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_help_is_grpo_labs_own_page_made_from_conf(tmp_path):
    """`python run.py --help` (issue 28, item 7): conf/'s groups and options as they are on disk, the one this command
    picks marked, not verl's groups; the short keys, sweeps, the preflight, the make targets, the reward's columns;
    under 120 lines, no run folder. Hydra's own help stays behind --hydra-help."""
    from grpo_lab.cli.knobs import KNOBS
    from grpo_lab.cli.overrides import verl_groups

    proc = run_py("model=qwen3_4b", "--help", cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0 and len(out.splitlines()) < 120, out
    block = out.split("Config groups (")[1].split("\n\n")[0].splitlines()[1:]
    texts: dict[str, str] = {}
    for line in block:
        group, sep, rest = line.strip().partition(": ")
        if sep and not line.startswith("    "):
            texts[group] = rest.strip()
        else:  # a wrapped line
            texts[list(texts)[-1]] += " " + line.strip()
    listed = {g: t.split(" (")[0].split(", ") for g, t in texts.items()}  # less "(none chosen)" and the like
    on_disk = {}
    for f in CONF.rglob("*.yaml"):
        group = f.parent.relative_to(CONF).as_posix()
        if group not in (".", "hydra/help"):
            on_disk.setdefault(group, []).append(f.stem)
    assert {g: sorted(o.lstrip("*") for o in opts) for g, opts in listed.items()} == \
        {g: sorted(o) for g, o in on_disk.items()}
    assert "*qwen3_4b" in listed["model"] and "*rtx4080x4" in listed["hardware"] and "*grpo" in listed["variant"]
    assert not set(listed) & (set(verl_groups()) - set(on_disk))  # actor, critic, ...: verl's, not picked here
    for knob in KNOBS:
        assert re.search(rf"^  {knob.key} +{re.escape(knob.verl_key)}$", out, re.M), knob
    for said in ("python run.py -m ", "preflight.only=true", "make plan ARGS=", "make fit ARGS=", "make report RUN=",
                 "make doctor LOG=", "data_source", "data.reward_fn_key", "reward_model.ground_truth", "--hydra-help"):
        assert said in out, said
    assert not (tmp_path / "outputs").exists()
    hydra = run_py("--hydra-help", cwd=tmp_path)
    assert hydra.returncode == 0 and "== Flags ==" in hydra.stdout and "hydra/launcher:" in hydra.stdout


# ---- mistakes: refused before composing, with the closest name (issue 10 items 1, 7, 9) ----

@pytest.mark.parametrize("args,says", [
    (["rollout_gpu_mem_utils=0.5"], "did you mean 'rollout_gpu_mem_util'"),
    (["rollout=tp2_mem6"], "did you mean 'rollout=tp2_mem06'"),
    (["model=hf_model"], "qwen3_1_7b"),
    (["experiment=null"], "no experiment is already the default"),
    (["actor_rollout_ref.actor.ppo_mini_batch=8"], "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"),
    (["+actor_rollout_ref.actor.ppo_mini_batch=8"], "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"),
    (["++actor_rollout_ref.actor.ppo_mini_batch=8"], "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"),
    (["+data.max_prompt_lenght=3"], "did you mean 'data.max_prompt_length'"),
    (["preflight.onlly=true"], "did you mean 'preflight.only'"),
    (["ROLLOUT_N=3"], "write rollout_n=3"),
    (["--cfg", "job", "-m", "rollout_n=4,8"], "-m/--multirun and --cfg cannot go together"),
])
def test_mistakes_are_refused_before_composing(args, says, tmp_path):
    proc = run_py(*args, f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing written


def test_rawcmd_refuses_the_same_way(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grpo_lab.launch.rawcmd", "rollout_gpu_mem_utils=0.5"], cwd=ROOT,
                          text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2 and "did you mean 'rollout_gpu_mem_util'" in proc.stderr
    assert run_py("rollout_gpu_mem_utils=0.5").stderr.strip() == proc.stderr.strip()
    proc = subprocess.run([sys.executable, "-m", "grpo_lab.launch.rawcmd", "--help"], cwd=ROOT, text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m grpo_lab.launch.rawcmd")


@pytest.mark.parametrize("args", [
    ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa"],
    ["+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=1"],
    ["+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"],
    ["+actor_rollout_ref.rollout.repetition_penalty=1.05"],  # a field of verl's RolloutConfig its YAML leaves out
])
def test_free_form_sections_still_take_new_keys(args, tmp_path):
    proc = run_py(*args, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---- run folders (item 10) ----

def test_two_runs_started_at_once_get_two_folders(tmp_path):
    argv = [sys.executable, str(ROOT / "run.py"), "preflight.only=true"]
    env = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME", "GRPO_LAB_CACHE_DIR")}
    procs = [subprocess.Popen(argv, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [NOT_READY_EXIT] * 2, outs  # planned: no data, no GPU here
    runs = sorted((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 2, (runs, outs)
    for run in runs:
        assert (run / "plan.json").is_file()
        # not appended to by the other run
        assert (run / "train.log").read_text().count("preflight: plan OK; not ready to launch here") == 1


def test_the_run_folder_resolver_names_without_making_when_told(tmp_path):
    from omegaconf import OmegaConf

    from grpo_lab.cli.config import use_run_dirs

    (tmp_path / "run").mkdir()
    cfg = OmegaConf.create({"a": f"${{lab_unique_dir:{tmp_path / 'run'}}}",
                            "b": f"${{lab_unique_dir:{tmp_path / 'new'}}}"})
    try:
        use_run_dirs(create=False)
        assert (cfg.a, cfg.b) == (f"{tmp_path / 'run'}_2", str(tmp_path / "new"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    finally:
        use_run_dirs(create=True)
    made = OmegaConf.create({"a": f"${{lab_unique_dir:{tmp_path / 'run'}}}"}).a
    assert made == f"{tmp_path / 'run'}_2" and (tmp_path / "run_2").is_dir()


def test_printing_the_config_makes_no_run_folder(tmp_path):
    """--cfg only prints: the run folder that hydra.run.dir names (lab_unique_dir) is not created."""
    proc = run_py("--cfg", "all", "--resolve", "experiment=smoke", cwd=tmp_path)
    assert proc.returncode == 0 and "run:" in proc.stdout, proc.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()
