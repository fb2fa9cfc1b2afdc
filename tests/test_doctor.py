"""The failure doctor on recorded verl 0.9.1 logs (H200) and synthetic logs built from real error texts; a check that
every registered signature id is exercised by a doctor test, and that the ids the doctor's code gives are the ids
registered (with the matcher that gives them)."""

from __future__ import annotations

import ast
import gzip
import importlib
import importlib.util
import inspect
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from grpo_lab.after_run import doctor
from grpo_lab.after_run.doctor import command, verdict
from grpo_lab.after_run.doctor.signatures import SIGNATURES
from grpo_lab.facts import load_yaml
from grpo_lab.labconf import Lab

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("grpo_lab_fixtures_synth", FIXTURES / "synth.py")
synth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth)

SYN = FIXTURES / "synthetic"
ROOT = Path(__file__).resolve().parent.parent
# the tests that run the doctor
DOCTOR_TESTS = ("test_doctor.py", "test_fatal.py", "test_preflight_reward.py", "test_refusals.py")


def ids(text: str, **kw) -> list[str]:
    return [d.id for d in verdict.diagnose(text, **kw)]


def one(path: Path, **kw) -> doctor.Diagnosis:
    ds = verdict.diagnose(path.read_text(), **kw)
    assert len(ds) == 1, [d.id for d in ds]
    return ds[0]


# ---------------------------------------------------------------------------------------------------------------------
# the registry of signatures (grpo_lab/registry.py's shape, as the preflight's rules)


def test_every_signature_id_has_a_test():
    text = "".join((ROOT / "tests" / name).read_text() for name in DOCTOR_TESTS)
    untested = [s for s in SIGNATURES if f'"{s}"' not in text]
    assert untested == []


def _id_values(node: ast.expr, module) -> set[str]:
    """The strings a Diagnosis's id= can be: a literal, a module constant, either branch of `a if x else b`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return {getattr(module, node.id)}
    if isinstance(node, ast.IfExp):
        return _id_values(node.body, module) | _id_values(node.orelse, module)
    raise AssertionError(f"{module.__name__}: a Diagnosis id this test cannot read: {ast.unparse(node)}")


def _ids_given(module) -> dict[str, set[str]]:
    """Top-level function -> the Diagnosis ids it builds, itself or through the module's functions it calls."""
    tree = ast.parse(inspect.getsource(module))
    own: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "signature":  # its first= matchers' ids: at their @s
            continue
        own[fn.name], calls[fn.name] = set(), set()
        for d in fn.decorator_list:  # @signature(id, first=pattern): the Diagnosis of that id is built around fn's
            if isinstance(d, ast.Call) and any(k.arg == "first" for k in d.keywords):
                own[fn.name] |= _id_values(d.args[0], module)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                calls[fn.name].add(node.func.id)
                if node.func.id == "Diagnosis":
                    (value,) = [k.value for k in node.keywords if k.arg == "id"]
                    own[fn.name] |= _id_values(value, module)
    given = {}
    for name in own:
        seen, todo = set(), [name]
        while todo:
            f = todo.pop()
            if f not in seen and f in own:
                seen.add(f)
                todo += calls[f]
        given[name] = set().union(*(own[f] for f in seen))
    return given


def test_the_ids_the_doctor_gives_are_registered_with_their_matchers():
    """Each matcher is registered under exactly the ids its code builds; every other id the doctor builds (where the
    log stopped, a dead engine, a refusal, no log) is registered too, and every registered id is built somewhere."""
    built: set[str] = set()
    for name in ("logread", "signatures", "stops", "verdict", "watchdog", "command"):
        module = importlib.import_module(f"grpo_lab.after_run.doctor.{name}")
        given = _ids_given(module)
        built |= set().union(*given.values())
        for entry in SIGNATURES.values():
            if entry.matcher is not None and entry.matcher.__module__ == module.__name__:
                registered = {s.id for s in SIGNATURES.values() if s.matcher is entry.matcher}
                assert given[entry.matcher.__name__] == registered, entry.matcher.__name__
    assert built == set(SIGNATURES)


# ---------------------------------------------------------------------------------------------------------------------
# recorded logs (verl 0.9.1 + vLLM 0.24.0 + Ray 2.60.0 on an H200)


def test_recorded_silent_hang_is_the_cpu_budget():
    d = one(synth.RECORDED_HANG_LOG)
    assert d.id == "ray_cpu_budget_hang"
    # the log's own numbers: num_cpus 8, 1 GPU, 8 storage units: 3 + 1 + 1 + 8 = 13
    assert "ray_kwargs.ray_init.num_cpus=13" in d.overrides
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units=3" in d.overrides
    assert "= 13" in d.remedy and "given 8" in d.remedy
    assert "after the config print" in d.remedy
    assert d.phase is None


def test_recorded_flashinfer_start_failure():
    d = one(synth.RECORDED_FLASHINFER_LOG)
    assert d.id == "vllm_no_flashinfer"
    assert d.overrides == ['++ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_FLASHINFER_SAMPLER="0"']
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in d.remedy
    assert "No module named 'flashinfer'" in d.evidence
    # verl's harmless engine warnings (ModuleNotFoundError("No module named 'torchtitan'")) are not errors
    assert "torchtitan" not in d.evidence



