"""The doctor's signatures: the error texts of verl 0.9.1 + vLLM + Ray on small boxes, each read into a diagnosis
with the overrides to try; how a matcher registers its ids, and the match order: docs/after_run.md."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from grpo_lab.after_run.doctor.logread import END_MARKERS, Diagnosis, Log, already_set, cpus_needed, env_override, now
from grpo_lab.loglines import FRAME, strip
from grpo_lab.memory.memplan_remedies import find_remedies, phase_result
from grpo_lab.memory.run import Run
from grpo_lab.registry import Entry, Registry

Matcher = Callable[[Log, Run], list[Diagnosis]]

# what a diagnosis says failed
SIGNATURE_KINDS = {
    "gpu memory": "a card ran out of memory, or the rollout engine found too little of it (failure class: OOM)",
    "host memory": "the host's RAM ran out",
    "kernels": "a CUDA kernel failed, or could not be compiled",
    "packages": "a package verl or vLLM imports is missing, or built for another torch",
    "lora": "handing the LoRA adapter to the rollout engine",
    "ray": "Ray: its workers, its runtime_env, its CPUs, its actors",
    "nccl": "NCCL communication between the GPUs",
    "engine": "the rollout engine died",
    "config": "an override of a key the config does not have",
    "reward": "the custom reward file",
    "stop": "the log stops with no error",
    "crash": "the log ends in a Python exception that no signature knows",
    "refusal": "the preflight refused the job: nothing was started",
    "input": "the file given is no log",
}


class FatalLine(NamedTuple):
    """A line after which verl waits for ever (grpo_lab/launch/fatal.py stops the job), matched at the start of what
    loglines.strip() leaves of a line; source: only in the vLLM logger's lines from that file."""

    pattern: re.Pattern[str]
    label: str
    source: str = ""


@dataclass(frozen=True)
class Signature(Entry):
    """A diagnosis the doctor can give, the matcher that finds it in a log (None: known()), its fatal lines if any."""

    matcher: Matcher | None = None
    fatal: tuple[FatalLine, ...] = ()


SIGNATURES: Registry[Signature] = Registry("doctor signature", SIGNATURE_KINDS,
                                           "SIGNATURE_KINDS in grpo_lab/after_run/doctor/signatures.py")


def signature(sid: str, *, kind: str, phase: str,
              first: re.Pattern[str] | None = None) -> Callable[[Callable[..., Any]], Matcher]:
    """Register a matcher under an id it gives (a matcher that gives several has one decorator per id). With `first`:
    a matcher of the log's first line that matches it (line index i, no diagnosis when none does), which returns the
    Diagnosis's other fields; its id, evidence and line (the line's) are filled in."""

    def deco(fn: Callable[..., Any]) -> Matcher:
        matcher = fn
        if first is not None:
            @functools.wraps(fn)
            def matcher(log: Log, run: Run) -> list[Diagnosis]:
                i = log.first(first)
                return [] if i is None else [Diagnosis(**{"id": sid, "evidence": log.evidence(i), "line": i + 1,
                                                          **fn(log, i, run)})]

        SIGNATURES.add(Signature(sid, kind, phase, matcher))
        return matcher

    return deco


def known(sid: str, *, kind: str, phase: str, fatal: tuple[FatalLine, ...] = ()) -> str:
    """Register a diagnosis that no matcher gives (it comes from where the log stopped, a job's files); its id."""
    return SIGNATURES.add(Signature(sid, kind, phase, None, fatal)).id


def matchers() -> list[Matcher]:
    """The matchers in match order: diagnose() runs each on the log (diagnoses on one line keep this order)."""
    return list(dict.fromkeys(s.matcher for s in SIGNATURES.values() if s.matcher is not None))


_FATAL: dict[int, list[tuple[str, FatalLine]]] = {}  # the fatal lines by the registry's size (complete after import)


