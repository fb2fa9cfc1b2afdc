"""A run whose engine died ends (grpo_lab/launch/fatal.py): the fatal lines of vLLM / SGLang / Ray, read from RECORDED
logs of the GPU test machine; the watcher that stops verl's job on them; and a STAND-IN job through run.py (verl's own
driver and Ray, only its TaskRunner replaced) that prints the recorded lines of a dead vLLM worker and then hangs: it
ends within 30 s, status.json says failed with the doctor's diagnosis, the exit code is not 0, no process is left."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, write_rows

from grpo_lab.after_run import doctor
from grpo_lab.after_run.doctor import verdict
from grpo_lab.after_run.doctor.signatures import fatal_line
from grpo_lab.launch import fatal

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDED = FIXTURES / "recorded"
# RECORDED (GPU test machine, 2026-12-03): a LoRA job's vLLM worker fails add_lora, then verl waits, silent
LORA = RECORDED / "verl-0.9.1_h200_smollm2_lora-safetensors_add-lora-stopiteration.errors.txt"
# RECORDED (2026-12-02): vLLM's worker and engine core fail to start (No module named 'flashinfer')
FLASHINFER = RECORDED / "verl-0.9.1_h200_tiny-qwen3_vllm-no-flashinfer.log"
RESULTS = ROOT / "benchmarks" / "gpu" / "results"


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").split("\n")


def _lora_lines() -> list[str]:
    """The recorded LoRA lines as the job's train.log had them: the grep's line number and the recorder's elapsed
    seconds dropped (what the stand-in prints too)."""
    return [re.sub(r"^\d+:\s+[\d.]+ ", "", ln) for ln in _lines(LORA) if ln]


def _flashinfer_block() -> list[str]:
    """The vLLMHttpServer's lines of the recorded engine start failure: two WARNINGs, then the worker and engine
    core tracebacks (the driver's own traceback below them is left out: in the stand-in nothing raises)."""
    lines = _lines(FLASHINFER)
    first = next(i for i, s in enumerate(lines) if "[arg_utils.py:" in s and "WARNING" in s)
    last = max(i for i, s in enumerate(lines) if s.startswith("(vLLMHttpServer pid=8211) (EngineCore pid=8482)"))
    return lines[first:last + 1]


# ---- which lines are fatal ---------------------------------------------------------------------------------------

def test_the_recorded_fatal_lines_are_fatal():
    lora = [ln for ln in _lora_lines() if fatal_line(ln)]
    assert len(lora) == 1 and lora[0].endswith("[multiproc_executor.py:1000] StopIteration")
    hits = [fatal_line(ln)[1] for ln in _flashinfer_block() if fatal_line(ln)]
    assert hits[0] == "a vLLM worker process failed" and "vLLM's engine failed to start" in hits
    driver = next(ln for ln in _lines(FLASHINFER) if ln.startswith("RuntimeError: Engine core initialization"))
    assert fatal_line(driver) == ("engine_died", "vLLM's engine failed to start")
    # texts of vLLM 0.24, SGLang and Ray 2.60 in their own log format
    for line in ["(vLLMHttpServer pid=1) (EngineCore pid=2) ERROR 12-03 10:18:02 [core.py:1052] EngineCore encountered "
                 "a fatal error.",
                 "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
                 "for the root cause.",
                 "ray.exceptions.RayTaskError(EngineDeadError): ray::TaskRunnerV1.run() (pid=20101, ip=192.0.2.2)",
                 "(EngineCore pid=2) ERROR 12-03 10:18:02 [core.py:1052] RuntimeError: Worker failed with error 'CUDA "
                 "out of memory.', please check the stack trace above for the root cause",
                 "(EngineCore pid=2) ERROR 12-03 10:18:02 [multiproc_executor.py:140] Worker proc VllmWorker-0 died "
                 "unexpectedly, shutting down executor.",
                 "(SGLangHttpServer pid=3) [2026-02-27 15:27:13] Received sigquit from a child process. It usually "
                 "means the child failed.",
                 "(SGLangHttpServer pid=3) [2026-02-27 15:27:13 TP0] Scheduler hit an exception: Traceback ...",
                 "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
                 "ray::reward_loop_worker_0:RewardLoopWorker.__init__()"]:
        assert fatal_line(line), line


@pytest.mark.parametrize("line", [
    "(vLLMHttpServer pid=8211) WARNING 12-02 11:25:31 [arg_utils.py:2476] This model does not officially support "
    "disabling chunked prefill. Disabling this manually may cause the engine to crash or produce incorrect outputs.",
    "(vLLMHttpServer pid=1) (Worker pid=2) ERROR 12-03 16:45:35 [multiproc_executor.py:1000] WorkerProc hit an "
    "exception.",  # alone: the traceback's last line decides
    "(vLLMHttpServer pid=1) (Worker pid=2) ERROR 12-03 16:45:35 [multiproc_executor.py:1000]   File \"/x/vllm/a.py\", "
    "line 3, in f",
    "(vLLMHttpServer pid=1) INFO 12-03 16:45:35 [core.py:344] init engine (profile, create kv cache, warmup model) "
    "took 3.53 s",
    "ray.exceptions.ActorUnavailableError: The actor is temporarily unavailable: ",  # Ray retries it
    "(raylet) A worker died or was killed while executing a task by an unexpected system error.",  # a task: retried
    "grpo-lab: the last run printed 'EngineCore encountered a fatal error.' once",  # quoted, not said
    "/root/site/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available: "
    "ModuleNotFoundError(\"No module named 'torchtitan'\")",
    "step:3 - actor/entropy:1.02 - critic/score/mean:0.0",
], ids=["warning", "worker-hit-alone", "frame", "info", "actor-unavailable", "task-worker-died", "quoted",
        "userwarning", "step"])
def test_warnings_and_recoverable_lines_are_not_fatal(line):
    assert fatal_line(line) is None


def test_no_fatal_line_in_the_recorded_runs_that_ended_by_themselves():
    """Every recorded run of the GPU test machine that finished, hung on Ray CPUs or raised in verl's driver: none
    has a line the watcher would stop a job on (the flashinfer log has: its engine died, and verl raised)."""
    logs = [p for p in sorted(RECORDED.glob("*.log")) if p != FLASHINFER] + sorted(RESULTS.glob("**/train.log"))
    # jobs whose vLLM engine failed to start beside other jobs (results/2026-12-03-qwen3-random): their engines died
    # and verl raised, so a fatal line is right there
    died = [p for p in logs if "side_by_side_failures" in p.parts]
    logs = [p for p in logs if p not in died]
    assert len(logs) >= 10 and len(died) == 2
    for log in logs:
        assert not [ln for ln in _lines(log) if fatal_line(ln)], log
    for log in died:
        assert [ln for ln in _lines(log) if fatal_line(ln)], log


def test_the_doctor_reads_the_recorded_lora_failure_as_a_dead_engine():
    """It used to read it as a stalled start-up and suggest num_cpus and NCCL_P2P_DISABLE (diagnosis.json of the
    recorded LoRA job); now its own signature names the cause (an empty adapter under FSDP1 with peft >= 0.21) and
    the fix; a fatal line that no signature knows is read as a dead engine with its root exception."""
    (d,) = verdict.diagnose("\n".join(_lora_lines()))
    assert d.id == "lora_empty_adapter" and d.overrides == ["actor_rollout_ref.actor.strategy=fsdp2"]
    assert "StopIteration" in d.title
    (g,) = verdict.diagnose("\n".join(ln.replace("_create_merged_loras_inplace", "_some_other_call")
                                       .replace("first_lora: LoRALayerWeights = next(iter(", "x = f((")
                                       for ln in _lora_lines()))
    assert g.id == "engine_died" and g.overrides == [] and g.phase == "generation"
    assert g.title.startswith("a vLLM worker's call raised: StopIteration")
    # a known signature still wins: the flashinfer failure keeps its own diagnosis and fix
    assert [x.id for x in verdict.diagnose("\n".join(_flashinfer_block()))] == ["vllm_no_flashinfer"]


def test_the_doctor_reads_a_dead_ray_actor_as_such():
    """A Ray actor of verl's that died of an error no signature knows (here the reward worker's constructor): named
    as a dead actor with its root exception and frame, nothing suggested, no generation phase (it is no engine)."""
    text = ("(TaskRunnerV1 pid=3) step:1 - a:1\n"
            "(RewardLoopWorker pid=7) Traceback (most recent call last):\n"
            '(RewardLoopWorker pid=7)   File "/root/site/verl/experimental/reward_loop/worker.py", line 41, in '
            "__init__\n"
            "(RewardLoopWorker pid=7)     self.tokenizer = load(path)\n"
            "(RewardLoopWorker pid=7) OSError: /models/missing does not appear to have a file named config.json\n"
            "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
            "ray::reward_loop_worker_0:RewardLoopWorker.__init__()\n")
    (d,) = verdict.diagnose(text)
    assert d.id == "ray_actor_died" and d.overrides == [] and d.phase is None and d.line == 6
    assert d.title == ("a Ray actor of verl's died: OSError: /models/missing does not appear to have a file named "
                       "config.json (/root/site/verl/experimental/reward_loop/worker.py:41 in __init__)")
    assert "restarts neither its rollout engine nor its Ray actors" in d.remedy
    assert doctor.failure_class([d]) == "other failure"


# ---- the watcher on a growing log (no Ray) -----------------------------------------------------------------------

def _watch(tmp_path, **kw):
    log = tmp_path / "train.log"
    log.write_text("grpo-lab preflight: tiny_qwen3 on h200x1, variant grpo\n")
    stopped: list[float] = []
    out: list[str] = []
    w = fatal.FatalWatch(log, stop=lambda: stopped.append(time.time()), interval_s=0.1, out=out.append,
                         doctor=doctor, **kw)
    return log, w, stopped, out


def test_the_watcher_stops_a_job_that_hangs_after_a_fatal_line(tmp_path):
    log, w, stopped, out = _watch(tmp_path, grace_s=0.5, kill_wait_s=0.5)
    w._job_thread = -1  # not the main thread: no SIGINT to the test runner
    w.start()
    with log.open("a") as f:
        f.write("(TaskRunnerV1 pid=7) step:1 - a:1\n")
        f.flush()
        time.sleep(0.3)
        assert w.fired is None
        f.writelines(ln + "\n" for ln in _lora_lines())
    t = time.time()
    deadline = t + 10
    while not stopped and time.time() < deadline:
        time.sleep(0.05)
    w.stop()
    assert stopped and 0.4 <= stopped[0] - t < 5, (stopped, t)
    assert w.fired.label == "a vLLM worker's call raised" and w.fired.line == "StopIteration"
    assert w.fired.line_no == 2 + len(_lora_lines())  # its line in train.log
    assert "doctor: [lora_empty_adapter] LoRA weight sync failed" in w.fired.message
    assert any("the job is stopped in 0.5 s unless it ends first" in o for o in out)


def test_the_watcher_leaves_a_job_that_ends_by_itself(tmp_path):
    log, w, stopped, _ = _watch(tmp_path, grace_s=1.0)
    w.start()
    with log.open("a") as f:
        f.write("\n".join(_flashinfer_block()) + "\n")
    deadline = time.time() + 5
    while w.fired is None and time.time() < deadline:
        time.sleep(0.05)
    assert w.fired is not None
    w.job_done()  # verl raised its own error within the grace time
    time.sleep(1.5)
    w.stop()
    assert stopped == [] and w.fired.message == ""


# ---- a stand-in job through run.py -------------------------------------------------------------------------------

TINY_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2,
              "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "intermediate_size": 128, "vocab_size": 4096, "tie_word_embeddings": True,
              "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ray_processes(tmp: str) -> list[str]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if tmp in cmd:
            out.append(f"{p.info['pid']}: {cmd[:200]}")
    return out


@pytest.mark.parametrize("recorded,expected", [("lora", "lora_empty_adapter"), ("flashinfer", "vllm_no_flashinfer")])
def test_a_stand_in_job_whose_engine_died_ends_within_30_s(tmp_path, recorded, expected):
    """verl's driver waits on a TaskRunner whose vLLM server printed the recorded lines of a dead worker and hangs.
    run.py ends within 30 s of the lines, exit code not 0, status.json failed with the doctor's diagnosis, and no
    process of the job is left (the TaskRunner, the server, its engine-core child, Ray's own)."""
    lines = tmp_path / "lines.txt"
    if recorded == "lora":
        shutil.copyfile(LORA, lines)
    else:
        lines.write_text("\n".join(_flashinfer_block()) + "\n")
    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_QWEN3))
    (tmp_path / "model" / "model.safetensors").touch()  # weights are there (the stand-in engine reads none)
    write_rows(tmp_path / "train.parquet", 64)
    write_rows(tmp_path / "test.parquet", 8)
    job = tmp_path / "job"
    ray_tmp = tempfile.mkdtemp(prefix="gl-ray-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0")
    try:
        proc = subprocess.Popen(
            [sys.executable, str(FIXTURES / "standin_engine_death.py"), str(lines), str(pids), "--",
             "experiment=smoke_tiny", "hardware=h200x1", f"model_path={tmp_path / 'model'}",
             f"train_file={tmp_path / 'train.parquet'}", f"test_file={tmp_path / 'test.parquet'}",
             f"hydra.run.dir={job}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=lambda: setattr(proc, "text", proc.stdout.read()), daemon=True)
        reader.start()
        deadline = time.time() + 300  # Ray's start on a busy 2-core machine; ENDS_WITHIN_S counts from the lines
        while not (pids / "printed").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert (pids / "printed").exists(), "the stand-in never printed its lines"
        printed = float((pids / "printed").read_text())
        try:
            rc = proc.wait(timeout=max(1.0, printed + 60 - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the job did not end within 60 s of the fatal lines")
        ended = time.time()
        reader.join(10)
        text = getattr(proc, "text", "")
        assert rc != 0, text[-3000:]
        assert ended - printed < fatal.ENDS_WITHIN_S, (ended - printed, text[-3000:])
        status = json.loads((job / "status.json").read_text())
        assert status["status"] == "failed" and status["exit"] == 1
        assert status["error"].startswith("EngineDied: ") and "so grpo-lab stopped the job" in status["error"]
        assert [d["id"] for d in status["diagnosis"]] == [expected]
        assert f"doctor: [{expected}]" in status["error"]
        assert "killed by `ray.kill`" not in text  # the user reads why, not how
        for name in ("runner.pid", "server.pid", "engine_core.pid"):
            pid = int((pids / name).read_text())
            deadline = time.time() + 10
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.2)
            assert not _alive(pid), f"{name} {pid} left running"
        deadline = time.time() + 10
        while _ray_processes(ray_tmp) and time.time() < deadline:
            time.sleep(0.2)
        assert _ray_processes(ray_tmp) == []
        if expected == "vllm_no_flashinfer":  # hardware=h200x1 sets VLLM_USE_FLASHINFER_SAMPLER=0: not suggested again
            assert status["diagnosis"][0]["overrides"] == []
            assert "already sets VLLM_USE_FLASHINFER_SAMPLER=0" in status["diagnosis"][0]["remedy"]
        assert re.search(r"grpo-lab: .* the job is stopped in 5 s unless it ends first", text)
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