def test_recorded_lora_empty_adapter():
    """RECORDED excerpt (GPU test machine, 2026-12-03): LoRA with FSDP1 and layered_summon=false on one H200; vLLM's
    add_lora got an adapter with no LoRA weights."""
    d = one(synth.RECORDED_LORA_EMPTY_LOG)
    assert d.id == "lora_empty_adapter"
    assert d.overrides == ["actor_rollout_ref.actor.strategy=fsdp2"]
    assert "_create_merged_loras_inplace" in d.evidence and "lora_fsdp1_adapter" in d.remedy

LORA_JOB = (Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "results"
            / "2026-12-03-smollm2-variants-lora" / "lora" / "lora_safetensors")


def test_recorded_lora_one_gpu_failure_read_from_status_json(tmp_path):
    """RECORDED job folder (GPU test machine, 2026-12-03): LoRA + layered_summon on one H200 failed at the first weight
    sync. Its train.log ends before the error (the driver caught it after the tee ended); status.json holds it."""
    assert "not supported yet" not in (LORA_JOB / "train.log").read_text()
    _, ds = doctor.diagnose_path(LORA_JOB)
    assert [d.id for d in ds] == ["lora_fsdp_no_shard"]
    assert ds[0].overrides == ["actor_rollout_ref.actor.strategy=fsdp2"]
    assert "offload_to_cpu=True and NO_SHARD is not supported yet" in ds[0].evidence
    # without status.json's error the same log reads as a silent stop: the fallback is what finds it
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.log").write_text((LORA_JOB / "train.log").read_text())
    (job / "status.json").write_text(json.dumps({"status": "failed", "error": None}))
    assert [d.id for d in doctor.diagnose_path(job)[1]] == ["stopped_without_error"]


def test_the_start_up_time_it_quotes_is_a_recorded_one(tmp_path):
    """The stopped-before-the-first-step remedy quotes vLLM's start-up from a recorded file, which says so."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.log").write_text((LORA_JOB / "train.log").read_text())
    (job / "status.json").write_text(json.dumps({"status": "failed", "error": None}))
    (d,) = doctor.diagnose_path(job)[1]
    assert d.id == "stopped_without_error" and "before the first step" in d.title
    cited = re.search(r"\((benchmarks/gpu/results/\S+?)\)", d.remedy).group(1)
    root = Path(__file__).resolve().parent.parent
    phases = dict(re.findall(r"^(\S.*?\S)\s+([0-9.]+)$", (root / cited).read_text(), re.M))
    server = float(phases["vLLM server serving"])
    assert f"{server - float(phases['vLLM server process up']):.0f} s from its server process" in d.remedy
    assert f"{server - float(phases['actor+ref initialized']):.0f} s after the actor was ready" in d.remedy


def test_recorded_good_run_has_no_finding():
    # it ends with "DataLoader worker ... is killed by signal: Killed" after the run finished: harmless
    assert verdict.diagnose(synth.RECORDED_3STEPS_LOG.read_text()) == []


def test_recorded_killed_run_is_not_called_an_error():
    d = one(synth.RECORDED_LEGACY_LOG)
    assert d.id == "stopped_without_error"
    assert "step 1" in d.title
    assert doctor.failure_class([d]) == "other failure"


# ---------------------------------------------------------------------------------------------------------------------
# CUDA out of memory: the phase decides the remedy


TRAINING_ONLY = ("ppo_max_token_len_per_gpu=",)
GENERATION_ONLY = ("rollout_gpu_mem_util=",)


@pytest.fixture(scope="module")
def q4b(tmp_path_factory) -> Path:
    """The job folder `python run.py experiment=qwen3_4b_gsm8k preflight.only=true` writes (verl_config.yaml,
    .hydra/config.yaml, plan.json): the composed config and the memory plan of the guide's 4B run."""
    from conftest import run_py

    job = tmp_path_factory.mktemp("q4b") / "job"
    made = run_py("experiment=qwen3_4b_gsm8k", "preflight.only=true", f"hydra.run.dir={job}")
    assert (job / "verl_config.yaml").exists(), made.stdout + made.stderr
    return job


def q4b_job(q4b: Path, dest: Path, log: Path, **changes) -> Path:
    """A failed copy of that job with this log for train.log and verl_config.yaml's values changed (dotted keys)."""
    from grpo_lab.verl_keys import with_value

    shutil.copytree(q4b, dest)
    verl = load_yaml(dest / "verl_config.yaml")
    for key, value in changes.items():
        verl = with_value(verl, key, value)
    (dest / "verl_config.yaml").write_text(yaml.safe_dump(verl))
    shutil.copyfile(log, dest / "train.log")
    (dest / "status.json").write_text(json.dumps({"status": "failed", "error": None}))
    return dest


def make_doctor(job: Path) -> str:
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "doctor", f"LOG={job}", f"PY={sys.executable}"],
                          text=True, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    return made.stdout


def _has(overrides: list[str], needle: str) -> bool:
    return any(needle in o for o in overrides)