def fatal_line(line: str) -> tuple[str, str] | None:
    """(the signature id, what died) when this log line says an engine or an actor is dead for good, else None: the
    fatal lines in registration order, those of one source file last."""
    text, source = strip(line)
    text = text.strip()
    lines = _FATAL.get(len(SIGNATURES)) or _FATAL.setdefault(len(SIGNATURES), sorted(
        ((s.id, f) for s in SIGNATURES.values() for f in s.fatal), key=lambda hit: bool(hit[1].source)))
    return next(((sid, f.label) for sid, f in lines if f.pattern.match(text) and f.source in ("", source)), None)


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
TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\)")


def _phase_at(log: Log, i: int) -> str | None:
    """Which phase the error at line i happened in: the innermost recognisable traceback frame decides."""
    if _GEN_PROC.search(log.procs[i]):
        return "generation"
    for j in range(i - 1, max(-1, i - 200), -1):
        s = log.clean[j]
        if s.lstrip().startswith("File ") or "ray::" in s:
            if _GEN_FRAME.search(s) or _GEN_HEADER.search(s):
                return "generation"
            if _TRAIN_FRAME.search(s) or _TRAIN_HEADER.search(s):
                return "training"
        if TRACEBACK.search(s) and j < i - 1:
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


def phase_remedies(run: Run, phase: str) -> tuple[tuple[float, str] | None, list[dict]]:
    """(the phase's predicted peak and verdict, the plan's remedies that lower that peak), re-planned with the job's
    Run; (None, []) where the job has no memory plan."""
    if run.planned is None or run.model.arch is None:
        return None, []
    before = phase_result(run.model.arch, run.planned, phase)
    return before, [r for r in find_remedies(run.model.arch, run.planned, phase) if r["peak_gb_per_gpu"] < before[0]]


def new_overrides(run: Run, override: str) -> list[str]:
    return [o for o in shlex.split(override) if not already_set(run, o)]


def memory_advice(run: Run, phase: str) -> tuple[str, list[str]]:
    """What the memory plan says lowers this phase's peak, in words, and the first such remedy as overrides."""
    before, remedies = phase_remedies(run, phase)
    if before is None:
        why = "; ".join(run.notes[-1:]) or ("no model or card: actor_rollout_ref.model.path, lab.hardware."
                                              "gpu_memory_gb (the job folder's verl_config.yaml, .hydra/config.yaml)")
        return f"No memory plan for this job ({why}), so no override is known to lower this phase's peak.", []
    out = [f"The memory plan puts the {phase} phase at {before[0]:.2f} GB per GPU of {run.planned.card_gb:g} GB "
           f"({before[1]})"
           + (", and it ran out anyway: the plan is short for this job." if before[1] == "fits" else ".")]
    if not remedies:
        return out[0] + " No override the plan knows lowers it.", []
    out.append("What lowers it, with the predicted peak after each (the plan's order):")
    out += [f"- {' '.join(new_overrides(run, r['override']))} -> {r['peak_gb_per_gpu']:.2f} GB ({r['verdict']})"
            for r in remedies]
    first = next((r for r in remedies if r["verdict"] != "oom"), remedies[0])
    return "\n".join(out), new_overrides(run, first["override"])


# an out-of-memory in a phase: the title's end, the remedy's start (what ran out)
_OOM_IN = {"training": ("in the training phase (FSDP actor update / log-prob pass)",
                        "The actor's update ran out of GPU memory (weights + grads + Adam state + activations). "),
           "generation": ("in the generation phase (vLLM rollout)",
                          "vLLM ran out of memory while generating (KV cache, sampler logits over the vocabulary). ")}
_LOG_PROB_PASS = re.compile(r"compute_log_prob|compute_ref_log_prob|entropy_from_logits|infer_batch")
_IN_LOG_PROB_PASS = ("\nIt ran out in a log-prob pass (forward only, the ~152k-token vocabulary's logits): also lower "
                     "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu / ref.log_prob_max_token_len_per_gpu, "
                     "or compute the entropy in chunks (actor_rollout_ref.ref.entropy_from_logits_with_chunking=true, "
                     "actor_rollout_ref.actor.entropy_checkpointing=true).")


