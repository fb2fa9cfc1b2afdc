"""Shared test helpers: compose grpo-lab's config the way run.py does, without launching anything."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"

# the tests' cache of verl's schema (grpo_lab/verl_schema/verl_cache.py), for the run.py subprocesses too: kept between
# runs (it is keyed by verl's version and config files), apart from the user's own
if not os.environ.get("GRPO_LAB_CACHE_DIR"):
    os.environ["GRPO_LAB_CACHE_DIR"] = str(ROOT / ".pytest_cache" / "grpo-lab")

# pytest-xdist's workers share the cores (make test: one a core): torch's OpenMP threads, in a worker and in the
# processes it starts, get the worker's share unless OMP_NUM_THREADS is set. One thread a core: the threads of two
# workers on one core spin waiting for each other (the CPU pass_bench runs, two at once on 2 cores: 20 s -> 12 s each)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
    from grpo_lab.facts import machine_cpus

    os.environ["OMP_NUM_THREADS"] = str(max(1, machine_cpus() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_configure(config):
    """Build the schema cache once, before pytest-xdist's workers start (else each builds it at once, ~5 s each)."""
    if not hasattr(config, "workerinput"):
        from grpo_lab.verl_schema.api import schema

        schema()


_INIT = None
_INIT_CONF = None