def test_training_oom_gets_training_remedies_only(q4b, tmp_path):
    _, (d,) = doctor.diagnose_path(q4b_job(q4b, tmp_path / "t", SYN / "oom_training_update_actor.log"))
    assert (d.id, d.phase) == ("oom_training", "training")
    assert "Tried to allocate 2.32 GiB" in d.evidence
    for needle in TRAINING_ONLY:
        assert _has(d.overrides, needle), d.overrides
    for needle in GENERATION_ONLY:
        assert not _has(d.overrides, needle), d.overrides
    assert doctor.failure_class([d]) == "OOM in training"


def test_generation_oom_gets_generation_remedies_only(q4b, tmp_path):
    _, (d,) = doctor.diagnose_path(q4b_job(q4b, tmp_path / "g", SYN / "oom_generation_vllm_sampler.log"))
    assert (d.id, d.phase) == ("oom_generation", "generation")
    for needle in GENERATION_ONLY:
        assert _has(d.overrides, needle), d.overrides
    for needle in TRAINING_ONLY:
        assert not _has(d.overrides, needle), d.overrides
    assert doctor.failure_class([d]) == "OOM in generation"


def test_make_doctor_advises_for_a_training_oom_only_what_the_plan_says_lowers_training(q4b, tmp_path):
    """Issue 43: a training-phase OOM (update_actor -> loss.backward) of experiment=qwen3_4b_gsm8k was told to lower
    vLLM's share and offload Adam's state, with which the job's own memory plan keeps training at 24.17 GB; only a
    smaller token budget (22.73 GB) or LoRA lowers it. The job's 16,384-token budget is quoted, not a default 3,000."""
    out = make_doctor(q4b_job(q4b, tmp_path / "oom", SYN / "oom_training_update_actor.log"))
    assert "[oom_training]" in out and "training phase at 24.17 GB per GPU of 32 GB (fits)" in out, out
    assert "- ppo_max_token_len_per_gpu=8192 -> 22.73 GB (fits)" in out
    assert "try: python run.py ... ppo_max_token_len_per_gpu=8192\n" in out + "\n"
    assert "rollout_gpu_mem_util" not in out and "optimizer_offload" not in out and "3000" not in out


def test_make_doctor_says_so_where_the_job_has_no_plan(tmp_path):
    """A log without the job's config or card: no memory plan, so no override is invented."""
    job = synth.write_job(tmp_path / "bare", log=SYN / "oom_training_update_actor.log", status="failed")
    out = make_doctor(job)
    assert "[oom_training]" in out and "No memory plan for this job" in out and "try:" not in out, out


OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
            "31.36 GiB of which 812.00 MiB is free.")


def test_phase_from_frames_without_process_prefix():
    # the same error text; only the frames above it differ (no Ray prefix names the process)
    gen = ("Traceback (most recent call last):\n"
           '  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2201, in '
           "execute_model\n"
           "    logits = self.model.compute_logits(sample_hidden_states)\n"
           '  File "/usr/lib/python3.12/site-packages/torch/nn/functional.py", line 2380, in linear\n'
           f"{OOM_LINE}\n")
    train = ("Traceback (most recent call last):\n"
             '  File "/usr/lib/python3.12/site-packages/verl/workers/engine/fsdp/transformer_impl.py", line 767, in '
             "forward_backward_batch\n    loss.backward()\n"
             '  File "/usr/lib/python3.12/site-packages/torch/nn/functional.py", line 2380, in linear\n'
             f"{OOM_LINE}\n")
    assert [(d.id, d.phase) for d in verdict.diagnose(gen)] == [("oom_generation", "generation")]
    assert [(d.id, d.phase) for d in verdict.diagnose(train)] == [("oom_training", "training")]
    # no frame at all: said so, with a memory override, not guessed
    assert ids(OOM_LINE) == ["oom_unknown_phase"]


def test_log_prob_pass_oom_is_training_with_entropy_hint():
    text = ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_ref_compute_log_prob() "
            "(pid=1, ip=192.0.2.2)\n"
            '  File "/root/site/verl/workers/engine_workers.py", line 704, in compute_log_prob\n'
            "    output = self.actor.infer_batch(data)\n"
            '  File "/root/site/verl/utils/torch_functional.py", line 148, in entropy_from_logits\n'
            f"{OOM_LINE}\n")
    (d,) = verdict.diagnose(text)
    assert (d.id, d.phase) == ("oom_training", "training")
    assert "entropy_from_logits_with_chunking" in d.remedy


def test_oom_values_come_from_the_jobs_config(q4b, tmp_path):
    A = "actor_rollout_ref."
    gen = SYN / "oom_generation_vllm_sampler.log"
    _, (d,) = doctor.diagnose_path(q4b_job(q4b, tmp_path / "u5", gen, **{A + "rollout.gpu_memory_utilization": 0.5}))
    assert "generation phase at 31.40 GB" in d.remedy and d.overrides == ["rollout_gpu_mem_util=0.3"]
    train = SYN / "oom_training_update_actor.log"
    job = q4b_job(q4b, tmp_path / "t8k", train, **{A + "actor.ppo_max_token_len_per_gpu": 8192})
    _, (d,) = doctor.diagnose_path(job)
    assert "training phase at 22.73 GB" in d.remedy and not _has(d.overrides, "ppo_max_token_len_per_gpu")