@signature("oom_training", kind="gpu memory", phase="update")
@signature("oom_generation", kind="gpu memory", phase="rollout")
@signature("oom_unknown_phase", kind="gpu memory", phase="any")
def _cuda_oom(log: Log, run: Run) -> list[Diagnosis]:
    by_phase: dict[str | None, int] = {}
    for i in log.find(_OOM):
        phase = _phase_at(log, i)
        if phase not in by_phase or ("Tried to allocate" in log.clean[i]
                                     and "Tried to allocate" not in log.clean[by_phase[phase]]):
            by_phase[phase] = i  # the phase's first line, or its first with the sizes: it says more
    out = []
    for phase, i in sorted(by_phase.items(), key=lambda kv: kv[1]):
        if phase is None:
            continue
        what, why = _OOM_IN[phase]
        advice, overrides = memory_advice(run, phase)
        log_prob = phase == "training" and _LOG_PROB_PASS.search(" ".join(log.clean[max(0, i - 60):i]))
        out.append(Diagnosis(id="oom_training" if phase == "training" else "oom_generation",
                             title=f"CUDA out of memory {what}", evidence=log.evidence(i), line=i + 1, phase=phase,
                             remedy=why + advice + (_IN_LOG_PROB_PASS if log_prob else ""), overrides=overrides))
    if not out and None in by_phase:  # no frame told the phase: what lowers both phases' peaks
        i = by_phase[None]
        gen = {r["override"] for r in phase_remedies(run, "generation")[1]}
        both = [r["override"] for r in phase_remedies(run, "training")[1] if r["override"] in gen]
        out.append(Diagnosis(
            id="oom_unknown_phase",
            title="CUDA out of memory (phase not visible in the log)",
            evidence=log.evidence(i), line=i + 1,
            remedy=("The traceback does not show whether vLLM (generation) or the FSDP actor (training) ran out. "
                    "Watch `nvtop` / `watch -n 1 nvidia-smi` on the next run: memory moves between the phases.\n"
                    "Training phase: " + memory_advice(run, "training")[0] + "\nGeneration phase: "
                    + memory_advice(run, "generation")[0]),
            overrides=new_overrides(run, both[0]) if both else []))
    return out


@signature("vllm_kv_cache_too_small", kind="gpu memory", phase="start-up", first=_KV_NONE)
def _kv_cache(log: Log, i: int, run: Run) -> dict[str, Any]:
    util = run.cfg.rollout.gpu_memory_utilization
    return dict(
        title="vLLM has no memory left for its KV cache (generation phase, at engine start)", phase="generation",
        remedy=(f"vLLM's share (gpu_memory_utilization, {now(util)}, x the "
                "card) is used up by the model weights and the profiling run, so no KV cache is left. Give vLLM a "
                "larger share if the training phase has room (rollout_gpu_mem_util up by 0.1), or make its "
                "profiling run smaller (actor_rollout_ref.rollout.max_num_batched_tokens, max_model_len)."),
        overrides=([f"rollout_gpu_mem_util={min(0.9, round(float(util) + 0.1, 2)):g}"] if util else [])
        + ["actor_rollout_ref.rollout.max_num_batched_tokens=4096"])


@signature("vllm_startup_free_memory", kind="gpu memory", phase="start-up", first=_VLLM_FREE)
def _vllm_free(log: Log, i: int, run: Run) -> dict[str, Any]:
    advice, overrides = memory_advice(run, "generation")
    return dict(
        title="vLLM could not reserve its share of the card at start (generation phase)", phase="generation",
        remedy=("gpu_memory_utilization is a fraction of the card's total memory; the FSDP actor (or another "
                "process) already holds more than the rest. Check `nvidia-smi` for leftover processes of an "
                "earlier run. " + advice),
        overrides=overrides)