def compose_cfg(*overrides: str, environ: dict[str, str] | None = None, conf: Path = CONF):
    """The composed config (with `hydra` node, so ${hydra:runtime.cwd} resolves) for these command-line overrides,
    read and checked as run.py reads them (grpo_lab.cli.overrides), with the knobs of `environ` added; `conf`: the
    config folder (another checkout's, see fresh_clone)."""
    global _INIT, _INIT_CONF
    from grpo_lab.cli.overrides import check, parse

    cli = parse(list(overrides), environ or {}, flags=False)
    check(cli, conf)
    if _INIT is None or _INIT_CONF != conf or not GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
        _INIT = initialize_config_dir(config_dir=str(conf), version_base=None)
        _INIT.__enter__()  # kept for the session: Hydra caches the loaded YAML files between composes
        _INIT_CONF = conf
    cfg = compose("config", overrides=cli.argv, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def compose_split(*overrides: str, environ: dict[str, str] | None = None, conf: Path = CONF):
    """(verl dict, lab dict) as the launcher hands them on."""
    from grpo_lab.launch.prepare import split

    return split(compose_cfg(*overrides, environ=environ, conf=conf))


@functools.cache
def _composed_no_files(*overrides: str):
    return compose_split(*overrides, "train_file=/nonexistent/train.parquet", "test_file=/nonexistent/test.parquet")


def composed(*overrides: str):
    """(verl, lab) plain dicts of a composed config with no data files; each call a fresh copy to edit."""
    verl, lab = _composed_no_files(*overrides)
    return copy.deepcopy(verl), copy.deepcopy(lab)


def run_module(module: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """python -m MODULE ARGS from the repository root, as the README and the Makefile run it; the finished process."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, text=True, capture_output=True,
                          timeout=timeout)


_HUB_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def run_py(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout: int = 120,
           root: Path = ROOT) -> subprocess.CompletedProcess:
    """python run.py ARGS as a user types it (run.py of the checkout at `root`); returns the finished process."""
    # the knobs and the hub's offline switches only as the test gives them: a value left in this process's environment
    # (grpo_lab.tasks.smollm2.main and qwen3_random.main set HF_HUB_OFFLINE for their own run) must not change a plan
    full_env = {k: v for k, v in os.environ.items() if k not in _KNOB_ENV and k not in _HUB_OFFLINE}
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(root / "run.py"), *args], cwd=cwd, env=full_env, text=True,
                          capture_output=True, timeout=timeout)


def fresh_clone(dest: Path) -> Path:
    """A copy of the checkout's code and config at `dest`, as a fresh clone has them: nothing under data/."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("run.py", "Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("conf", "grpo_lab", "hydra_plugins"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "benchmarks" / "gpu").mkdir(parents=True)
    for name in ("memplan_calibration.json", "timeplan_calibration.json"):  # the plans' calibration tables
        shutil.copy2(ROOT / "benchmarks" / "gpu" / name, dest / "benchmarks" / "gpu" / name)
    (dest / "data").mkdir()
    return dest


NOT_READY_EXIT = 3  # run.py's exit code: a plan that holds but cannot start here (launch/outcome.py, docs/launch.md)


def planned(proc: subprocess.CompletedProcess) -> bool:
    """A plan (preflight.only=true) that passed, with its verdict and exit code agreeing: "preflight: OK" and 0 where
    the run could start on this machine, "preflight: plan OK; not ready to launch here" and 3 where this machine lacks
    something (the CPU test machine has no GPU). A refusal or a crash is not. A sweep's job lines carry the verdicts."""
    import re

    out = re.sub(r"^grpo-lab job\d+: ", "preflight: ", proc.stdout, flags=re.M)
    if proc.returncode == 0:
        return "\npreflight: OK" in out and "not ready to launch here" not in out
    return proc.returncode == NOT_READY_EXIT and "\npreflight: plan OK; not ready to launch here" in out \
        and "preflight: REFUSED" not in out


def fake_gpus(tmp_path: Path, n: int = 1) -> dict[str, str]:
    """Environment for run_py in which `nvidia-smi -L` lists n GPUs (an executable script first on PATH): where the
    machine has no NVIDIA driver, the preflight then counts n visible GPUs (grpo_lab/facts.py visible_gpus); and a
    GPU machine's vllm, an empty package on PYTHONPATH that find_spec finds (rule rollout_engine_missing)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-fake-{i})'\n" for i in range(n)))
    smi.chmod(0o755)
    (tmp_path / "fake-py" / "vllm").mkdir(parents=True, exist_ok=True)
    (tmp_path / "fake-py" / "vllm" / "__init__.py").write_text("")
    path = os.pathsep.join(p for p in (str(tmp_path / "fake-py"), os.environ.get("PYTHONPATH")) if p)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": path}


def model_folder(path: Path, option: str = "tiny_qwen3") -> Path:
    """A model folder whose config.json has the architecture of conf/model/<option>.yaml (what the planner reads) and
    an empty model.safetensors (a weights file is there: what the readiness check looks for)."""
    import json

    arch = load_yaml(CONF / "model" / f"{option}.yaml")["lab"]["model"]
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", **{k: arch[k] for k in keys if k in arch}}))
    (path / "model.safetensors").touch()
    return path


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


from grpo_lab.cli.knobs import ENV_NAMES as _KNOB_ENV  # noqa: E402
from grpo_lab.facts import load_yaml  # noqa: E402


def write_rows(path: Path, n: int) -> Path:
    """A GSM8K-format parquet of n rows."""
    import pandas as pd

    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture
def gsm8k_sized_parquet(tmp_path):
    """A GSM8K-format parquet of 7473 rows (GSM8K's train size), for arithmetic that reads the row count."""
    return write_rows(tmp_path / "train.parquet", 7473)


# ---- the `slow` marker (pyproject.toml): `make test-fast` runs pytest -m "not slow"; `make test` runs everything ----
# A test is slow when it starts a process (python run.py, python -m ..., make, a stand-in job): each costs ~1 s of
# Python, Hydra and grpo-lab start-up on a 2-core machine, several for a sweep. That is found from the code (a call of
# run_py, run_module, subprocess.* or os.system in the test, in a fixture it takes, or in a function of its module or of
# this file that it calls), so a new test of that kind is marked by itself. The others are listed here with the reason:
# a file, a test, or a fixture or helper of a file (then every test of the file that takes or calls it).
SLOW = {
    "test_launch.py::test_ray_is_shut_down_after_a_failed_or_interrupted_job": "starts a real Ray in the test process",
    "test_remove_padding.py": "builds a tiny Qwen3 in torch and runs verl's forward step on it",
    "test_memplan.py::test_gpu_benchmark_tiny_cpu_mode": "trains the tiny model a step with FSDP2 over gloo on CPU",
    "test_rawcmd.py::test_raw_command_round_trips": "composes verl's ppo_trainer from its ~40 files (no cache) per job",
    "test_verl_searchpath.py::test_cached_ppo_trainer_composes_the_identical_config":
        "composes verl's ppo_trainer from its files (no cache) per case",
    "test_fit.py::test_every_model_on_every_hardware_fits_or_says_what_would":
        "the fit search for every model on every hardware (48 cases)",
    "test_knobs.py::test_short_key_verl_key_and_environment_give_the_same_verl_config":
        "composes every knob three ways (short key, verl key, environment)",
    "test_compose.py::test_verl_accepts_model_x_variant": "composes every model x variant (test_every_option_composes "
                                                          "stays in the fast set)",
    "test_compose.py::test_verl_accepts_hardware_x_rollout": "composes every hardware x rollout",
    "test_verl_cache.py::built": "builds verl's schema in a child process that imports verl (~5 s)",
    "test_verl_cache.py::test_rebuilt_when_verls_version_or_a_config_file_changes":
        "builds verl's schema three times, each in a child process that imports verl",
    "test_verl_cache.py::test_a_verl_file_that_sets_hydras_node_is_not_served_to_hydra":
        "builds verl's schema in a child process that imports verl",
}


@functools.cache
def _functions(path: str) -> dict:
    """The module-level functions of the Python file at `path`, by name (ast.FunctionDef); read once a file (this one
    for every test module)."""
    import ast

    return {n.name: n for n in ast.parse(Path(path).read_text()).body if isinstance(n, ast.FunctionDef)}


def _reaching(funcs: dict, seeds: set[str]) -> frozenset[str]:
    """The names in `funcs` that are in `seeds` or call one of `funcs` that is, or take it as a fixture (an argument of
    that name), at any depth."""
    import ast

    uses = {}
    for name, fn in funcs.items():
        called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
                  for n in ast.walk(fn) if isinstance(n, ast.Call)}
        uses[name] = (called | {a.arg for a in fn.args.args}) & funcs.keys()
    out = set(seeds)
    while True:
        more = {n for n, u in uses.items() if n not in out and u & out}
        if not more:
            return frozenset(out)
        out |= more


def _starts_a_process(fn) -> bool:
    import ast

    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id in ("run_py", "run_module"):
                return True
            if isinstance(f, ast.Attribute) and (f.attr == "system" or isinstance(f.value, ast.Name)
                                                 and f.value.id == "subprocess"):
                return True
    return False


@functools.cache
def _process_starters(path: str) -> frozenset[str]:
    """Names of the functions of the test module at `path` (and of this file) that start a process: directly, through
    another of them they call, or through a fixture of theirs they take."""
    funcs = {**_functions(__file__), **_functions(path)}
    return _reaching(funcs, {name for name, fn in funcs.items() if _starts_a_process(fn)})


@functools.cache
def _listed_helpers(path: str) -> dict[str, str]:
    """Test name -> reason, for the tests of the module at `path` that take or call a fixture or helper SLOW lists."""
    file, funcs = Path(path).name, _functions(path)
    out = {}
    for key, reason in SLOW.items():
        helper = key.partition("::")[2]
        if key.startswith(f"{file}::") and not helper.startswith("test_"):
            out.update((n, reason) for n in _reaching(funcs, {helper}) if n.startswith("test_") and n not in out)
    return out


def slow_reason(item) -> str | None:
    """Why `item` is in the slow set, or None."""
    file, name = item.path.name, item.originalname
    for key in (f"{file}::{name}", file):
        if key in SLOW:
            return SLOW[key]
    if name in _listed_helpers(str(item.path)):
        return _listed_helpers(str(item.path))[name]
    if name in _process_starters(str(item.path)):
        return "starts a process (run.py, python -m, make or a stand-in job)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = slow_reason(item)
        if reason:
            item.add_marker(pytest.mark.slow(reason=reason))


# ---- pytest-xdist (make test: -n auto --dist loadgroup) ----
# The tests that share a module-scoped fixture of their file (one model built, one job refused) go to one worker, so
# the fixture is made once, not once per worker; every other test is scheduled on its own. pytest-xdist 3.8 groups by
# xdist_group marks only through node ids, which pytest 9.2 no longer lets it change (pytest-dev/pytest-xdist#1386):
# the grouping is done here, in the scheduler, from the test files' code.

@functools.cache
def _module_fixture_users(path: str) -> frozenset[str]:
    """Names of the tests of the module at `path` that take one of its module-scoped fixtures (at any depth)."""
    import ast

    funcs = _functions(path)
    shared = {name for name, fn in funcs.items() for d in fn.decorator_list
              if isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "fixture"
              and any(k.arg == "scope" and getattr(k.value, "value", None) == "module" for k in d.keywords)}
    return frozenset(n for n in _reaching(funcs, shared) if n.startswith("test_"))


def work_unit(nodeid: str, root: Path = ROOT) -> str:
    """The scheduling unit of a test: its file where it takes a module-scoped fixture, else the test itself (an
    xdist_group mark's name, where pytest-xdist could add it to the node id)."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[-1]
    file, _, rest = nodeid.partition("::")
    path = root / file
    if rest and path.suffix == ".py" and path.is_file() and rest.split("[")[0] in _module_fixture_users(str(path)):
        return file
    return nodeid


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it installed, plain pytest still runs
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, Path(str(config.rootpath)))

    return ModuleFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    """`python -m grpo_lab.tasks.tiny --out DIR` as `make tiny` runs it, once a session: (DIR, seconds, stdout)."""
    import time

    out = tmp_path_factory.mktemp("tiny")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grpo_lab.tasks.tiny", "--out", str(out)], cwd=ROOT, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                               "TRANSFORMERS_OFFLINE": "1"})
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    return out, seconds, proc.stdout