def test_a_fix_never_raises_vllms_share(q4b, tmp_path):
    job = q4b_job(q4b, tmp_path / "u1", SYN / "oom_generation_vllm_sampler.log",
                  **{"actor_rollout_ref.rollout.gpu_memory_utilization": 0.1})
    _, (gen,) = doctor.diagnose_path(job)
    assert gen.overrides and not _has(gen.overrides, "rollout_gpu_mem_util")


EMU_OOM = ROOT / "benchmarks/gpu/results/2026-12-04-qwen3-random/side_by_side/emu_oom"


def test_recorded_emulated_oom_gets_fixes_in_the_users_terms(tmp_path):
    """Recorded on the GPU test machine (2026-12-04): Qwen3-1.7B's smoke on an emulated 32 GB card ran out of memory
    at the per-process cap. verl got vLLM's share scaled to the real card (0.091559); the user set 0.4 of the 32 GB
    card, so the fix lowers 0.4, it never suggests 0.1 (a raise of what verl got)."""
    _, (d,) = doctor.diagnose_path(EMU_OOM)
    assert d.id == "oom_training" and "of 32 GB" in d.remedy
    assert "0.091559" not in d.remedy and not _has(d.overrides, "rollout_gpu_mem_util")
    # the same log without the plan's emulation record reads verl's scaled value, and lowers nothing below 0.1
    job = tmp_path / "emu_oom"
    job.mkdir()
    for name in ("train.log", "verl_config.yaml", "status.json"):
        (job / name).write_bytes((EMU_OOM / name).read_bytes())
    _, (d,) = doctor.diagnose_path(job)
    assert not any(o.startswith("rollout_gpu_mem_util=") for o in d.overrides)


def test_vllm_kv_cache_is_generation_with_its_own_remedy(q4b, tmp_path):
    d = one(SYN / "vllm_no_kv_cache_memory.log", config=synth.verl_config())
    assert (d.id, d.phase) == ("vllm_kv_cache_too_small", "generation")
    assert "rollout_gpu_mem_util=0.5" in d.overrides  # a larger vLLM share, not a smaller one
    assert doctor.failure_class([d]) == "OOM in generation"
    assert not _has(one(SYN / "vllm_no_kv_cache_memory.log").overrides, "rollout_gpu_mem_util")  # its util unknown
    log = tmp_path / "free.log"
    log.write_text("ray init kwargs: {'num_cpus': 16}\nValueError: Free memory on device cuda:0 (7.34/31.36 GiB) on "
                   "startup is less than desired GPU memory utilization (0.4, 12.54 GiB). Decrease GPU memory "
                   "utilization or reduce GPU memory used by other processes.\n")
    _, (d,) = doctor.diagnose_path(q4b_job(q4b, tmp_path / "free", log))
    assert d.id == "vllm_startup_free_memory" and "rollout_gpu_mem_util=0.3" in d.overrides


# ---------------------------------------------------------------------------------------------------------------------
# the rest of the guide's table and the other known signatures


IMA, FA2 = "cuda_illegal_memory_access_generation.log", "flash_attn2_not_installed.log"
P2P_OFF = '++ray_kwargs.ray_init.runtime_env.env_vars.NCCL_P2P_DISABLE="1"'


@pytest.mark.parametrize("name, expected_id, override", [
    ("ray_unable_to_register_worker.log", "ray_register_worker", "ray_kwargs.ray_init.num_cpus=16"),
    (IMA, "illegal_memory_access", "actor_rollout_ref.rollout.enforce_eager=true"),
    ("nccl_init_hang_rtx4080.log", "nccl_hang", P2P_OFF),
    ("triton_compile_module_from_src.log", "triton_compile", "actor_rollout_ref.actor.use_torch_compile=false"),
    (FA2, "flash_attn_import", "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"),
    ("ray_env_var_not_string.log", "ray_env_var_type", P2P_OFF),
])
def test_synthetic_signature(name, expected_id, override):
    cfg = synth.verl_config()
    cfg["ray_kwargs"]["ray_init"]["num_cpus"] = None  # Ray takes every core: 4 GPUs and 2 storage units need 16
    d = one(SYN / name, config=cfg)
    assert d.id == expected_id
    assert override in d.overrides, d.overrides
    assert d.evidence and d.line


def test_make_doctor_on_an_nccl_timeout_of_a_job_with_p2p_off_does_not_suggest_it(q4b, tmp_path):
    """Issue 43: the 4B job's verl_config.yaml has NCCL_P2P_DISABLE '1' (hardware=rtx4080x4): its NCCL watchdog
    timeout is not told to set it again, and is told that P2P is off already."""
    log = tmp_path / "nccl.log"
    head = (SYN / "nccl_init_hang_rtx4080.log").read_text().split("^C")[0]
    log.write_text(head + "(WorkerDict pid=20456) [rank1]:[E1203 11:02:03.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] "
                   "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
                   "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before "
                   "timing out.\n")
    assert "NCCL_P2P_DISABLE: '1'" in (q4b / "verl_config.yaml").read_text()
    out = make_doctor(q4b_job(q4b, tmp_path / "nccl", log))
    assert "[nccl_hang]" in out and "P2P is already off in this job" in out, out
    assert "NCCL_P2P_DISABLE=\"1\"" not in out and "NCCL_DEBUG=\"INFO\"" in out