@signature("vllm_no_flashinfer", kind="packages", phase="start-up", first=_FLASHINFER)
def _flashinfer(log: Log, i: int, run: Run) -> dict[str, Any]:
    return dict(
        title="vLLM's engine failed to start: No module named 'flashinfer' (its sampler imports it)",
        phase="generation",
        remedy=("vLLM's top-k/top-p sampler uses FlashInfer unless told not to. "
                + ("This job already sets VLLM_USE_FLASHINFER_SAMPLER=0: install flashinfer matching your vLLM and "
                   "CUDA." if already_set(run, env_override("VLLM_USE_FLASHINFER_SAMPLER", "0")) else
                   "Without the flashinfer package, set VLLM_USE_FLASHINFER_SAMPLER=0 for the Ray workers (in the "
                   "shell before `python run.py`, or as the override below); or install flashinfer matching your "
                   "vLLM and CUDA.")),
        overrides=[env_override("VLLM_USE_FLASHINFER_SAMPLER", "0")])


_LORA_NO_SHARD = re.compile(r"offload_to_cpu=True and NO_SHARD is not supported yet")


@signature("lora_fsdp_no_shard", kind="lora", phase="weight sync", first=_LORA_NO_SHARD)
def _lora_no_shard(log: Log, i: int, run: Run) -> dict[str, Any]:
    return dict(
        title="LoRA weight sync failed: FSDP on one GPU (NO_SHARD) cannot summon with offload_to_cpu",
        phase="training",
        remedy=("Seen on the GPU test machine (verl 0.9.1: SmolLM2-135M on one H200; verl's own LoRA example "
                "settings, FSDP1 + layered_summon=True, on Qwen3-0.6B on one H100): with one GPU torch's FSDP runs "
                "NO_SHARD, and verl's LoRA sync with rollout.layered_summon=true falls back to "
                "FSDP.summon_full_params(offload_to_cpu=True), which NO_SHARD does not support; it fails at the first "
                "weight sync, after start-up. The preflight refuses this (rule lora_layered_summon_one_gpu). Use "
                "FSDP2 (layered_summon=false alone is no way out with peft >= 0.21: rule lora_fsdp1_adapter)."),
        overrides=["actor_rollout_ref.actor.strategy=fsdp2"])


# vLLM 0.24's LoRAModelManager._create_merged_loras_inplace: next(iter(lora_model.loras.values())) on an empty adapter
_LORA_EMPTY = re.compile(r"in _create_merged_loras_inplace|first_lora: LoRALayerWeights = next\(iter\(")


@signature("lora_empty_adapter", kind="lora", phase="weight sync", first=_LORA_EMPTY)
def _lora_empty_adapter(log: Log, i: int, run: Run) -> dict[str, Any]:
    return dict(
        title="LoRA weight sync failed: vLLM's add_lora got an adapter with no LoRA weights (StopIteration)",
        phase="training",
        remedy=("Seen on the GPU test machine (verl 0.9.1, vLLM 0.24, peft 0.21, one H200, layered_summon=false): "
                "under FSDP1 verl's collect_lora_params finds no adapter tensors with peft >= 0.21 (its module paths "
                "keep FSDP1's inner _fsdp_wrapped_module.), so vLLM's _create_merged_loras_inplace stops on an empty "
                "adapter and the job then hangs. The preflight refuses this (rule lora_fsdp1_adapter). Use FSDP2, "
                "or send merged weights (actor_rollout_ref.model.lora.merge=true)."),
        overrides=["actor_rollout_ref.actor.strategy=fsdp2"])


@signature("ray_register_worker", kind="ray", phase="start-up", first=_RAYLET)
def _raylet(log: Log, i: int, run: Run) -> dict[str, Any]:
    need = cpus_needed(run)
    return dict(
        title='Ray: "Unable to register worker with raylet"',
        remedy=("System limits (e.g. SLURM CPU sharing, or too few open files) stop the worker processes that "
                "ray.init() starts, one per CPU core it sees. Tell Ray how many CPUs it may use: "
                "ray_kwargs.ray_init.num_cpus, to what the system allows ("
                + (f"this job needs at least {need}: " if need else "the job's GPUs and trainer are not in its "
                   "config; it needs ") + "3 per GPU + 1 TaskRunner, with the V1 trainer + 1 TransferQueue controller "
                "+ 1 per storage unit). If the limit is open files, raise it (`ulimit -n 65535`)."),
        overrides=[f"ray_kwargs.ray_init.num_cpus={need}"] if need else [])


