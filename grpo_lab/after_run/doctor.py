"""The failure doctor: read a verl job's log and say what went wrong and which override to try.

    python -m grpo_lab.after_run.doctor LOGFILE          (make doctor LOG=outputs/runs/<job>/train.log)
    python -m grpo_lab.after_run.doctor JOB_DIR          (its train.log, with the job's verl_config.yaml for exact values)

`diagnose(text)` matches the guide's troubleshooting table (../shared/SPEC.md, "When things go wrong") and the
other known signatures of verl 0.9.1 + vLLM + Ray on small boxes. A CUDA out-of-memory is placed in its phase from
the traceback frames around it (vLLM's engine, sampler or KV cache: generation; the FSDP worker's update_actor,
backward, optimizer step or compute_log_prob: training), because the two phases have different remedies.
A log that stops without an error is read for where it stopped (the V1 trainer's silent hang after its config print
when Ray has too few CPUs, a stall at NCCL initialisation). Every diagnosis names the exact overrides to try, with
values computed from the job's own config when the log or verl_config.yaml has it.

`ProgressWatchdog(log_path).start()/.stop()` warns once when a running job's log shows no progress for N minutes.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import re
import shlex
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from grpo_lab import facts

from grpo_lab.after_run import logkind
from grpo_lab.cli.config import get as _get
from grpo_lab.launch.fatal import RAY, root_cause, strip
from grpo_lab.launch.fatal import fatal as fatal_line
from grpo_lab.launch.logtail import LogTail

# ---------------------------------------------------------------------------------------------------------------------
# the result


@dataclass
class Diagnosis:
    id: str
    title: str
    evidence: str
    remedy: str
    overrides: list[str] = field(default_factory=list)
    line: int | None = None  # 1-based line of the evidence in the log
    phase: str | None = None  # "training" | "generation" for memory and CUDA errors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        out = [f"[{self.id}] {self.title}", f"  evidence{where}: {self.evidence}"]
        out += ["  " + ln for ln in self.remedy.splitlines()]
        if self.overrides:
            out.append("  try: python run.py ... " + " ".join(shlex.quote(o) for o in self.overrides))
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------------
# reading a log

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ray's forwarded-output prefix, nested for vLLM's processes: "(vLLMHttpServer pid=8211) (Worker pid=8548) "
_RAY_PREFIX = re.compile(r"^(?:\((?:[\w.\-]+ )?pid=\d+(?:, ip=[\d.]+)?\) ?)+")
# vLLM's logger prefix: "ERROR 12-02 11:26:30 [multiproc_executor.py:898] "
_VLLM_PREFIX = re.compile(r"^(?:ERROR|WARNING|INFO|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.:\-]+\] ")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")
_STEP = re.compile(r"(?:^|\s)step:(\d+) - ")


@dataclass
class Log:
    raw: list[str]
    clean: list[str]  # prefixes stripped
    procs: list[str]  # the Ray prefix of each line ("" for the driver)

    @classmethod
    def of(cls, text: str) -> "Log":
        raw = _ANSI.sub("", text).replace("\r\n", "\n").split("\n")
        clean, procs = [], []
        for line in raw:
            m = _RAY_PREFIX.match(line)
            proc = m.group(0) if m else ""
            rest = line[len(proc):]
            rest = _VLLM_PREFIX.sub("", rest)
            rest = _RANK_PREFIX.sub("", rest)
            clean.append(rest)
            procs.append(proc)
        return cls(raw, clean, procs)

    def find(self, pattern: re.Pattern[str], start: int = 0) -> list[int]:
        return [i for i in range(start, len(self.clean)) if pattern.search(self.clean[i])]

    def first(self, pattern: re.Pattern[str]) -> int | None:
        for i, line in enumerate(self.clean):
            if pattern.search(line):
                return i
        return None

    def evidence(self, i: int) -> str:
        s = self.clean[i].strip()
        return s if len(s) <= 300 else s[:297] + "..."

    def steps(self) -> list[int]:
        out = []
        for line in self.clean:
            m = _STEP.search(line)
            if m:
                out.append(int(m.group(1)))
        return out


def printed_config(log: Log) -> dict[str, Any]:
    """The verl config the TaskRunner pretty-prints at start (a Python dict literal over many prefixed lines)."""
    start = next((i for i, s in enumerate(log.clean) if s.startswith("{'actor_rollout_ref'")), None)
    if start is None:
        return {}
    proc = log.procs[start]
    buf: list[str] = []
    depth = 0
    for i in range(start, min(len(log.clean), start + 5000)):
        if log.procs[i] != proc:
            continue  # another process's line in between
        s = log.clean[i]
        buf.append(s)
        depth += s.count("{") - s.count("}")
        if depth <= 0:
            break
    for sep in ("\n", ""):
        try:
            cfg = ast.literal_eval(sep.join(buf))
            return cfg if isinstance(cfg, dict) else {}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    return {}


def _ray_init_kwargs(log: Log) -> dict[str, Any]:
    i = log.first(re.compile(r"^ray init kwargs: \{"))
    if i is None:
        return {}
    try:
        d = ast.literal_eval(log.clean[i][len("ray init kwargs: "):].strip())
        return d if isinstance(d, dict) else {}
    except (ValueError, SyntaxError):
        return {}


# ---------------------------------------------------------------------------------------------------------------------
# overrides with values from the job's config


class Values:
    """The job's current values (verl config from verl_config.yaml or the log's config print; else the guide's)."""

    def __init__(self, cfg: dict[str, Any] | None, ray_init: dict[str, Any] | None = None) -> None:
        self.cfg = cfg or {}
        self.ray_init = ray_init or {}

    def num(self, path: str, default: float) -> float:
        v = _get(self.cfg, path)
        try:
            return float(v)
        except (TypeError, ValueError):
            return default

    @property
    def util(self) -> float:
        return self.num("actor_rollout_ref.rollout.gpu_memory_utilization", 0.4)

    @property
    def n(self) -> int:
        return int(self.num("actor_rollout_ref.rollout.n", 5))

    @property
    def max_prompt(self) -> int:
        return int(self.num("data.max_prompt_length", 512))

    @property
    def max_response(self) -> int:
        return int(self.num("data.max_response_length", 1024))

    @property
    def token_len(self) -> int:
        return int(self.num("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 3000))

    @property
    def dynamic_bsz(self) -> bool:
        return bool(_get(self.cfg, "actor_rollout_ref.actor.use_dynamic_bsz", True))

    @property
    def micro(self) -> int:
        return int(self.num("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 2))

    @property
    def gpus(self) -> int:
        return int(self.num("trainer.n_gpus_per_node", 4)) * max(1, int(self.num("trainer.nnodes", 1)))

    @property
    def storage_units(self) -> int:
        return int(self.num("transfer_queue.backend.SimpleStorage.num_data_storage_units", 8))

    @property
    def num_cpus(self) -> int | None:
        v = self.ray_init.get("num_cpus", _get(self.cfg, "ray_kwargs.ray_init.num_cpus"))
        try:
            return int(v)
        except (TypeError, ValueError):
            return None

    @property
    def use_v1(self) -> bool:
        return bool(_get(self.cfg, "trainer.use_v1", True))

    # --- the lowered values to try
    def lower_util(self) -> str:
        return f"rollout_gpu_mem_util={max(0.1, round(self.util - 0.1, 2)):g}"

    def lower_n(self) -> str | None:
        return f"rollout_n={self.n - 1}" if self.n > 2 else None

    def lower_response(self) -> str:
        return f"max_response_length={max(128, (self.max_response * 3 // 4) // 64 * 64)}"

    def lower_token_len(self) -> str | None:
        floor = self.max_prompt + self.max_response  # one whole sequence must fit a micro-batch
        new = max(floor, (self.token_len * 2 // 3) // 256 * 256)
        return f"ppo_max_token_len_per_gpu={new}" if new < self.token_len else None

    def lower_micro(self) -> str:
        return f"ppo_micro_batch_size_per_gpu={max(1, self.micro // 2)}"

    def cpus_needed(self) -> int:
        """Ray CPUs the job's placement groups need (grpo_lab.facts: 3 per GPU + TaskRunner + TQ controller + units)."""
        return facts.ray_cpus_needed(self.gpus, self.use_v1, self.storage_units)


def _env_override(name: str, value: str) -> str:
    """An environment variable for verl's Ray workers as a Hydra override (Ray wants a string: quoted)."""
    return f'++ray_kwargs.ray_init.runtime_env.env_vars.{name}="{value}"'


# ---------------------------------------------------------------------------------------------------------------------
# phase of a CUDA error: generation (vLLM) or training (FSDP worker)

_GEN_FRAME = re.compile(
    r"/vllm/|/sglang/|verl/workers/rollout/|verl/experimental/agent_loop|agent_loop|"
    r"in (?:generate_sequences|generate|wake_up|resume|_dummy_sampler_run|_dummy_run|sample|execute_model|"
    r"determine_available_memory|initialize_kv_cache|_initialize_kv_caches|profile_run|capture_model)\b"
)
_TRAIN_FRAME = re.compile(
    r"verl/workers/engine/|verl/workers/actor/|dp_actor\.py|fsdp_workers\.py|engine_workers\.py|"
    r"torch/autograd/|torch/optim/|torch/distributed/fsdp/|torch/_tensor\.py.*backward|"
    r"in (?:update_actor|update_policy|train_mini_batch|train_batch|forward_backward_batch|backward|optimizer_step|"
    r"compute_log_prob|compute_ref_log_prob|infer_batch|entropy_from_logits|_forward_micro_batch|"
    r"logprobs_from_logits)\b"
)
_GEN_HEADER = re.compile(r"ray::(?:vLLM\w*|\w*Rollout\w*|AgentLoop\w*|\w*LLMServer\w*)\.|generate_sequences\(\)|"
                         r"No available memory for the cache blocks|KV cache|EngineCore")
_TRAIN_HEADER = re.compile(r"ray::\w+\.(?:actor_rollout_ref_)?(?:update_actor|compute_log_prob|compute_ref_log_prob|"
                           r"ref_compute_ref_log_prob|update_policy)\(\)")
_GEN_PROC = re.compile(r"vLLM|EngineCore|LLMServer|SGLang|AgentLoop")
_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\)")


def _phase_at(log: Log, i: int, window: int = 200) -> str | None:
    """Which phase the error at line i happened in: the innermost recognisable traceback frame decides."""
    if _GEN_PROC.search(log.procs[i]):
        return "generation"
    for j in range(i - 1, max(-1, i - window), -1):
        s = log.clean[j]
        if s.lstrip().startswith("File ") or "ray::" in s:
            if _GEN_FRAME.search(s) or _GEN_HEADER.search(s):
                return "generation"
            if _TRAIN_FRAME.search(s) or _TRAIN_HEADER.search(s):
                return "training"
        if _TRACEBACK.search(s) and j < i - 1:
            # this traceback's frames are all above; a chained exception's are beyond the header: stop here
            break
    return None


# ---------------------------------------------------------------------------------------------------------------------
# signatures

_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|torch\.(?:cuda\.)?OutOfMemoryError|"
                  r"RayTaskError\(OutOfMemoryError\)")
_KV_NONE = re.compile(r"No available memory for the cache blocks|"
                      r"KV cache is needed, which is larger than the available KV cache memory")
_VLLM_FREE = re.compile(r"Free memory on device .* on startup is less than desired GPU memory utilization")
_RAYLET = re.compile(r"Unable to register worker with raylet")
_ILLEGAL = re.compile(r"an illegal memory access was encountered")
_NCCL = re.compile(r"Watchdog caught collective operation timeout|NCCL (?:communicator|operation).*time(?:d )?out|"
                   r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError")
_TRITON = re.compile(r"compile_module_from_src")
# transformers' own message (4.x and 5.x), or an exception line (not a warning that mentions one) naming flash_attn
_FA2 = re.compile(r"FlashAttention2 has been toggled on, but it cannot be used|"
                  r"^(?:ModuleNotFoundError: No module named 'flash_attn|ImportError: .*flash_attn)|"
                  r"flash_attn_2_cuda.*undefined symbol")
_RAY_ENV = re.compile(r"runtime_env\['env_vars'\] must be of type Dict\[str, str\]")
# the exception line, not verl's UserWarning repr ModuleNotFoundError("No module named ...")
_FLASHINFER = re.compile(r"ModuleNotFoundError: No module named 'flashinfer'")
_HYDRA_APPEND = re.compile(r"To append to your config use (\S+)")
_HOST_OOM = re.compile(r"ray\.exceptions\.OutOfMemoryError: Task was killed due to the node running low on memory|"
                       r"is killed by signal: Killed")
_END_MARKERS = re.compile(r"Final validation metrics|Training Progress: 100%")

_SIGNATURE_ORDER: list[Callable[[Log, Values], list[Diagnosis]]] = []


def _signature(fn: Callable[[Log, Values], list[Diagnosis]]) -> Callable[[Log, Values], list[Diagnosis]]:
    _SIGNATURE_ORDER.append(fn)
    return fn


def _keep(*items: str | None) -> list[str]:
    return [x for x in items if x]


def training_oom_overrides(v: Values) -> list[str]:
    first = v.lower_token_len() if v.dynamic_bsz else v.lower_micro()
    return _keep(first, v.lower_util(), "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")


def generation_oom_overrides(v: Values) -> list[str]:
    return _keep(v.lower_n(), v.lower_response(), v.lower_util())


def _training_oom(log: Log, i: int, v: Values) -> Diagnosis:
    context = " ".join(log.clean[max(0, i - 60):i])
    extra = ""
    overrides = training_oom_overrides(v)
    if re.search(r"compute_log_prob|compute_ref_log_prob|entropy_from_logits|infer_batch", context):
        extra = ("\nIt ran out in a log-prob pass (forward only, the ~152k-token vocabulary's logits): also lower "
                 "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu / ref.log_prob_max_token_len_per_gpu, "
                 "or compute the entropy in chunks (actor_rollout_ref.ref.entropy_from_logits_with_chunking=true, "
                 "actor_rollout_ref.actor.entropy_checkpointing=true).")
    which = (f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu (now {v.token_len})" if v.dynamic_bsz
             else f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (now {v.micro})")
    return Diagnosis(
        id="oom_training",
        title="CUDA out of memory in the training phase (FSDP actor update / log-prob pass)",
        evidence=log.evidence(i), line=i + 1, phase="training",
        remedy=("The actor's update ran out of GPU memory (weights + grads + Adam state + activations). "
                "In this order:\n"
                f"1. fewer tokens per micro-batch: {which};\n"
                f"2. leave more to training: lower rollout_gpu_mem_util (now {v.util:g}; vLLM keeps its share);\n"
                "3. Adam state to host RAM: actor_rollout_ref.actor.fsdp_config.optimizer_offload=true "
                "(slower, but fits; the guide's fix for Qwen3-4B on 32 GB cards)." + extra),
        overrides=overrides)


def _generation_oom(log: Log, i: int, v: Values) -> Diagnosis:
    return Diagnosis(
        id="oom_generation",
        title="CUDA out of memory in the generation phase (vLLM rollout)",
        evidence=log.evidence(i), line=i + 1, phase="generation",
        remedy=("vLLM ran out of memory while generating (KV cache, sampler logits over the vocabulary). Generate less "
                "at once:\n"
                f"1. fewer answers per prompt: rollout_n (now {v.n}; GRPO needs at least 2);\n"
                f"2. shorter answers: max_response_length (now {v.max_response});\n"
                f"3. a smaller vLLM share: rollout_gpu_mem_util (now {v.util:g}).\n"
                "Also possible: actor_rollout_ref.rollout.max_num_seqs (fewer sequences in flight)."),
        overrides=generation_oom_overrides(v))


@_signature
def _cuda_oom(log: Log, v: Values) -> list[Diagnosis]:
    hits = log.find(_OOM)
    if not hits:
        return []
    by_phase: dict[str | None, int] = {}
    for i in hits:
        phase = _phase_at(log, i)
        if phase not in by_phase:
            by_phase[phase] = i
        elif "Tried to allocate" in log.clean[i] and "Tried to allocate" not in log.clean[by_phase[phase]]:
            by_phase[phase] = i  # the line with the sizes says more
    out = []
    for phase, i in sorted(by_phase.items(), key=lambda kv: kv[1]):
        if phase == "training":
            out.append(_training_oom(log, i, v))
        elif phase == "generation":
            out.append(_generation_oom(log, i, v))
    if not out:  # no frame told the phase
        i = by_phase[None]
        out.append(Diagnosis(
            id="oom_unknown_phase",
            title="CUDA out of memory (phase not visible in the log)",
            evidence=log.evidence(i), line=i + 1,
            remedy=("The traceback does not show whether vLLM (generation) or the FSDP actor (training) ran out. "
                    "Watch `nvtop` / `watch -n 1 nvidia-smi` on the next run: memory moves between the phases. "
                    "Training phase: " + ", ".join(training_oom_overrides(v)) + ". Generation phase: "
                    + ", ".join(generation_oom_overrides(v)) + "."),
            overrides=_keep(v.lower_util())))
    return out


@_signature
def _kv_cache(log: Log, v: Values) -> list[Diagnosis]:
    out = []
    i = log.first(_KV_NONE)
    if i is not None:
        out.append(Diagnosis(
            id="vllm_kv_cache_too_small",
            title="vLLM has no memory left for its KV cache (generation phase, at engine start)",
            evidence=log.evidence(i), line=i + 1, phase="generation",
            remedy=(f"vLLM's share (gpu_memory_utilization {v.util:g} x the card) is used up by the model weights and "
                    "the profiling run, so no KV cache is left. Give vLLM a larger share if the training phase has "
                    "room (rollout_gpu_mem_util up by 0.1), or make its profiling run smaller "
                    "(actor_rollout_ref.rollout.max_num_batched_tokens, max_model_len)."),
            overrides=[f"rollout_gpu_mem_util={min(0.9, round(v.util + 0.1, 2)):g}",
                       "actor_rollout_ref.rollout.max_num_batched_tokens=4096"]))
    j = log.first(_VLLM_FREE)
    if j is not None:
        out.append(Diagnosis(
            id="vllm_startup_free_memory",
            title="vLLM could not reserve its share of the card at start (generation phase)",
            evidence=log.evidence(j), line=j + 1, phase="generation",
            remedy=("gpu_memory_utilization is a fraction of the card's total memory; the FSDP actor (or another "
                    "process) already holds more than the rest. Lower the vLLM share, or keep the actor's optimizer in "
                    "host RAM. Check `nvidia-smi` for leftover processes of an earlier run."),
            overrides=_keep(v.lower_util(), "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")))
    return out


@_signature
def _flashinfer(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_FLASHINFER)
    if i is None:
        return []
    return [Diagnosis(
        id="vllm_no_flashinfer",
        title="vLLM's engine failed to start: No module named 'flashinfer' (its sampler imports it)",
        evidence=log.evidence(i), line=i + 1, phase="generation",
        remedy=("vLLM's top-k/top-p sampler uses FlashInfer unless told not to. Without the flashinfer package, "
                "set VLLM_USE_FLASHINFER_SAMPLER=0 for the Ray workers (in the shell before `python run.py`, or as "
                "the override below); or install flashinfer matching your vLLM and CUDA."),
        overrides=[_env_override("VLLM_USE_FLASHINFER_SAMPLER", "0")])]


_LORA_NO_SHARD = re.compile(r"offload_to_cpu=True and NO_SHARD is not supported yet")


@_signature
def _lora_no_shard(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_LORA_NO_SHARD)
    if i is None:
        return []
    return [Diagnosis(
        id="lora_fsdp_no_shard",
        title="LoRA weight sync failed: FSDP on one GPU (NO_SHARD) cannot summon with offload_to_cpu",
        evidence=log.evidence(i), line=i + 1, phase="training",
        remedy=("Seen on the GPU test machine (verl 0.9.1, SmolLM2-135M, one H200): with one GPU torch's FSDP runs "
                "NO_SHARD, and verl's LoRA sync with rollout.layered_summon=true falls back to "
                "FSDP.summon_full_params(offload_to_cpu=True), which NO_SHARD does not support; it fails at the first "
                "weight sync, after start-up. The preflight refuses this (rule lora_layered_summon_one_gpu). Use "
                "FSDP2 (layered_summon=false alone is no way out with peft >= 0.21: rule lora_fsdp1_adapter)."),
        overrides=["actor_rollout_ref.actor.strategy=fsdp2"])]


# vLLM 0.24's LoRAModelManager._create_merged_loras_inplace: next(iter(lora_model.loras.values())) on an empty adapter
_LORA_EMPTY = re.compile(r"in _create_merged_loras_inplace|first_lora: LoRALayerWeights = next\(iter\(")


@_signature
def _lora_empty_adapter(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_LORA_EMPTY)
    if i is None:
        return []
    return [Diagnosis(
        id="lora_empty_adapter",
        title="LoRA weight sync failed: vLLM's add_lora got an adapter with no LoRA weights (StopIteration)",
        evidence=log.evidence(i), line=i + 1, phase="training",
        remedy=("Seen on the GPU test machine (verl 0.9.1, vLLM 0.24, peft 0.21, one H200, layered_summon=false): "
                "under FSDP1 verl's collect_lora_params finds no adapter tensors with peft >= 0.21 (its module paths "
                "keep FSDP1's inner _fsdp_wrapped_module.), so vLLM's _create_merged_loras_inplace stops on an empty "
                "adapter and the job then hangs. The preflight refuses this (rule lora_fsdp1_adapter). Use FSDP2, "
                "or send merged weights (actor_rollout_ref.model.lora.merge=true)."),
        overrides=["actor_rollout_ref.actor.strategy=fsdp2"])]


@_signature
def _raylet(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_RAYLET)
    if i is None:
        return []
    need = v.cpus_needed()
    return [Diagnosis(
        id="ray_register_worker",
        title='Ray: "Unable to register worker with raylet"',
        evidence=log.evidence(i), line=i + 1,
        remedy=("System limits (e.g. SLURM CPU sharing, or too few open files) stop the worker processes that "
                "ray.init() starts, one per CPU core it sees. Tell Ray how many CPUs it may use: "
                "ray_kwargs.ray_init.num_cpus, "
                f"to what the system allows (this job needs at least {need}: 3 per GPU + 1 TaskRunner"
                + (" + 1 TransferQueue controller + 1 per storage unit" if v.use_v1 else "") + "). "
                "If the limit is open files, raise it (`ulimit -n 65535`)."),
        overrides=[f"ray_kwargs.ray_init.num_cpus={need}"])]


@_signature
def _illegal_access(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_ILLEGAL)
    if i is None:
        return []
    phase = _phase_at(log, i)
    if phase == "training":
        remedy = ("A CUDA kernel of the training side read out of bounds. Run with CUDA_LAUNCH_BLOCKING=1 to get the "
                  "real frame (errors are reported asynchronously); turn off the actor's torch.compile of fused "
                  "kernels (actor_rollout_ref.actor.use_torch_compile=false).")
        overrides = [_env_override("CUDA_LAUNCH_BLOCKING", "1"), "actor_rollout_ref.actor.use_torch_compile=false"]
    else:
        remedy = ("During rollout this is vLLM's (the verl FAQ: see vLLM's troubleshooting for your version, "
                  "https://docs.vllm.ai/en/latest/usage/troubleshooting.html). First try without CUDA graphs "
                  "(actor_rollout_ref.rollout.enforce_eager=true); run with CUDA_LAUNCH_BLOCKING=1 to find the kernel.")
        overrides = ["actor_rollout_ref.rollout.enforce_eager=true", _env_override("CUDA_LAUNCH_BLOCKING", "1")]
    return [Diagnosis(id="illegal_memory_access",
                      title="CUDA error: an illegal memory access" + (f" ({phase} phase)" if phase else ""),
                      evidence=log.evidence(i), line=i + 1, phase=phase or "generation", remedy=remedy,
                      overrides=overrides)]


def _nccl_diagnosis(evidence: str, line: int | None, how: str) -> Diagnosis:
    return Diagnosis(
        id="nccl_hang",
        title="NCCL communication hang " + how,
        evidence=evidence, line=line,
        remedy=("GeForce cards (RTX 4080 etc.) have no peer-to-peer over PCIe, and NCCL can hang at initialisation "
                "trying it: turn P2P off (NCCL_P2P_DISABLE=1; hardware=rtx4080x4 sets it). To see where it stops, "
                "NCCL_DEBUG=INFO."),
        overrides=[_env_override("NCCL_P2P_DISABLE", "1"), _env_override("NCCL_DEBUG", "INFO")])


@_signature
def _nccl(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_NCCL)
    if i is None:
        return []
    return [_nccl_diagnosis(log.evidence(i), i + 1, "(collective timed out or failed)")]


@_signature
def _triton(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_TRITON)
    if i is None:
        return []
    context = "\n".join(log.clean[i:i + 40])
    overrides = ["actor_rollout_ref.actor.use_torch_compile=false"]
    remedy = ("Triton could not build a kernel (compile_module_from_src): disable just-in-time compilation of the "
              "fused kernels with use_torch_compile (verl's FAQ).")
    if _GEN_PROC.search(log.procs[i]):
        overrides.append("actor_rollout_ref.rollout.enforce_eager=true")
        remedy += " It happened in vLLM's process: also run vLLM eagerly (no torch.compile / CUDA graphs)."
    if re.search(r"Failed to find C compiler|gcc|cc1|Python\.h|CalledProcessError", context):
        remedy += (" The build needs a C compiler and Python headers: install them (`apt install build-essential "
                   "python3-dev`) or point CC at one.")
    return [Diagnosis(id="triton_compile", title="Triton compile error (compile_module_from_src)",
                      evidence=log.evidence(i), line=i + 1, remedy=remedy, overrides=overrides)]


@_signature
def _flash_attn(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_FA2)
    if i is None:
        return []
    return [Diagnosis(
        id="flash_attn_import",
        title="FlashAttention2 is not usable (flash_attn missing or built for another torch)",
        evidence=log.evidence(i), line=i + 1,
        remedy=("verl loads the model with attn_implementation=flash_attention_2 by default. Without a working "
                "flash_attn use torch's sdpa (padding removal stays correct), or install flash-attn built for your "
                "torch/CUDA."),
        overrides=["+actor_rollout_ref.model.override_config.attn_implementation=sdpa"])]


@_signature
def _ray_env(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_RAY_ENV)
    if i is None:
        return []
    env = _get(v.ray_init, "runtime_env.env_vars", {}) or _get(v.cfg, "ray_kwargs.ray_init.runtime_env.env_vars", {})
    bad = {k: val for k, val in (env.items() if isinstance(env, dict) else []) if not isinstance(val, str)}
    if not bad:
        m = re.search(r"the value (\S+) is of type", log.clean[i])
        bad = {"<NAME>": m.group(1) if m else "<value>"}
    overrides = [_env_override(k, str(val).lower() if isinstance(val, bool) else str(val)) for k, val in bad.items()]
    return [Diagnosis(
        id="ray_env_var_type",
        title="A Ray runtime_env env var is not a string",
        evidence=log.evidence(i), line=i + 1,
        remedy=("Ray accepts only strings in runtime_env.env_vars, but Hydra reads 1 / true as a number / bool. Quote "
                "the value in the override (the whole override in single quotes for the shell): "
                + ", ".join(f"{k} is {val!r}" for k, val in bad.items()) + "."),
        overrides=overrides)]


@_signature
def _hydra_missing_key(log: Log, v: Values) -> list[Diagnosis]:
    i = log.first(_HYDRA_APPEND)
    if i is None:
        return []
    m = _HYDRA_APPEND.search(log.clean[i])
    assert m is not None
    key = m.group(1)
    prev = next((log.evidence(j) for j in range(i, max(-1, i - 5), -1) if "Could not override" in log.clean[j]),
                log.evidence(i))
    return [Diagnosis(id="hydra_new_key", title="Override of a key that is not in the config",
                      evidence=prev, line=i + 1,
                      remedy="The key is new to verl's config: prefix the override with + (Hydra's append).",
                      overrides=[key])]


# verl 0.9.1 loading reward.custom_reward_function.path in its reward-loop workers (verl/utils/import_utils.py:
# load_module, load_extern_object), and a reward manager's call of the function (reward_manager/<name>.py, run_single)
_REWARD_LOAD = re.compile(r"Custom module file not found: module_path=|Error loading module from module_path=|"
                          r"Object not found in module: object_name=")
_REWARD_CALL = re.compile(r'reward_loop/reward_manager/\w+\.py", line \d+, in (?:<lambda>|run_single)')
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit)\b(?::|$)")


@_signature
def _reward_fn(log: Log, v: Values) -> list[Diagnosis]:
    """The custom reward file failed in verl's reward worker: at import (the worker's start) or when scoring."""
    i = log.first(_REWARD_LOAD)
    remedy_tail = ("The preflight imports the file and calls the function the way verl does, before Ray: run the "
                   "same command with preflight.only=true added (python run.py ... preflight.only=true) to see the "
                   "file, the line and what to change.")
    if i is not None:
        m = re.search(r"module_path='([^']+)'", log.clean[i])
        path = m.group(1) if m else "the reward file"
        # the import's own error comes first in the log (Python prints the chained cause above verl's RuntimeError)
        window = range(max(0, i - 60), i)
        cause = next((log.evidence(j) for j in reversed(window) if _EXC_LINE.search(log.clean[j].strip())
                      and not log.clean[j].strip().startswith("ray.")), "")
        at = next((f"{fm.group(1)}:{fm.group(2)}" for j in reversed(window) if (fm := _FRAME.match(log.clean[j]))
                   and m and fm.group(1) == m.group(1)), "")
        cause = f"{cause}, at {at}" if cause and at else cause
        what = ("does not exist" if "not found: module_path" in log.clean[i] else
                "does not define the function reward.custom_reward_function.name" if "Object not found" in log.clean[i]
                else "raised when imported" + (f" ({cause})" if cause else ""))
        return [Diagnosis(
            id="reward_fn_load", title=f"verl's reward worker could not load the custom reward file: {path} {what}",
            evidence=log.evidence(i), line=i + 1,
            remedy=(f"verl imports reward.custom_reward_function.path ({path}) in its reward-loop workers, after Ray "
                    f"and the model have started. {remedy_tail}"),
            overrides=[])]
    i = log.first(_REWARD_CALL)
    if i is None:
        return []
    user, exc = None, None
    for j in range(i + 1, min(len(log.clean), i + 80)):
        line = log.clean[j].strip()
        fm = _FRAME.match(log.clean[j])
        if fm and user is None and not re.search(r"/(?:verl|ray|site-packages|asyncio|concurrent)/|/python3\.\d+/",
                                                 fm.group(1)):
            user = f"{fm.group(1)}:{fm.group(2)} in {fm.group(3)}"
        elif _EXC_LINE.search(line) and not fm:
            exc = (j, line)
            break
    if exc is None:
        return []
    return [Diagnosis(
        id="reward_fn_raised",
        title="The custom reward function raised while scoring answers" + (f" ({user})" if user else ""),
        evidence=log.evidence(exc[0]), line=exc[0] + 1,
        remedy=("verl's reward manager called reward.custom_reward_function.name on an answer and it raised; verl "
                "does not catch it, so the step fails. Make the function return a number (or a dict with a numeric "
                f"'score') for every answer, also an empty or badly formatted one. {remedy_tail}"),
        overrides=[])]


@_signature
def _host_oom(log: Log, v: Values) -> list[Diagnosis]:
    end = log.first(_END_MARKERS)
    for i in log.find(_HOST_OOM):
        if end is not None and i > end:
            continue  # a DataLoader worker killed at exit after a finished run (seen on the H200): harmless
        return [Diagnosis(
            id="host_ram_oom",
            title="Host RAM ran out (a process was killed by the kernel or Ray's memory monitor)",
            evidence=log.evidence(i), line=i + 1,
            remedy=("Offloaded weights and optimizer state, Ray's object store and DataLoader workers all live in RAM. "
                    "Use fewer DataLoader workers (data.dataloader_num_workers), and keep in mind that "
                    "optimizer_offload / param_offload move GPU memory into RAM."),
            overrides=["data.dataloader_num_workers=2"])]
    return []


# ---------------------------------------------------------------------------------------------------------------------
# silent stops: where did the log stop?

_KILLED = re.compile(r"SIGTERM received|^KeyboardInterrupt|Command exited with non-zero status|^Terminated|"
                     r"Terminated with signal|received signal|SIGINT|^\^C")
_NOISE = re.compile(r"SIGTERM received|^Command exited with non-zero status|^WALL |The autoscaler failed|"
                    r"^Terminated|^\s*@\s+0x|logging\.cc:\d+|^PC: @|autoscaler/_private|monitor\.run\(\)|"
                    r"self\._run\(\)|AUTOSCALER_UPDATE_INTERVAL_S|^\s*$|\(autoscaler \+|grpo-lab watchdog|"
                    r"resource request cannot be scheduled|Tip: use `ray status`|KeyboardInterrupt")
_CONFIG_PRINT = re.compile(r"^ray init kwargs:|^\{'actor_rollout_ref'")
_AFTER_CONFIG = re.compile(r"Using dataset class|dataset len|Total training steps|create worker group|"
                           r"colocated worker base class")
_WORKERS = re.compile(r"Before FSDP|NCCL version|init_process_group|\[c10d\]|Loading weights|contains [\d.]+[MBK]? ?"
                      r"parameters")
_WORKERS_DONE = re.compile(r"After FSDP|engine initialized|init_model|LLMServerManager|vLLMHttpServer")
_FIT = re.compile(r"ready to fit|Training Progress:|Creating file logger")
_UNSCHEDULABLE = re.compile(r"resource request cannot be scheduled right now")


def _cpu_budget_hang(log: Log, v: Values, evidence: str, line: int | None, where: str) -> Diagnosis:
    need = v.cpus_needed()
    have = v.num_cpus
    units_fit = (have - facts.ray_cpus_needed(v.gpus, True, 0)) if have is not None else None
    overrides = [f"ray_kwargs.ray_init.num_cpus={need}"]
    if v.use_v1 and units_fit is not None and 1 <= units_fit < v.storage_units:
        overrides.append(f"transfer_queue.backend.SimpleStorage.num_data_storage_units={units_fit}")
    arithmetic = f"{facts.ray_cpus_formula(v.gpus, v.use_v1, v.storage_units)} = {need}"
    return Diagnosis(
        id="ray_cpu_budget_hang",
        title="Silent hang: Ray has too few CPUs, a placement group never becomes ready",
        evidence=evidence, line=line,
        remedy=(f"The log stops {where}, with no error and no `step:` line. verl's V1 trainer asks Ray for "
                f"{arithmetic} CPUs, and Ray was given {have if have is not None else 'fewer'} "
                "(ray_kwargs.ray_init.num_cpus), so it waits for ever. Give Ray enough CPUs if the machine has the "
                "cores, or use fewer TransferQueue storage units so the job fits the cores you have "
                "(the legacy trainer, trainer.use_v1=false, needs no TransferQueue)."),
        overrides=overrides)


def _stall(log: Log, v: Values, idle_s: float | None, stale_s: float) -> list[Diagnosis]:
    """A log that ends with no error: hung (and killed), still running, or finished."""
    steps = log.steps()
    total = int(v.num("trainer.total_training_steps", 0) or 0)
    if log.first(_END_MARKERS) is not None or (total > 0 and steps and max(steps) >= total):
        return []  # it finished
    kill_i = log.first(_KILLED)
    killed = kill_i is not None
    if not killed and idle_s is not None and idle_s < stale_s:
        return []  # still moving
    cut = len(log.clean)
    if kill_i is not None:
        cut = kill_i
        if log.clean[kill_i].startswith("KeyboardInterrupt"):  # Ctrl+C: its traceback is not the job's output
            for j in range(kill_i, max(-1, kill_i - 80), -1):
                if "Traceback (most recent call last)" in log.clean[j]:
                    cut = j
                    break
    meaningful = [i for i, s in enumerate(log.clean[:cut]) if not _NOISE.search(s)]
    last = meaningful[-1] if meaningful else None
    ev = log.evidence(last) if last is not None else "(empty log)"
    line = last + 1 if last is not None else None
    gone = ("then nothing until it was killed" if killed else
            f"then nothing for {idle_s / 60:.0f} min" if idle_s is not None else "then the log ends")
    cfg_i = max(log.find(_CONFIG_PRINT) or [-1])
    unsched = log.first(_UNSCHEDULABLE)
    if unsched is not None and not steps:
        return [_cpu_budget_hang(log, v, log.evidence(unsched), unsched + 1,
                                 "with Ray saying a resource request cannot be scheduled")]
    if cfg_i >= 0 and not steps:
        after = range(cfg_i + 1, len(log.clean))
        if not any(_AFTER_CONFIG.search(log.clean[i]) or _WORKERS.search(log.clean[i]) or
                   _WORKERS_DONE.search(log.clean[i]) for i in after):
            return [_cpu_budget_hang(log, v, ev, line, f"right after the config print ({gone})")]
        if not any(_WORKERS.search(log.clean[i]) or _WORKERS_DONE.search(log.clean[i]) for i in after):
            return [_cpu_budget_hang(log, v, ev, line, f"after the datasets, before any worker started ({gone})")]
        nccl_i = max(log.find(_WORKERS) or [-1])
        if nccl_i >= 0 and not any(_WORKERS_DONE.search(log.clean[i]) for i in range(nccl_i, len(log.clean))):
            return [_nccl_diagnosis(ev, line, f"at initialisation (the workers started, FSDP never finished; {gone})")]
    if steps:
        return [Diagnosis(
            id="stopped_without_error",
            title=f"Stopped after step {max(steps)} with no error",
            evidence=ev, line=line,
            remedy=(f"The log shows step {max(steps)}, {gone}. If it was killed on purpose (time limit, Ctrl+C) "
                    "resume it (trainer.resume_mode=auto resumes from the last checkpoint). If it stopped moving "
                    "first: on GeForce cards a hang in NCCL (weight sync, collectives) is the usual cause: "
                    "NCCL_P2P_DISABLE=1; a very long generation looks the same: watch nvtop."),
            overrides=[_env_override("NCCL_P2P_DISABLE", "1")])]
    return [Diagnosis(
        id="stopped_without_error",
        title="Stopped before the first step with no error",
        evidence=ev, line=line,
        remedy=(f"The last line is above, {gone}. Hang causes at start: too few Ray CPUs (3 per GPU + 2 + the "
                "TransferQueue storage units: ray_kwargs.ray_init.num_cpus), NCCL init on GeForce cards "
                "(NCCL_P2P_DISABLE=1). vLLM's start alone takes minutes: 88 s from its server process to serving, "
                "107 s after the actor was ready, for a tiny model on an H200 (benchmarks/gpu/results/2026-12-02-b/"
                "phases.txt)."),
        overrides=[f"ray_kwargs.ray_init.num_cpus={v.cpus_needed()}", _env_override("NCCL_P2P_DISABLE", "1")])]


# ---------------------------------------------------------------------------------------------------------------------
# public API


def _engine_died(log: Log) -> list[Diagnosis]:
    """A log with a fatal line (grpo_lab/launch/fatal.py) that no signature explains: which engine or actor died, the first
    error behind it, and that nothing is suggested blindly."""
    for i, raw in enumerate(log.raw):
        hit = fatal_line(raw)
        if hit is None:
            continue
        engine, label = hit
        clean = [strip(x)[0] for x in log.raw]
        root, frame = root_cause(clean, i)
        cause = f"{root} at {frame}" if root and frame else root
        lora = "/lora/" in frame
        remedy = (f"{label}: verl 0.9.1 restarts neither its rollout engine nor its Ray actors and has no time-out "
                  f"while it waits for them, so such a job hangs; grpo-lab stops it within 30 s of this line "
                  f"(status.json failed). The cause is the first error above it in the log"
                  + (f": {cause}" if cause else "") + ".")
        if lora:
            remedy += (" It failed in vLLM's LoRA manager: seen on the GPU test machine when the adapter verl handed "
                       "to vLLM's add_lora held no LoRA weights (SmolLM2, layered_summon=false, "
                       "load_format=safetensors: StopIteration in _create_merged_loras_inplace).")
        return [Diagnosis(id="ray_actor_died" if engine == RAY else "engine_died",
                          title=f"{label}" + (f": {root}" if root else "") + (f" ({frame})" if frame else ""),
                          evidence=clean[i].strip()[:300], line=i + 1,
                          phase=None if engine == RAY else "generation", remedy=remedy, overrides=[])]
    return []


def diagnose(text: str, config: dict[str, Any] | None = None, *, idle_s: float | None = None,
             stale_minutes: float = 10.0, stalls: bool = True) -> list[Diagnosis]:
    """What went wrong in this log, in the order of the evidence in the log.

    config: the job's verl config (verl_config.yaml) for exact values in the overrides; else the config verl printed
    into the log is used. idle_s: seconds since the log last changed; None means the log is complete (its process
    ended), so a log that stops without error is read as a hang or a kill. stalls=False: error signatures only
    (for a job known to have finished).
    """
    log = Log.of(text)
    printed = printed_config(log)
    values = Values(config or printed, _ray_init_kwargs(log))
    found: list[Diagnosis] = []
    for fn in _SIGNATURE_ORDER:
        found.extend(fn(log, values))
    if not found:  # an engine or actor that died for no known reason: say so, not "a hang" (grpo_lab/launch/fatal.py)
        found = _engine_died(log)
    if found or not stalls:
        found.sort(key=lambda d: d.line or 0)
        return found
    return _stall(log, values, idle_s, stale_minutes * 60)


def errors_in(path: str | Path) -> list[Diagnosis]:
    """The error signatures of a job's log so far (no stall reading): what the dead-engine watcher reports."""
    return diagnose(read_log(Path(path)), stalls=False)


def failure_class(diagnoses: Iterable[Diagnosis]) -> str:
    """The sweep summary's status word for a failed job: refused: <rules> / OOM in generation / OOM in training /
    other failure."""
    ds = list(diagnoses)
    for d in ds:
        if d.id == "preflight_refused":
            return "refused: " + d.title[d.title.find("(") + 1:d.title.find(")")]
    for d in ds:  # the first memory error decides
        if d.id.startswith("oom_") or d.id.startswith("vllm_kv") or d.id == "vllm_startup_free_memory":
            if d.phase == "training":
                return "OOM in training"
            if d.phase == "generation":
                return "OOM in generation"
            return "OOM (phase unknown)"
    return "other failure"


def _load_yaml(path: Path) -> dict[str, Any] | None:
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else None
    except Exception:
        return None


def refusal(job_dir: str | Path) -> Diagnosis | None:
    """The preflight's refusal of a job (status.json failed before anything started, plan.json's errors), or None.

    A refused job never started Ray: its log stops after the preflight report, which is no hang and no crash. What
    it needs is the rules that refused it and their fixes (plan.json), not a guess from the log.
    """
    job_dir = Path(job_dir)
    status, plan = read_json(job_dir / "status.json"), read_json(job_dir / "plan.json")
    errors = [e for e in plan.get("errors") or [] if isinstance(e, dict) and e.get("rule")]
    if status.get("status") != "failed" or not errors or "nothing was started" not in str(status.get("error", "")):
        return None
    rules = list(dict.fromkeys(e["rule"] for e in errors))
    lines = [f"[{e['rule']}] {e.get('message', '')}" + (f"\n  fix: {e['fix']}" if e.get("fix") else "")
             for e in errors]
    fix_all = (plan.get("fix_all") or {}).get("overrides") if (plan.get("fix_all") or {}).get("passes") else None
    # the first fix that is overrides the preflight re-checked (not advice in words, not "no single fix is known")
    first_fix = next((e["fix"].split("  or  ")[0] for e in errors if e.get("fix")
                      and str(e.get("checked", "")).startswith("re-checked: the preflight passes")), "")
    overrides = shlex.split(fix_all or first_fix) if fix_all or first_fix else []
    return Diagnosis(
        id="preflight_refused",
        title=f"Refused by the preflight ({', '.join(rules)}): nothing was started",
        evidence=str(status.get("error")),
        remedy="\n".join(lines + ([f"all together: {fix_all}"] if fix_all else [])
                         + [f"(from {job_dir / 'plan.json'}; check again with preflight.only=true / make plan)"]),
        overrides=overrides)


def diagnose_path(path: str | Path, *, stale_minutes: float = 10.0) -> tuple[Path, list[Diagnosis]]:
    """Diagnose a log file or a job dir (its train.log, with its verl_config.yaml). Returns (log path, diagnoses).

    A job the preflight refused gets that refusal (its rules and fixes from plan.json), not a reading of its log."""
    p = Path(path)
    job_dir = p if p.is_dir() else p.parent
    log_path = p / "train.log" if p.is_dir() else p
    refused = refusal(job_dir)
    if refused is not None:
        return log_path, [refused]
    try:
        idle: float | None = time.time() - log_path.stat().st_mtime
    except OSError:
        return log_path, []
    text = read_log(log_path)
    config = _load_yaml(job_dir / "verl_config.yaml")
    status = read_json(job_dir / "status.json")
    if not logkind.marker(text) and not (log_path.name == "train.log" and status.get("status")):
        return log_path, [not_a_log(log_path, text)]  # a grpo-lab job's train.log may be empty while it starts
    if status.get("status") in ("failed", "ok") or status.get("ended"):
        idle = None  # the job is over: the log is complete
    error = status.get("error")
    if status.get("status") == "failed" and isinstance(error, str) and error.strip():
        last = error.strip().splitlines()[-1].strip()
        if last not in text:  # the driver's exception, caught after the log's tee ended (runs before it was appended)
            text += "\ngrpo-lab: the job raised (status.json):\n" + error + "\n"
    return log_path, diagnose(text, config, idle_s=idle, stale_minutes=stale_minutes,
                              stalls=status.get("status") != "ok")


NOT_A_LOG = "not_a_log"


def not_a_log(path: Path, text: str) -> Diagnosis:
    """What the doctor says of a file that is no verl or grpo-lab log (grpo_lab/after_run/logkind.py): that, nothing to try."""
    first = logkind.first_line(text)
    return Diagnosis(
        id=NOT_A_LOG, title=f"{path} is not a verl or grpo-lab log" + ("" if first else " (it is empty)"),
        evidence=f"first line: {first}" if first else "(empty file)",
        remedy=("None of the lines that verl 0.9.1, Ray or run.py always print in a job is in it ("
                + logkind.described() + "), so there is nothing to diagnose and nothing is suggested. Give the "
                "doctor a job's log: make doctor LOG=outputs/runs/<job>/train.log (or the job's folder), or the "
                "console output of a verl run."))


def read_log(path: Path, limit: int = 32 << 20) -> str:
    """A log's text; of a huge one its head (where verl prints its config) and its tail (where it ended)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= limit:
                return f.read().decode("utf-8", errors="replace")
            head_size = min(4 << 20, limit // 8)
            head = f.read(head_size)
            f.seek(size - (limit - head_size))
            return (head + b"\n" + f.read()).decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file, or {} when it is missing or not one (a job folder may be half written)."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def gone_running(status: dict[str, Any]) -> str | None:
    """Why a status.json that says "running" is not true any more, or None when it may be.

    grpo-lab writes "running" when a job starts and "ok"/"failed" when it ends; a process killed with SIGKILL (the
    kernel's OOM killer, `kill -9`, a machine that went away) never writes the end. status.json names the host and
    pid: on that host, a pid that no longer exists, or now belongs to a process started after the job, is gone.
    From another host nothing can be told.
    """
    if status.get("status") != "running":
        return None
    pid, host = status.get("pid"), status.get("host")
    if not isinstance(pid, int) or not host or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process (pid {pid} on {host}) is gone without writing an end"
    except PermissionError:
        pass  # exists, another user's
    started = status.get("started")
    try:
        import psutil  # Ray's dependency; without it only a vanished pid counts

        born = psutil.Process(pid).create_time()
        if started and born > dt.datetime.fromisoformat(str(started)).timestamp() + 60:
            return (f"its process (pid {pid} on {host}) is gone without writing an end (the pid now belongs to a "
                    "later process)")
    except Exception:  # no psutil, or the process ended meanwhile: the pid check above stands
        pass
    return None


def format_diagnoses(diagnoses: list[Diagnosis], source: str = "") -> str:
    if not diagnoses:
        return f"grpo-lab doctor: no known failure signature in {source or 'the log'}."
    if [d.id for d in diagnoses] == [NOT_A_LOG]:
        d = diagnoses[0]
        return "\n".join([f"grpo-lab doctor: {d.title}; nothing to diagnose.", f"  {d.evidence}",
                          f"  {d.remedy}"])
    head = f"grpo-lab doctor: {len(diagnoses)} finding(s)" + (f" in {source}" if source else "") + ":"
    return "\n".join([head] + [d.format() for d in diagnoses])


def diagnose_file(path: str | Path) -> str:
    """Readable diagnosis of a log file (or job dir); what the launcher prints when a job fails."""
    log_path, ds = diagnose_path(path)
    return format_diagnoses(ds, str(log_path))


def write_diagnosis(job_dir: str | Path) -> list[Diagnosis]:
    """Diagnose a job dir's train.log and write diagnosis.json beside it."""
    job_dir = Path(job_dir)
    _, ds = diagnose_path(job_dir)
    out = {"log": "train.log", "diagnoses": [d.to_dict() for d in ds]}
    facts.atomic_write(job_dir / "diagnosis.json", json.dumps(out, indent=2) + "\n")
    return ds


# ---------------------------------------------------------------------------------------------------------------------
# watchdog for a running job


def _last_step_line(text: str) -> int | None:
    steps = Log.of(text[-200_000:]).steps()
    return max(steps) if steps else None


def watch_progress(log_path: str | Path, stale_minutes: float = 10.0, *, now: float | None = None) -> str | None:
    """One look at a running job's log: a warning when it has not changed for stale_minutes, else None."""
    p = Path(log_path)
    try:
        idle = (now if now is not None else time.time()) - p.stat().st_mtime
    except OSError:
        return None
    if idle < stale_minutes * 60:
        return None
    return _stall_message(read_log(p), idle)


def _stall_message(text: str, idle_s: float) -> str:
    step = _last_step_line(text)
    where = f"last step: {step}" if step is not None else "no step finished yet"
    msg = [f"grpo-lab watchdog: no progress for {idle_s / 60:.0f} minutes ({where})."]
    # an error a worker printed before the driver hung, or where the log stopped (CPU budget, NCCL init)
    ds = [d for d in diagnose(text, idle_s=idle_s, stale_minutes=0) if d.id != "stopped_without_error"]
    if ds:
        msg.append(f"  likely: {ds[0].title}")
        if ds[0].overrides:
            msg.append("  try: " + " ".join(shlex.quote(o) for o in ds[0].overrides))
    msg.append("  On GeForce cards a stall in NCCL (no P2P over PCIe) is common: NCCL_P2P_DISABLE=1. A stall right "
               "after the config print is the V1 trainer waiting for Ray CPUs (3 per GPU + 2 + TransferQueue storage "
               "units): ray_kwargs.ray_init.num_cpus / transfer_queue.backend.SimpleStorage.num_data_storage_units.")
    return "\n".join(msg)


class ProgressWatchdog:
    """Warns once when the log shows no progress for stale_minutes. start() runs a daemon thread, stop() joins it.

    Progress is a new line in the log other than noise (Ray's autoscaler warnings, the watchdog's own output), so
    repeated "resource request cannot be scheduled" lines do not hide a hang.
    """

    def __init__(self, log_path: str | Path, stale_minutes: float = 10.0, interval_s: float = 30.0,
                 out: Callable[[str], None] | None = None) -> None:
        self.log_path = Path(log_path)
        self.stale_s = stale_minutes * 60
        self.interval_s = interval_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.warned = False
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail = LogTail(self.log_path)
        self._last_progress = time.time()

    def start(self) -> "ProgressWatchdog":
        if self._thread is not None:
            return self
        self._stop.clear()
        self._last_progress = time.time()
        self._tail.from_end()
        self._thread = threading.Thread(target=self._run, name="grpo-lab-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval_s + 1))
            self._thread = None

    def __enter__(self) -> "ProgressWatchdog":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check(self, now: float | None = None) -> str | None:
        """One poll (the thread calls this every interval_s): reads what the log gained, warns once when stale."""
        now = time.time() if now is None else now
        if self._read_new():
            self._last_progress = now
        idle = now - self._last_progress
        if self.warned or idle < self.stale_s:
            return None
        text = read_log(self.log_path)
        self.warned = True
        self.message = _stall_message(text, idle)
        try:
            self.out(self.message)
        except Exception:
            pass
        return self.message

    def _read_new(self) -> bool:
        return any(not _NOISE.search(_RAY_PREFIX.sub("", _ANSI.sub("", ln))) for ln in self._tail.new_lines())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:
                pass
            if self.warned:
                return


# ---------------------------------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_lab.after_run.doctor",
                                 description="Diagnose a verl job's log (or a job dir's train.log).")
    ap.add_argument("log", help="log file, or a job dir with train.log")
    ap.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    ap.add_argument("--stale-minutes", type=float, default=10.0,
                    help="a running job's log unchanged this long counts as stalled (default 10)")
    args = ap.parse_args(argv)
    path = Path(args.log)
    if not path.exists():
        print(f"grpo-lab doctor: {path} does not exist", file=sys.stderr)
        return 2
    log_path, ds = diagnose_path(path, stale_minutes=args.stale_minutes)
    if args.json:
        print(json.dumps([d.to_dict() for d in ds], indent=2))
    else:
        print(format_diagnoses(ds, str(log_path)))
    return 2 if [d.id for d in ds] == [NOT_A_LOG] else 0


if __name__ == "__main__":
    sys.exit(main())