CTRL_C = FIXTURES / "recorded" / "grpo-lab_ctrl-c-in-reward-probe.train.log"


def test_make_doctor_calls_ctrl_c_in_the_reward_probe_a_stop_by_the_user(q4b, tmp_path):
    """Issue 43: Ctrl+C while the preflight's reward probe ran (recorded) was read as a start-up hang, with num_cpus=16
    and NCCL_P2P_DISABLE, both already in the job's config; it is a stop by the user, with nothing to change."""
    job = q4b_job(q4b, tmp_path / "ctrl_c", CTRL_C)
    (job / "status.json").write_text(json.dumps({"status": "failed", "error": "KeyboardInterrupt: "}))
    out = make_doctor(job)
    assert "[stopped_by_user] Stopped by the user (Ctrl+C) before the first step" in out, out
    assert "reward_probe.py:122 in _run_child" in out
    assert "try:" not in out and "num_cpus" not in out and "NCCL" not in out
    from conftest import run_module

    data = json.loads(run_module("grpo_lab.after_run.doctor", job, "--json").stdout)
    assert [(d["id"], d["overrides"]) for d in data] == [("stopped_by_user", [])]


def test_nccl_hang_evidence_is_where_it_stopped_not_the_ctrl_c():
    d = one(SYN / "nccl_init_hang_rtx4080.log")
    assert d.id == "nccl_hang" and "NCCL version" in d.evidence and "at initialisation" in d.title


def test_illegal_memory_access_in_generation_points_to_vllm():
    d = one(SYN / "cuda_illegal_memory_access_generation.log")
    assert (d.id, d.phase) == ("illegal_memory_access", "generation") and "vLLM's troubleshooting" in d.remedy


def test_triton_error_mentions_the_compiler():
    d = one(SYN / "triton_compile_module_from_src.log")
    assert d.id == "triton_compile" and "C compiler" in d.remedy


def test_nccl_timeout_and_older_flash_attn_text():
    nccl = ("[rank1]:[E1203 11:02:03.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) "
            "ran for 600081 milliseconds before timing out.")
    assert ids(nccl) == ["nccl_hang"]
    fa2_4x = ("ImportError: FlashAttention2 has been toggled on, but it cannot be used due to the following error: the "
              "package flash_attn seems to be not installed. Please refer to the documentation of "
              "https://huggingface.co/docs/transformers/perf_infer_gpu_one#flashattention-2 to install Flash "
              "Attention 2.")
    assert ids(fa2_4x) == ["flash_attn_import"]
    # the monkey-patch notice every verl run prints is not an import error
    assert ids("(WorkerDict pid=1) Monkey patch _flash_attention_forward in transformers.integrations.flash_attention\n"
               "step:1 - a:1\nFinal validation metrics: None") == []


def test_hydra_new_key_and_host_ram():
    text = ("Could not override 'actor_rollout_ref.model.override_config.attn_implementation'.\n"
            "To append to your config use +actor_rollout_ref.model.override_config.attn_implementation=sdpa\n"
            "Key 'attn_implementation' is not in struct")
    (d,) = verdict.diagnose(text)
    assert d.id == "hydra_new_key"
    assert d.overrides == ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa"]
    killed = ("step:1 - a:1\n"
              "(TaskRunnerV1 pid=3) RuntimeError: DataLoader worker (pid 19058) is killed by signal: Killed.")
    assert ids(killed) == ["host_ram_oom"]


def _config_keys() -> tuple[dict, set[str]]:
    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    verl = load_yaml(Path(verl_config_dir()) / "_generated_ppo_trainer.yaml")
    ours = load_yaml(Path(__file__).resolve().parent.parent / "conf" / "config.yaml")
    return verl, set(ours)


MISSING = object()


def _walk(cfg: dict, path: list[str]):
    cur = cfg
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return MISSING
        cur = cur[k]
    return cur


def test_every_override_names_a_real_key(q4b):
    verl, short = _config_keys()
    texts = [p.read_text() for p in sorted(FIXTURES.glob("*/*.log"))]
    overrides = {o for t in texts for d in verdict.diagnose(t) for o in d.overrides}
    job = verdict.job_run(load_yaml(q4b / "verl_config.yaml"),
                          Lab.of(load_yaml(q4b / ".hydra" / "config.yaml")["lab"]), {})
    overrides |= {o for phase in ("training", "generation", "weight_sync")
                  for r in doctor.phase_remedies(job, phase)[1] for o in r["override"].split()}
    assert len(overrides) >= 12
    for o in overrides:
        key = o.split("=", 1)[0]
        bare = key.lstrip("+")
        parts = bare.split(".")
        if key.startswith("++"):
            # ++ adds or overrides; runtime_env is in verl's ray_init (main_ppo merges it into ray.init's)
            assert bare.startswith("ray_kwargs.ray_init.runtime_env.env_vars."), o
            assert _walk(verl, ["ray_kwargs", "ray_init", "runtime_env"]) is not MISSING
        elif key.startswith("+"):
            assert isinstance(_walk(verl, parts[:-1]), dict), o
            assert _walk(verl, parts) is MISSING, f"{o}: + on an existing key fails in Hydra"
        elif len(parts) == 1:
            assert bare in short, f"{o}: not a grpo-lab knob"
        else:
            assert _walk(verl, parts) is not MISSING, f"{o}: not in verl's config"
    # the brief's key: use_torch_compile really is in verl's actor config
    assert _walk(verl, ["actor_rollout_ref", "actor", "use_torch_compile"]) is True
    assert _walk(verl, ["data", "apply_chat_template_kwargs"]) == {}  # the report's thinking-off advice