@signature("illegal_memory_access", kind="kernels", phase="any", first=_ILLEGAL)
def _illegal_access(log: Log, i: int, run: Run) -> dict[str, Any]:
    phase = _phase_at(log, i)
    if phase == "training":
        remedy = ("A CUDA kernel of the training side read out of bounds. Run with CUDA_LAUNCH_BLOCKING=1 to get the "
                  "real frame (errors are reported asynchronously); turn off the actor's torch.compile of fused "
                  "kernels (actor_rollout_ref.actor.use_torch_compile=false).")
        overrides = [env_override("CUDA_LAUNCH_BLOCKING", "1"), "actor_rollout_ref.actor.use_torch_compile=false"]
    else:
        remedy = ("During rollout this is vLLM's (the verl FAQ: see vLLM's troubleshooting for your version, "
                  "https://docs.vllm.ai/en/latest/usage/troubleshooting.html). First try without CUDA graphs "
                  "(actor_rollout_ref.rollout.enforce_eager=true); run with CUDA_LAUNCH_BLOCKING=1 to find the kernel.")
        overrides = ["actor_rollout_ref.rollout.enforce_eager=true", env_override("CUDA_LAUNCH_BLOCKING", "1")]
    return dict(title="CUDA error: an illegal memory access" + (f" ({phase} phase)" if phase else ""),
                phase=phase or "generation", remedy=remedy, overrides=overrides)


def nccl_diagnosis(run: Run, evidence: str, line: int | None, how: str) -> Diagnosis:
    p2p_off = already_set(run, env_override("NCCL_P2P_DISABLE", "1"))
    return Diagnosis(
        id="nccl_hang",
        title="NCCL communication hang " + how,
        evidence=evidence, line=line,
        remedy=(("P2P is already off in this job (NCCL_P2P_DISABLE=1), so it is not GeForce peer-to-peer: a collective "
                 "waits for a rank that stopped or fell far behind (look for an error of another rank above it)."
                 if p2p_off else
                 "GeForce cards (RTX 4080 etc.) have no peer-to-peer over PCIe, and NCCL can hang at initialisation "
                 "trying it: turn P2P off (NCCL_P2P_DISABLE=1; hardware=rtx4080x4 sets it).")
                + " To see where it stops, NCCL_DEBUG=INFO."),
        overrides=[env_override("NCCL_P2P_DISABLE", "1"), env_override("NCCL_DEBUG", "INFO")])


@signature("nccl_hang", kind="nccl", phase="any")
def _nccl(log: Log, run: Run) -> list[Diagnosis]:
    i = log.first(_NCCL)
    return [] if i is None else [nccl_diagnosis(run, log.evidence(i), i + 1, "(collective timed out or failed)")]


@signature("triton_compile", kind="kernels", phase="any", first=_TRITON)
def _triton(log: Log, i: int, run: Run) -> dict[str, Any]:
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
    return dict(title="Triton compile error (compile_module_from_src)", remedy=remedy, overrides=overrides)


@signature("flash_attn_import", kind="packages", phase="start-up", first=_FA2)
def _flash_attn(log: Log, i: int, run: Run) -> dict[str, Any]:
    return dict(
        title="FlashAttention2 is not usable (flash_attn missing or built for another torch)",
        remedy=("verl loads the model with attn_implementation=flash_attention_2 by default. Without a working "
                "flash_attn use torch's sdpa (padding removal stays correct), or install flash-attn built for your "
                "torch/CUDA."),
        overrides=["+actor_rollout_ref.model.override_config.attn_implementation=sdpa"])


@signature("ray_env_var_type", kind="ray", phase="start-up", first=_RAY_ENV)
def _ray_env(log: Log, i: int, run: Run) -> dict[str, Any]:
    bad = {k: val for k, val in run.cfg.env_vars.items() if not isinstance(val, str)}
    if not bad:
        m = re.search(r"the value (\S+) is of type", log.clean[i])
        bad = {"<NAME>": m.group(1) if m else "<value>"}
    overrides = [env_override(k, str(val).lower() if isinstance(val, bool) else str(val)) for k, val in bad.items()]
    return dict(
        title="A Ray runtime_env env var is not a string",
        remedy=("Ray accepts only strings in runtime_env.env_vars, but Hydra reads 1 / true as a number / bool. Quote "
                "the value in the override (the whole override in single quotes for the shell): "
                + ", ".join(f"{k} is {val!r}" for k, val in bad.items()) + "."),
        overrides=overrides)


@signature("hydra_new_key", kind="config", phase="compose", first=_HYDRA_APPEND)
def _hydra_missing_key(log: Log, i: int, run: Run) -> dict[str, Any]:
    m = _HYDRA_APPEND.search(log.clean[i])
    assert m is not None
    key = m.group(1)
    prev = next((log.evidence(j) for j in range(i, max(-1, i - 5), -1) if "Could not override" in log.clean[j]),
                log.evidence(i))
    return dict(title="Override of a key that is not in the config", evidence=prev,
                remedy="The key is new to verl's config: prefix the override with + (Hydra's append).", overrides=[key])


# verl 0.9.1 loading reward.custom_reward_function.path in its reward-loop workers (verl/utils/import_utils.py:
# load_module, load_extern_object), and a reward manager's call of the function (reward_manager/<name>.py, run_single)
_REWARD_LOAD = re.compile(r"Custom module file not found: module_path=|Error loading module from module_path=|"
                          r"Object not found in module: object_name=")
_REWARD_CALL = re.compile(r'reward_loop/reward_manager/\w+\.py", line \d+, in (?:<lambda>|run_single)')
_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit)\b(?::|$)")


@signature("reward_fn_load", kind="reward", phase="start-up")
@signature("reward_fn_raised", kind="reward", phase="reward")
def _reward_fn(log: Log, run: Run) -> list[Diagnosis]:
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
        at = next((f"{fm.group(1)}:{fm.group(2)}" for j in reversed(window) if (fm := FRAME.match(log.clean[j]))
                   and m and fm.group(1) == m.group(1)), "")
        cause = f"{cause}, at {at}" if cause and at else cause
        what = ("does not exist" if "not found: module_path" in log.clean[i] else
                "does not define the function reward.custom_reward_function.name" if "Object not found" in log.clean[i]
                else "raised when imported" + (f" ({cause})" if cause else ""))
        return [Diagnosis(
            id="reward_fn_load", title=f"verl's reward worker could not load the custom reward file: {path} {what}",
            evidence=log.evidence(i), line=i + 1,
            remedy=(f"verl imports reward.custom_reward_function.path ({path}) in its reward-loop workers, after Ray "
                    f"and the model have started. {remedy_tail}"))]
    i = log.first(_REWARD_CALL)
    if i is None:
        return []
    user, exc = None, None
    for j in range(i + 1, min(len(log.clean), i + 80)):
        line = log.clean[j].strip()
        fm = FRAME.match(log.clean[j])
        if fm and user is None and not re.search(r"/(?:verl|ray|site-packages|asyncio|concurrent)/|/python3\.\d+/",
                                                 fm.group(1)):
            user = f"{fm.group(1)}:{fm.group(2)} in {fm.group(3)}"
        elif _EXC_LINE.search(line) and not fm:
            exc = j
            break
    if exc is None:
        return []
    return [Diagnosis(
        id="reward_fn_raised",
        title="The custom reward function raised while scoring answers" + (f" ({user})" if user else ""),
        evidence=log.evidence(exc), line=exc + 1,
        remedy=("verl's reward manager called reward.custom_reward_function.name on an answer and it raised; verl "
                "does not catch it, so the step fails. Make the function return a number (or a dict with a numeric "
                f"'score') for every answer, also an empty or badly formatted one. {remedy_tail}"))]


@signature("host_ram_oom", kind="host memory", phase="any")
def _host_oom(log: Log, run: Run) -> list[Diagnosis]:
    end = log.first(END_MARKERS)
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