# ---------------------------------------------------------------------------------------------------------------------
# running jobs, files, CLI, watchdog


def test_running_log_is_not_a_hang_until_stale():
    head = "\n".join(synth.RECORDED_HANG_LOG.read_text().split("\n")[:945])  # up to the end of the config print
    assert "SIGTERM" not in head
    assert verdict.diagnose(head, idle_s=30, stale_minutes=10) == []
    assert ids(head, idle_s=1200, stale_minutes=10) == ["ray_cpu_budget_hang"]
    assert ids(head) == ["ray_cpu_budget_hang"]  # no idle time given: the log is complete


RAISED_IN_VERL = """Traceback (most recent call last):
  File "/home/me/grpo-lab/run.py", line 38, in job
    return serve_ray_worker(cfg) or launch_job(cfg, cli)
  File "/home/me/.venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 100, in run_ppo
    ray.get(runner.run.remote(config))
ray.exceptions.RayTaskError(ValueError): ray::TaskRunnerV1.run() (pid=10090, ip=10.0.0.7, actor_id=5f0c)
  File "/home/me/.venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 152, in run
    self.trainer = trainer_cls(config=config)
  File "/home/me/.venv/lib/python3.11/site-packages/verl/trainer/ppo/v1/trainer_base.py", line 196, in \
_resolve_filter_groups_metric
    raise ValueError("algorithm.filter_groups.metric must be set when group filtering is enabled")
ValueError: algorithm.filter_groups.metric must be set when group filtering is enabled
"""


def test_a_log_that_ends_in_an_exception_is_named_not_called_a_hang():
    """After verl's config print, a log that ends in a traceback crashed: the exception and its frame, never the
    silent hang's Ray CPU / NCCL advice (which the same head gets when nothing follows it)."""
    head = "\n".join(synth.RECORDED_HANG_LOG.read_text().split("\n")[:945])
    assert ids(head) == ["ray_cpu_budget_hang"]
    (d,) = verdict.diagnose(head + "\n" + RAISED_IN_VERL, idle_s=5)  # a raised job is over however fresh its log
    assert d.id == "job_raised" and d.overrides == [] and d.evidence.startswith("ValueError: algorithm.filter_groups")
    assert "verl/trainer/ppo/v1/trainer_base.py:196 in _resolve_filter_groups_metric" in d.title
    assert "num_cpus" not in d.format() and "NCCL_P2P_DISABLE" not in d.format()
    # Ctrl+C's traceback is a kill: the hang reading stands
    assert ids(head + "\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\nKeyboardInterrupt\n") \
        == ["ray_cpu_budget_hang"]


def test_make_doctor_names_the_drivers_exception(tmp_path):
    """grpo-lab's own train.log of `python run.py max_response_length=abc` before that value was refused (an
    OmegaConf traceback from the driver): make doctor names the exception and the frame that raised it."""
    log = tmp_path / "train.log"
    log.write_text((SYN / "driver_interpolation_error.log").read_text())
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "doctor", f"LOG={log}", f"PY={sys.executable}"],
                          text=True, capture_output=True, timeout=60)
    out = made.stdout
    assert "[job_raised] The job raised omegaconf.errors.InterpolationResolutionError" in out, out + made.stderr
    assert "grpo_lab/__init__.py:10 in <lambda>" in out and "full_key" not in out.split("\n")[1]
    assert "Stopped before the first step" not in out and "num_cpus" not in out and "try:" not in out


def test_make_doctor_calls_a_job_stopped_by_sigterm_a_stop_not_the_error_its_cleanup_raised(tmp_path):
    """A recorded job stopped by SIGTERM in its second step (results/2026-12-06-h100-preset-guide): Ray's handler
    raised SystemExit: 15 and ray.shutdown() then a BrokenPipeError from its progress bar; the stop is the finding."""
    log = tmp_path / "train.log"
    with gzip.open(ROOT / "benchmarks/gpu/results/2026-12-06-h100-preset-guide/p17_guide/train.log.gz", "rt") as f:
        log.write_text(f.read())
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "doctor", f"LOG={log}", f"PY={sys.executable}"],
                          text=True, capture_output=True, timeout=60)
    out = made.stdout
    assert "[stopped_without_error] Stopped after step 1 with no error" in out, out + made.stderr
    assert "then nothing until it was killed" in out and "seconds to fall asleep" in out.split("\n")[2]
    assert "BrokenPipeError" not in out and "job_raised" not in out


VERL_LORA_EXAMPLE = ROOT / "benchmarks" / "gpu" / "results" / "2026-12-06-h100" / "lora_fsdp1.tgz"


def test_make_doctor_on_verls_own_lora_settings_on_one_gpu(tmp_path):
    """RECORDED (GPU test machine, 2026-12-06, one H100): verl's LoRA example settings (FSDP1, layered_summon=True,
    safetensors) on Qwen3-0.6B through raw verl. Its layered summon found no adapter tensors (the traceback is in the
    fallback's `with summon_ctx:`) and the fallback hit NO_SHARD: make doctor names that and the FSDP2 fix."""
    import tarfile

    with tarfile.open(VERL_LORA_EXAMPLE) as tar:
        tar.extractall(tmp_path, filter="data")
    log = tmp_path / "lora_fsdp1.log"
    text = log.read_text()
    assert "actor_rollout_ref.rollout.layered_summon=true" in (tmp_path / "lora_fsdp1_args.txt").read_text()
    assert "in collect_lora_params" in text and "with summon_ctx:" in text  # fsdp_utils.py's empty-adapter fallback
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "doctor", f"LOG={log}", f"PY={sys.executable}"],
                          text=True, capture_output=True, timeout=60)
    out = made.stdout
    assert "[lora_fsdp_no_shard]" in out and "actor_rollout_ref.actor.strategy=fsdp2" in out, out + made.stderr
    assert "Stopped before the first step" not in out


def test_diagnose_job_dir_uses_verl_config(q4b, tmp_path):
    job = q4b_job(q4b, tmp_path / "job0", SYN / "oom_generation_vllm_sampler.log",
                  **{"actor_rollout_ref.rollout.gpu_memory_utilization": 0.35})
    log_path, found = doctor.diagnose_path(job)
    text = doctor.format_diagnoses(found, str(log_path))  # what the launcher prints when a job fails
    assert "oom_generation" in text and "generation phase at 26.24 GB" in text
    ds = doctor.write_diagnosis(job)
    saved = json.loads((job / "diagnosis.json").read_text())
    assert [d["id"] for d in saved["diagnoses"]] == [d.id for d in ds] == ["oom_generation"]


def test_finished_job_is_not_called_a_hang(tmp_path):
    # status ok: no "Final validation metrics" line is needed to believe it finished
    job = synth.write_job(tmp_path / "ok", log="ray init kwargs: {'num_cpus': 8}\nstep:1 - a:1\n", status="ok")
    assert doctor.diagnose_path(job)[1] == []
    job = synth.write_job(tmp_path / "failed", log="ray init kwargs: {'num_cpus': 8}\nstep:1 - a:1\n",
                          status="failed")
    assert [d.id for d in doctor.diagnose_path(job)[1]] == ["stopped_without_error"]


def test_huge_log_keeps_head_and_tail(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("HEAD\n" + "x" * 200 + "\nTAIL\n")
    text = doctor.read_log(log, limit=100)
    assert text.startswith("HEAD") and text.rstrip().endswith("TAIL") and len(text) <= 101
    assert doctor.read_log(tmp_path / "missing.log") == ""


def test_cli(capsys, tmp_path):
    assert command.main([str(synth.RECORDED_HANG_LOG)]) == 0
    out = capsys.readouterr().out
    assert "ray_cpu_budget_hang" in out and "ray_kwargs.ray_init.num_cpus=13" in out
    assert command.main([str(SYN / "flash_attn2_not_installed.log"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["id"] == "flash_attn_import"
    assert command.main([str(tmp_path / "missing.log")]) == 2


def test_watchdog_message(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(synth.RECORDED_HANG_LOG.read_text().split("*** SIGTERM")[0])
    wd = doctor.ProgressWatchdog(log, stale_minutes=5, out=lambda s: None)
    wd._tail.from_end()  # what start() does, without its thread
    t0 = time.time()
    wd._last_progress = t0
    assert wd.check(now=t0 + 60) is None  # not stale yet
    msg = wd.check(now=t0 + 15 * 60)
    assert msg and "no progress for 15 minutes" in msg and "no step finished yet" in msg
    assert "ray_kwargs.ray_init.num_cpus=13" in msg and "NCCL_P2P_DISABLE=1" in msg


def test_watchdog_counts_real_lines_not_noise(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("ray init kwargs: {'num_cpus': 8}\n")
    seen: list[str] = []
    wd = doctor.ProgressWatchdog(log, stale_minutes=1, out=seen.append)
    wd._tail.from_end()  # what start() does, without its thread
    t0 = 1000.0
    wd._last_progress = t0
    with log.open("a") as f:  # Ray's autoscaler repeating itself is not progress
        f.write("(autoscaler +1m) Warning: The following resource request cannot be scheduled right now: "
                "{'CPU': 1.0}.\n")
    assert wd.check(now=t0 + 30) is None
    assert wd.check(now=t0 + 61) is not None and len(seen) == 1
    assert wd.check(now=t0 + 200) is None and len(seen) == 1  # once
    wd2 = doctor.ProgressWatchdog(log, stale_minutes=1, out=seen.append)
    wd2._tail.from_end()
    wd2._last_progress = t0
    with log.open("a") as f:
        f.write("(TaskRunnerV1 pid=1) step:1 - critic/score/mean:0.1\n")
    assert wd2.check(now=t0 + 61) is None  # a real line moved the clock
    assert wd2._last_progress == t0 + 61


def test_watchdog_thread_warns_once_and_stops(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("(TaskRunnerV1 pid=1) NCCL version 2.28.9+cuda13.0\n")
    seen: list[str] = []
    wd = doctor.ProgressWatchdog(log, stale_minutes=0.002, interval_s=0.02, out=seen.append).start()
    deadline = time.time() + 5
    while not seen and time.time() < deadline:
        time.sleep(0.02)
    wd.stop()
    assert len(seen) == 1 and "no progress" in seen[0]
    assert not any(t.name == "grpo-lab-watchdog" for t in threading.enumerate())
    wd = doctor.ProgressWatchdog(log, stale_minutes=60, interval_s=0.01, out=seen.append).start()
    time.sleep(0.05)
    wd.stop()
    assert len(seen) == 1
    assert not any(t.name == "grpo-lab-watchdog" for t in threading.enumerate())


def test_a_running_status_whose_process_is_gone_is_told_apart():
    gone = synth.gone_process()
    text = doctor.gone_running({"status": "running", **gone})
    assert text and f"pid {gone['pid']}" in text and "gone without writing an end" in text
    # this process is alive; another host cannot be checked; an ended job or an older status.json has nothing to say
    assert doctor.gone_running({"status": "running", **synth.live_process()}) is None
    # a live pid that started well after the job did is another process now: the job's is gone
    reused = doctor.gone_running({"status": "running", **synth.live_process(), "started": "2020-01-01T00:00:00"})
    assert reused and "the pid now belongs to a later process" in reused
    assert doctor.gone_running({"status": "running", "host": "another-node", "pid": gone["pid"]}) is None
    assert doctor.gone_running({"status": "failed", **gone}) is None
    assert doctor.gone_running({"status": "running"}) is None


# ---------------------------------------------------------------------------------------------------------------------
# only logs it recognises (grpo_lab/loglines.py)

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "results"


def test_a_file_that_is_no_log_is_said_so_and_nothing_suggested(tmp_path):
    """`make doctor LOG=/etc/hostname` read a made-up stalled start-up into it (num_cpus, NCCL_P2P_DISABLE): a file with
    none of the lines verl, Ray or run.py print says so, suggests nothing and exits 2."""
    from conftest import ROOT, run_module

    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\nmilk\neggs\n")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    for f, first in ((notes, "first line: shopping list"), (empty, "(empty file)")):
        out = run_module("grpo_lab.after_run.doctor", f)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{f} is not a verl or grpo-lab log" in out.stdout and first in out.stdout
        assert "try:" not in out.stdout and "num_cpus" not in out.stdout and "NCCL" not in out.stdout
        data = json.loads(run_module("grpo_lab.after_run.doctor", f, "--json").stdout)
        assert [(d["id"], d["overrides"]) for d in data] == [("not_a_log", [])]
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "doctor", f"LOG={notes}", f"PY={sys.executable}"],
                          text=True, capture_output=True, timeout=60)
    assert made.returncode != 0 and f"{notes} is not a verl or grpo-lab log" in made.stdout
    assert "try:" not in made.stdout


def test_every_recorded_and_synthetic_log_is_recognised():
    from grpo_lab import loglines

    logs = sorted(FIXTURES.glob("*/*.log")) + sorted(RESULTS.glob("**/train.log"))
    assert len(logs) > 15
    for f in logs:
        assert loglines.marker(f.read_text(errors="replace")), f
    # the recorder's elapsed-time prefix and colour codes do not hide them
    recorder = "   16.13 \x1b[36mray init kwargs: {'num_cpus': 16}\x1b[0m\n"
    assert loglines.marker(recorder) == "verl's `ray init kwargs` line"
    assert loglines.marker("Traceback (most recent call last):\nValueError: x\n") is None  # not verl's, not Ray's


def test_a_jobs_empty_train_log_is_still_its_log(tmp_path):
    """A grpo-lab job folder whose train.log is still empty (the job is starting) is read as before, not refused."""
    job = synth.write_job(tmp_path / "job", log="", status="running")
    assert doctor.diagnose_path(job)[1] == []


def test_a_refusal_without_a_rechecked_fix_suggests_nothing(tmp_path):
    """The preflight's "no single fix is known: ..." is words, not overrides: the doctor's refusal (and the sweep
    summary's line built from it) has nothing to try, not the words split into fake overrides."""
    plan = {"errors": [{"rule": "memory_training", "message": "training phase: predicted peak 40 GB",
                        "fix": "no single fix is known: rollout_n=2 still fails ([memory_training] ...)",
                        "checked": "re-checked: no single fix passes"}],
            "fix_all": {"overrides": "rollout_n=2 max_response_length=128", "passes": False}}
    job = synth.write_job(tmp_path / "job", log="grpo-lab preflight: x\n", status="failed", plan=plan,
                          error="1 problem(s) above; nothing was started (plan: plan.json).")
    (d,) = doctor.diagnose_path(job)[1]
    assert d.id == "preflight_refused" and d.overrides == [] and "try:" not in d.format()
    plan["errors"][0].update(fix="rollout_n=4", checked="re-checked: the preflight passes this rule with it")
    (job / "plan.json").write_text(json.dumps(plan))
    assert doctor.diagnose_path(job)[1][0].overrides == ["rollout_n=4"]
