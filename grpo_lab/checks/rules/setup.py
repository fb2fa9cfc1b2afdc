"""Rules on the set-up around the numbers: Ray's CPUs and environment, verl's keys, recipes, the model, the machine."""

from __future__ import annotations

import contextlib
import difflib
import math
import re
from collections.abc import Iterable, Mapping

from grpo_lab import facts
from grpo_lab.checks.rules import ALT, A, Ctx, Problem, error, note, rule, warn
from grpo_lab.cli.overrides import quote
from grpo_lab.memory import memplan
from grpo_lab.memory.memplan_arch import LINEAR_NAMES
from grpo_lab.memory.settings import as_int, ref_used
from grpo_lab.memory.verl_view import given
from grpo_lab.verl_schema import schema

# A Qwen3 chat model thinks first (<think>...</think>); the answer's "#### n" comes after the trace. Qwen's model card
# recommends output budgets of 32k tokens for thinking, and on GSM8K-level problems the traces commonly run past
# 1000 tokens (the guide: answers cut before "####" at its 1024). Below this many response tokens, warn.
THINKING_MIN_RESPONSE = 2048

ENV_VARS = facts.RAY_ENV_VARS


def attn_impl(c: Ctx) -> tuple[str, str | None]:
    """(the actor's attn_implementation, the key that sets it; None: verl's default, flash_attention_2)."""
    ov, key = c.cfg.model.override_config, A + "model.override_config"
    if isinstance(ov.get("model_config"), Mapping):
        ov, key = ov["model_config"], key + ".model_config"
    value = ov.get("attn_implementation")
    return (str(value), key + ".attn_implementation") if value else ("flash_attention_2", None)


@rule("gpu_memory_utilization_range", kind="memory", phase="start-up")
def gpu_memory_utilization_range(c: Ctx) -> Iterable[Problem]:
    """The fraction of each card's total memory the rollout engine takes. Outside (0, 1]: vLLM 0.24's CacheConfig
    refuses it (gpu_memory_utilization: Field(gt=0, le=1), vllm/config/cache.py). Exactly 1.0 with vLLM: refused too,
    because vLLM 0.24 provably fails at start-up whenever any memory is in use on the card, and its own worker's is:
    Worker.init_device (vllm/v1/worker/gpu_worker.py) sets up the worker's CUDA context and NCCL, then takes a
    MemorySnapshot (cudaMemGetInfo) and request_memory (vllm/v1/worker/utils.py) raises when the free memory is below
    ceil(total x gpu_memory_utilization), i.e. below the whole card at 1.0. SGLang (mem_fraction_static) and the other
    engines at 1.0 are not checked against their code: a warning."""
    util = c.cfg.rollout.gpu_memory_utilization
    try:
        u = float(util) if not isinstance(util, bool) else None
    except (TypeError, ValueError):
        u = None
    engine = str(c.cfg.rollout.name)
    what = (f"actor_rollout_ref.rollout.gpu_memory_utilization={util!r}: it is the fraction of each card's total "
            f"memory the rollout engine takes (on 32 GB cards the guide starts at 0.4)")
    if u is None or not 0.0 < u <= 1.0:
        yield error(f"{what}, and it must be in (0, 1]: vLLM's CacheConfig refuses it (gpu_memory_utilization: gt=0, "
                    f"le=1) when the rollout engine starts, after Ray and the actor", "rollout_gpu_mem_util=0.4")
    elif u == 1.0 and engine == "vllm":
        yield error(f"{what}, and 1.0 asks for the whole card: vLLM 0.24 measures the free memory after its worker's "
                    f"own CUDA context and NCCL buffers are on the card, so it is always below the total, and it "
                    f"raises 'ValueError: Free memory on device cuda:0 (... GiB) on startup is less than desired GPU "
                    f"memory utilization (1.0, ... GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                    f"other processes.' when the rollout engine starts (vllm/v1/worker/utils.py request_memory, "
                    f"called from gpu_worker.py Worker.init_device)", "rollout_gpu_mem_util=0.4")
    elif u == 1.0:
        yield warn(f"{what}, and 1.0 gives {engine} the whole card, with nothing left for the actor's share, CUDA "
                   f"contexts or activations (not checked against {engine}'s code; vLLM refuses 1.0 at start-up)",
                   "rollout_gpu_mem_util=0.4")


# ---- Ray --------------------------------------------------------------------------------------------------------

def ray_target(c: Ctx):
    """Where verl's ray.init() connects, by Ray's own lookup (grpo_lab/checks/ray_lookup.py): the config's address, then
    RAY_ADDRESS, then, when launching here, the cluster the latest `ray start` on this node recorded."""
    from grpo_lab.checks.ray_lookup import ray_target as lookup

    return lookup(c.cfg.ray_init.address, c.environ, temp_dir=c.cfg.ray_init._temp_dir, read_file=c.launching)


@rule("ray_join_num_cpus", kind="setup", phase="start-up")
def ray_join_num_cpus(c: Ctx) -> Iterable[Problem]:
    """A hardware file's num_cpus is for the Ray that ray.init starts; joining a cluster, ray.init refuses it."""
    where = ray_target(c).joins  # an existing cluster, named as set; None: ray.init starts one of this machine
    num_cpus = c.cfg.ray_init.num_cpus
    if where and num_cpus is not None and not c.lab.ray_cluster:  # a cluster of ours: its ray start gets it
        yield error(f"ray.init connects to an existing Ray cluster ({where}) and {NUM_CPUS}={num_cpus} is set (by "
                    f"{set_by(c, NUM_CPUS)}, for a Ray started here): Ray raises 'When connecting to an existing "
                    f"cluster, num_cpus and num_gpus must not be provided'. The cluster's nodes declare their own "
                    f"CPUs", f"{NUM_CPUS}=null")


NUM_CPUS = "ray_kwargs.ray_init.num_cpus"


def set_by(c: Ctx, key: str) -> str:
    """What set `key` in this job (its provenance layers, grpo_lab/cli/provenance.py); without them, "the config"."""
    by = c.run.layers.source(key) if c.run.layers is not None else "the config"
    return "the command line" if by == "command line" else by


def start_ray(c: Ctx) -> str:
    """Advice: the cluster to start, then the same command (without num_cpus, which Ray refuses when joining)."""
    then = f"with {NUM_CPUS}=null appended joins it" if c.cfg.ray_init.num_cpus is not None else "joins it"
    return ("start Ray on the nodes first (docs/launch.md, 'More than one machine'): `ray start --head --port=6379` "
            "on this node and `ray start --address=<this node's ip>:6379` on each other node; then the same command "
            f"{then}")


@rule("ray_nnodes_without_cluster", kind="setup", phase="start-up")
def ray_nnodes_without_cluster(c: Ctx) -> Iterable[Problem]:
    """trainer.nnodes > 1 needs a Ray cluster of that many nodes. ray.init() with no address joins RAY_ADDRESS, else
    the cluster `ray start` recorded on this node (verl's multi-node scripts rely on it), and only then starts one of
    this machine alone, where verl's resource pool waits for GPUs that never come. That last lookup reads this
    machine, so the check is an environment check: not launching (preflight.only, make plan, make fit), a note."""
    nnodes, gpus = c.batch["nnodes"], c.batch["n_gpus_per_node"]
    if nnodes <= 1 or c.lab.ray_cluster:  # a cluster grpo-lab starts itself (a SLURM job): it joins that
        return
    t = ray_target(c)
    if t.joins:
        return
    if not c.launching:
        yield note(f"trainer.nnodes={nnodes}: the Ray cluster is not checked here (not launching). On the head node "
                   f"ray.init() joins RAY_ADDRESS, else the cluster the latest `ray start` there recorded "
                   f"(/tmp/ray/ray_current_cluster), and only without either starts a Ray of that machine alone, "
                   f"whose {gpus} GPU(s) cannot hold {nnodes} nodes' workers (verl would wait for the others)")
        return
    if t.fails:
        return  # ray_no_cluster_to_join says it
    yield error(f"trainer.nnodes={nnodes} needs a Ray cluster of {nnodes} nodes ({nnodes * gpus} GPUs), and ray.init() "
                f"finds none to join ({t.looked_at}): it would start a Ray of this machine alone, and verl's "
                f"resource pool would wait for the other nodes' GPUs forever", start_ray(c))


@rule("ray_no_cluster_to_join", kind="setup", phase="start-up", launching_only=True)
def ray_no_cluster_to_join(c: Ctx) -> Iterable[Problem]:
    """ray_kwargs.ray_init.address=auto (hardware=ray_cluster) with nothing to join: ray.init raises at once."""
    if c.lab.ray_cluster:
        return
    t = ray_target(c)
    if t.fails:
        yield error(f"{t.fails} ({t.looked_at})", start_ray(c))


@rule("ray_cpus", kind="setup", phase="start-up")
def ray_cpus(c: Ctx) -> Iterable[Problem]:
    """Per node: each node's GPU workers (3 CPUs per GPU) fit its CPUs, and the job's once-per-job actors fit the
    cluster. Ray's CPUs: ray_init.num_cpus, else the node's cores (this machine's when launching, else
    lab.hardware.cpu_cores). Not checked when joining a cluster someone else started (its nodes declare their CPUs);
    checked against each node's `ray start --num-cpus` when grpo-lab starts it (a SLURM job of several nodes)."""
    b = c.batch
    per_node, nnodes = max(0, b["n_gpus_per_node"]), b["nnodes"]
    v1, tq = bool(c.cfg.trainer.use_v1), c.cfg.transfer_queue.backend
    units = as_int(tq.SimpleStorage.num_data_storage_units, 8) if tq.storage_backend == "SimpleStorage" else 0
    once = facts.ray_cpus_per_job(v1, units)
    need_node = facts.ray_cpus_needed(per_node, v1, units) if nnodes == 1 else \
        facts.CPUS_PER_GPU * per_node + math.ceil(once / nnodes)
    where = ray_target(c).joins
    num_cpus = c.cfg.ray_init.num_cpus
    started = c.lab.ray_cluster or {}  # a cluster grpo-lab starts itself (a SLURM job of several nodes)
    if where and not started.get("num_cpus_per_node"):
        have, source = None, f"the cluster's nodes ({where})"
    elif where:  # the job nulls num_cpus to join; set (by a fix), it is what each node's ray start would get
        have = as_int(num_cpus if num_cpus is not None else started["num_cpus_per_node"])
        source = f"`ray start --num-cpus={have}` on each node of {started.get('source')}"
    elif num_cpus is not None:
        have, source = as_int(num_cpus), f"ray_kwargs.ray_init.num_cpus={num_cpus}"
    elif c.launching:
        have, source = facts.machine_cpus(), "this node's CPUs (ray_kwargs.ray_init.num_cpus is null)"
    else:
        have = as_int(c.lab.hardware.cpu_cores or 0)
        source = f"lab.hardware.cpu_cores={have} (ray_kwargs.ray_init.num_cpus is null: Ray takes the node's cores)"
    b["ray_cpus"] = {"needed": need_node, "available": have, "source": source, "use_v1": v1, "per_node": nnodes > 1}
    if not have or need_node <= have:
        return
    how = facts.ray_cpus_formula(per_node, v1, units)
    if nnodes > 1:
        how = (f"{facts.CPUS_PER_GPU} per GPU x {per_node} GPUs of each node + its share of the {once} once-per-job "
               f"CPUs ({facts.ray_cpus_formula(0, v1, units).split(' + ', 1)[1]}) over {nnodes} nodes")
    fixes = []
    if v1 and units > 1 and nnodes == 1 and have - facts.CPUS_PER_GPU * per_node - 2 >= 1:
        fixes.append(f"transfer_queue.backend.SimpleStorage.num_data_storage_units="
                     f"{have - facts.CPUS_PER_GPU * per_node - 2}")
    fixes.append(f"ray_kwargs.ray_init.num_cpus={need_node}")
    if v1 and facts.ray_cpus_needed(per_node, False, 0) <= have:
        fixes.append("trainer.use_v1=false")
    node = " per node" if nnodes > 1 else ""
    yield error(f"Ray's CPU budget cannot hold the job: it needs {need_node} CPUs{node} ({how}) but has {have}{node} "
                f"({source}). Ray's placement groups then wait forever: verl prints its config and hangs silently "
                f"(seen on the H200: num_cpus=8 hung for 8 minutes, 16 ran)", ALT.join(fixes))


@rule("ray_env_vars", kind="setup", phase="start-up")
def ray_env_vars(c: Ctx) -> Iterable[Problem]:
    for k, v in c.cfg.env_vars.items():
        if not isinstance(v, str):
            text = "" if v is None else str(int(v) if isinstance(v, bool) else v)  # true: "1", null: ""
            yield error(f"{ENV_VARS}.{k}={v!r} is a {type(v).__name__}: Ray's runtime_env takes string values "
                        f"only and ray.init fails", f"'{ENV_VARS}.{k}=\"{text}\"'")


# ---- verl's keys and recipes ------------------------------------------------------------------------------------

@rule("dynamic_bsz_mismatch", kind="setup", phase="start-up")
def dynamic_bsz_mismatch(c: Ctx) -> Iterable[Problem]:
    """The actor update and the old-log-prob pass run on one engine: verl 0.9.1's ActorRolloutRefWorker.init_model
    (verl/workers/engine_workers.py) asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz (both
    trainers use this worker): an error. The reference model gets an engine of its own, built with its own
    ref.log_prob_use_dynamic_bsz (same function, the ref branch): a mismatch there runs, and a missing ref micro-batch
    size is log_prob_micro_batch's error."""
    actor_dyn = bool(c.cfg.actor.use_dynamic_bsz)
    val = "true" if actor_dyn else "false"
    roll = bool(c.cfg.rollout.log_prob_use_dynamic_bsz)
    if roll != actor_dyn:
        yield error(f"actor.use_dynamic_bsz={val} but rollout.log_prob_use_dynamic_bsz={str(roll).lower()}: the actor "
                    f"update and the old-log-prob pass share one engine, and verl 0.9.1 asserts "
                    f"'self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz' (a bare "
                    f"AssertionError) when it builds the actor, after Ray has started (verl/workers/engine_workers.py "
                    f"ActorRolloutRefWorker.init_model), with either trainer",
                    f"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz={val}")
    ref = bool(c.cfg.ref.log_prob_use_dynamic_bsz)
    if ref_used(c.cfg) and ref != actor_dyn:
        how = ("packs micro-batches by tokens (ref.log_prob_max_token_len_per_gpu)" if ref else
               "uses fixed micro-batches of ref.log_prob_micro_batch_size_per_gpu")
        yield warn(f"actor.use_dynamic_bsz={val} but ref.log_prob_use_dynamic_bsz={str(ref).lower()}: the "
                   f"reference log-prob pass batches differently from the actor. verl 0.9.1 builds the reference "
                   f"engine with its own setting (verl/workers/engine_workers.py "
                   f"ActorRolloutRefWorker.init_model), so this runs; the reference pass {how}, which is likely "
                   f"not what was meant", f"actor_rollout_ref.ref.log_prob_use_dynamic_bsz={val}")


@rule("rollout_engine_known", kind="setup", phase="start-up")
def rollout_engine_known(c: Ctx) -> Iterable[Problem]:
    """actor_rollout_ref.rollout.name must be an engine verl can start: its schema takes any string (its YAML comment
    even names hf), but verl 0.9.1's worker asserts the (name, mode) pair is in its registry and its server registry
    raises for any other name, after Ray and the model have started (grpo_lab.verl_schema: schema().rollout_engines)."""
    name, mode = c.cfg.rollout.name, c.cfg.rollout.mode
    if name is None:
        return
    s = schema()
    pairs, names, source = s.rollout_engines, s.rollout_servers, s.rollout_from
    if not pairs or not names:
        yield note(f"rollout engine name not checked: {source}")
        return
    if (name, mode) in pairs and name in names:
        return
    usable = sorted(n for n in names if any(p == (n, mode) for p in pairs)) or sorted(names)
    if name in names:  # the engine is there; the mode is not
        modes = sorted(m for n, m in pairs if n == name)
        yield error(f"actor_rollout_ref.rollout.mode={mode!r}: verl 0.9.1 starts {name} only in mode "
                    f"{', '.join(map(repr, modes))} ({source}); its worker asserts 'Rollout {name} with mode {mode} "
                    f"not found' after Ray and the model have started",
                    f"actor_rollout_ref.rollout.mode={modes[0]}" if modes else "")
        return
    yield error(f"actor_rollout_ref.rollout.name={name!r} is no rollout engine verl 0.9.1 can start: it knows "
                f"{', '.join(usable)} ({source}). verl's config takes the name, and the job fails after Ray and the "
                f"model have started (the worker asserts 'Rollout {name} with mode {mode} not found', the server "
                f"raises 'Unknown rollout mode: {name}')", f"{A}rollout.name=vllm")


@rule("micro_batch_explicit", kind="setup", phase="update")
def micro_batch_explicit(c: Ctx) -> Iterable[Problem]:
    """The user's micro-batch size against grpo-lab's dynamic batching default (grpo_lab/checks/microbatch.py settles it
    before the preflight and leaves what it did in lab.micro_batch)."""
    from grpo_lab.checks.microbatch import ignored, switches

    info = c.lab.micro_batch
    if not info:
        return
    yours = ", ".join(f"{m['key']}={m['value']} ({m['set_by']})" for m in info["micro"])
    if info.get("turned_off"):
        off = ", ".join(f"{o['key']}=false" for o in info["turned_off"])
        by = ", ".join(dict.fromkeys(str(o["set_by"]) for o in info["turned_off"]))
        yield note(f"your micro-batch size wins: {yours} has no effect under dynamic batching (verl then packs "
                   f"micro-batches by tokens), so grpo-lab's default use_dynamic_bsz=true ({by}) is off: {off}. All "
                   f"three passes together: verl 0.9.1's engine worker asserts that the actor's and the rollout "
                   f"log-prob's agree. The passes you gave no size take theirs from conf/config.yaml. To keep dynamic "
                   f"batching, leave the micro-batch size out or set use_dynamic_bsz=true yourself")
    for m, dyn, budget, tokens in ignored(info, c.cfg):
        kept = ", ".join(f"{k['key']}=true ({k['set_by']})" for k in info.get("kept_on") or ())
        yield warn(f"your {m['key']}={m['value']} ({m['set_by']}) is IGNORED: {dyn}=true, and you set dynamic "
                   f"batching on yourself ({kept}), so verl packs the {m['pass']}'s micro-batches by tokens "
                   f"({budget}={tokens} per GPU) and never reads a micro-batch size. Leave one of the two "
                   f"out, or turn dynamic batching off for the micro-batch size to count",
                   " ".join(f"{dyn}=false" for dyn, on in switches(c.cfg) if on))


@rule("model_key_unknown", kind="setup", phase="compose")
def model_key_unknown(c: Ctx) -> Iterable[Problem]:
    model_cfg = given(c.verl, "model")
    known, source = schema().model_keys, schema().model_keys_from
    if not known:
        yield note(f"actor_rollout_ref.model keys not checked: {source}")
        return
    if not isinstance(model_cfg, Mapping):
        return
    for key in [k for k in model_cfg if k not in known]:
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        fix = f"~actor_rollout_ref.model.{key}" + (
            f" actor_rollout_ref.model.{close[0]}={quote(model_cfg[key])}" if close else "")
        yield error(f"actor_rollout_ref.model.{key} is not a key verl knows ({source}){hint} verl would fail on it "
                    f"inside a worker, after Ray and the model have started", fix)


def _lora_rank(c: Ctx) -> int:
    """The LoRA rank in either of verl's spellings (model.lora_rank, model.lora.rank); 0: full fine-tuning."""
    return as_int(c.cfg.model.lora_rank) or as_int(c.cfg.model.lora.get("rank"))


@rule("lora_target_modules", kind="setup", phase="start-up")
def lora_target_modules(c: Ctx) -> Iterable[Problem]:
    """peft (verl's FSDP engine builds its LoraConfig) raises 'Target modules ... not found in the base model' when no
    target names a module: a list item matches a module's name or its dotted tail, a string is a regular expression
    over the full name (peft/tuners/tuners_utils.py check_target_module_exists), except 'all-linear'."""
    key, targets = A + "model.target_modules", c.cfg.model.target_modules
    if _lora_rank(c) <= 0 or not c.model.arch or targets == "all-linear" or c.cfg.model.target_parameters:
        return
    names = LINEAR_NAMES + ("lm_head", "embed_tokens") + (("gate",) if c.model.arch.is_moe else ())
    paths = [f"model.layers.0.{'self_attn' if n[0] in 'qkvo' else 'mlp'}.{n}" for n in names[:7]] + list(names[7:])
    if isinstance(targets, str):
        with contextlib.suppress(re.error):
            if not any(re.fullmatch(targets, p) for p in paths):
                yield error(f"{key}={targets}: peft reads a string as a regular expression over the model's module "
                            f"names ({', '.join(names)}) and matches none; verl fails with 'Target modules "
                            f"{targets} not found in the base model' when it builds the model, after Ray has started "
                            f"(all linear layers: all-linear, with a hyphen)", f"{key}=all-linear")
        return
    if any(str(t).rsplit(".", 1)[-1] in names for t in targets):
        return
    close = [difflib.get_close_matches(str(t), names, n=1, cutoff=0.6) for t in targets]
    fixes = [f"'{key}={quote(list(dict.fromkeys(m[0] for m in close)))}'"] if all(close) else []
    yield error(f"{key}={quote(list(targets))}: the model has no module of these names (what LoRA can target: "
                f"{', '.join(names)}); peft raises 'Target modules ... not found in the base model' when verl builds "
                f"the model, after Ray has started", ALT.join([*fixes, f"{key}=all-linear"]))


@rule("lora_load_format", kind="setup", phase="weight sync")
def lora_load_format(c: Ctx) -> Iterable[Problem]:
    """LoRA with load_format=dummy (verl's DAPO LoRA recipe): vLLM starts with random weights, and verl 0.9.1's V1
    worker (the only one: main_ppo_v0 uses it too) syncs the base weights into it before the first adapter
    (verl/workers/engine_workers.py: `base_sync_done = "dummy" not in load_format`, then `do_lora_base_sync`).
    So verl's code says it works; no GPU run here has confirmed it yet (benchmarks/gpu/README.md): a warning."""
    lora = _lora_rank(c)
    load_format = str(c.cfg.rollout.load_format)
    # other formats (safetensors, auto, pt) load the checkpoint in vLLM itself; merge=true syncs merged full weights
    if lora > 0 and "dummy" in load_format and not bool(c.cfg.model.lora.get("merge")):
        yield warn(f"LoRA (lora_rank={lora}) with actor_rollout_ref.rollout.load_format={load_format}: vLLM starts "
                   f"without the base weights, and verl 0.9.1's worker syncs them in before the first adapter "
                   f"(engine_workers.py, do_lora_base_sync), so this should run; how sure: read in verl's code, not "
                   f"yet confirmed by a GPU run here. If training/rollout_probs_diff_mean is large at step 1, vLLM "
                   f"generated with wrong weights; safetensors loads them from the checkpoint at start-up (the "
                   f"certain way, and what conf/model/qwen3_8b_lora.yaml uses)",
                   "actor_rollout_ref.rollout.load_format=safetensors")


OVERRIDE_KV = "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"


@rule("side_by_side_jobs", kind="setup", phase="any")
def side_by_side_jobs(c: Ctx) -> Iterable[Problem]:
    """hydra/launcher=side_by_side: up to k jobs at once on the same GPUs and host, each with its own Ray cluster and
    vLLM. Any of them can be at its largest phase (vLLM's whole budget while generating) at the same time. The fixes:
    the vLLM share that lets k generations fit, or fewer jobs at once (hydra.launcher.n_jobs, re-checked through
    grpo_lab/cli/apply.py like any override)."""
    k = as_int(c.lab.side_by_side_jobs) or 1
    plan = c.plan or {}
    phases = plan.get("phases") or {}
    if k <= 1 or not phases:
        return
    card = float(plan.get("card_gb") or 0)
    peaks = {name: float(p.get("peak_gb_per_gpu") or 0) for name, p in phases.items()}
    worst = max(peaks, key=peaks.get)
    need, kv = k * peaks[worst], plan.get("kv_cache") or {}
    if card and need > card:
        gen = peaks.get("generation", 0.0)
        budget = float(kv.get("budget_gb") or 0)
        share = c.cfg.rollout.gpu_memory_utilization
        others = max((v for n, v in peaks.items() if n != "generation"), default=0.0)
        util = 0.0
        if budget and k * others <= card * 0.95:
            # the engine's share that leaves k generations (their other memory included) inside the card; the
            # engine takes its share of the card's real bytes (memplan.card_bytes)
            util = math.floor(100 * (card * 0.95 / k - (gen - budget)) / (card * memplan.CARD_UNIT_BYTES / 1e9)) / 100
        fewer = max(1, int(card // peaks[worst]))
        fixes = ([f"rollout_gpu_mem_util={util}"] if util >= 0.05 else []) + [f"hydra.launcher.n_jobs={fewer}"]
        why = (f"each job's vLLM share rollout_gpu_mem_util={share} ({budget:.1f} GB of the card) would have to go "
               f"down to {util}" if util >= 0.05 else
               f"no vLLM share lets {k} fit (each job's {max((n for n in peaks if n != 'generation'), key=peaks.get)}"
               f" phase alone is {others:.1f} GB; its vLLM share is rollout_gpu_mem_util={share}, "
               f"{budget:.1f} GB)")
        yield error(f"hydra/launcher=side_by_side runs up to {k} jobs at once on the same GPUs: {k} x "
                    f"{peaks[worst]:.1f} GB ({worst}, the largest phase of one job) = {need:.1f} GB > the "
                    f"{card:.1f} GB card: {why}, or {fewer} job(s) at once fit", ALT.join(fixes))
    ram = plan.get("host_ram") or {}
    total, cap = float(ram.get("total_gb") or 0), float(ram.get("capacity_gb") or 0)
    if cap and k * total > cap:
        fewer = max(1, int(cap // total))
        yield error(f"hydra/launcher=side_by_side runs up to {k} jobs at once on one host: {k} x {total:.1f} GB of "
                    f"host RAM each = {k * total:.1f} GB > {cap:.0f} GB: {fewer} job(s) at once fit",
                    f"hydra.launcher.n_jobs={fewer}")
    pin = c.lab.side_by_side_kv_pin or {}
    if pin.get("by") == "launcher":  # grpo_lab/launch/prepare.py put the plan's KV cache into the config verl gets
        yield note(f"hydra/launcher=side_by_side: each job's vLLM KV cache is pinned to the plan's "
                   f"{float(pin['bytes']) / 1e9:.2f} GB ({OVERRIDE_KV}={pin['bytes']} in verl_config.yaml, set by "
                   f"the launcher), so a job starting beside it cannot take from it; a value of your own for "
                   f"{OVERRIDE_KV} wins")
    elif kv.get("kv_cache_memory_bytes") and pin.get("by") == "user":
        yield note(f"hydra/launcher=side_by_side: each job's vLLM KV cache is pinned to your "
                   f"{kv['kv_cache_memory_bytes'] / 1e9:.2f} GB ({OVERRIDE_KV}={kv['kv_cache_memory_bytes']}), "
                   f"not to the plan's size")
    elif kv.get("engine") == "vllm" and not kv.get("kv_cache_memory_bytes") and float(kv.get("kv_cache_gb") or 0) > 0:
        gb = float(kv["kv_cache_gb"])
        pin = f"{OVERRIDE_KV}={int(gb * 1e9)}"
        yield warn(f"hydra/launcher=side_by_side: each job's vLLM sizes its KV cache from the card's free memory while "
                   f"it profiles, and a job starting beside it at that moment takes from it (on the GPU test machine "
                   f"one of three got 1.09 GiB instead of ~26; benchmarks/gpu/README.md). Pin each job's cache to the "
                   f"plan's {gb:.2f} GB", pin)


# peft 0.21 selects an adapter's tensors by module path (tuners_utils._get_tuner_state_dict_key_prefixes); before, by
# "lora_" in the key. See rule lora_fsdp1_adapter.
PEFT_PATH_MATCH = (0, 21)


def _fsdp1_lora_adapter(c: Ctx) -> bool:
    """LoRA sent to vLLM as an adapter (not merged) by verl's FSDP1 engine."""
    merge = str(c.cfg.model.lora.get("merge")).lower() in ("true", "1")
    # verl's FSDP actor config copies actor.strategy into its engine config (workers/config/actor.py)
    return _lora_rank(c) > 0 and not merge and str(c.cfg.actor.strategy) == "fsdp"


@rule("lora_fsdp1_adapter", kind="setup", phase="weight sync")
def lora_fsdp1_adapter(c: Ctx) -> Iterable[Problem]:
    """verl 0.9.1 collects the adapter for vLLM with peft's get_peft_model_state_dict (utils/fsdp_utils.py,
    collect_lora_params). Under FSDP1 every decoder layer and LoRA leaf is its own FSDP unit, so the module paths peft
    >= 0.21 builds keep an inner `_fsdp_wrapped_module.` while FSDP's state-dict keys drop it: nothing matches, the
    adapter is empty and vLLM's add_lora stops in _create_merged_loras_inplace (StopIteration). Checked on CPU with
    verl 0.9.1 and peft 0.21.2 on one and two ranks (0 tensors; FSDP2: all of them); seen on the GPU test machine."""
    if not _fsdp1_lora_adapter(c):
        return
    peft = facts.installed_version("peft")
    if peft is None or peft < PEFT_PATH_MATCH:
        return
    lora = _lora_rank(c)
    yield error(f"LoRA (lora_rank={lora}) sent to vLLM as an adapter with FSDP1 (actor_rollout_ref.actor.strategy="
                f"fsdp) and peft {'.'.join(map(str, peft))}: peft >= 0.21 picks the adapter's tensors by module "
                f"path, and under FSDP1 those paths keep the inner _fsdp_wrapped_module. of each wrapped layer while "
                f"the state dict's keys drop it, so verl 0.9.1's collect_lora_params sends vLLM an empty adapter: "
                f"add_lora fails with StopIteration in _create_merged_loras_inplace at the first weight sync, after "
                f"start-up, and the job then hangs (seen on the GPU test machine, any layered_summon). FSDP2 collects "
                f"the adapter; or merge it into the weights verl sends",
                ALT.join([A + "actor.strategy=fsdp2", A + "model.lora.merge=true"]))


@rule("lora_layered_summon_one_gpu", kind="setup", phase="weight sync")
def lora_layered_summon_one_gpu(c: Ctx) -> Iterable[Problem]:
    world = c.batch["n_gpus"]  # GPUs per node x nodes: FSDP's world size
    if c.cfg.rollout.layered_summon and _fsdp1_lora_adapter(c) and world == 1:
        lora, strategy = _lora_rank(c), str(c.cfg.actor.strategy)
        # seen on the GPU test machine (benchmarks/gpu/README.md, 2026-12-03): both load formats failed at the first
        # weight sync with "NotImplementedError: offload_to_cpu=True and NO_SHARD is not supported yet"; so did verl's
        # own LoRA example settings on Qwen3-0.6B (benchmarks/gpu/results/2026-12-06-h100/lora_fsdp1.tgz).
        # layered_summon=false is no way out with peft >= 0.21 (rule lora_fsdp1_adapter); FSDP2 has no NO_SHARD
        yield error(f"LoRA (lora_rank={lora}) with actor_rollout_ref.rollout.layered_summon=true on {world} GPU with "
                    f"FSDP1 (strategy {strategy!r}): torch's FSDP runs NO_SHARD on one GPU, and verl 0.9.1's LoRA "
                    f"sync falls back to summon_full_params(offload_to_cpu=True), which NO_SHARD refuses; the job "
                    f"fails at the first weight sync, after start-up (seen on the GPU test machine). FSDP2 gathers "
                    f"the adapter layer by layer without it",
                    A + "actor.strategy=fsdp2")


@rule("fused_sum_pi_squared", kind="setup", phase="update")
def fused_sum_pi_squared(c: Ctx) -> Iterable[Problem]:
    # verl 0.9.1 workers/engine/fsdp/transformer_impl.py: "calculate_sum_pi_squared=True is not supported with
    # use_fused_kernels=True" (NotImplementedError in the first log-prob pass, after start-up)
    if c.cfg.model.use_fused_kernels and c.cfg.actor.calculate_sum_pi_squared:
        yield error("actor_rollout_ref.model.use_fused_kernels=true (the default speed=fast, or speed=fused) with "
                    "actor_rollout_ref.actor.calculate_sum_pi_squared=true: verl's fused log-prob never holds the "
                    "whole logits that sum(pi^2) needs (the optimal-token-baseline estimators), and verl 0.9.1 raises "
                    "NotImplementedError in the first log-prob pass, after start-up",
                    A + "model.use_fused_kernels=false")


@rule("dapo_filter_metric", kind="setup", phase="reward")
def dapo_filter_metric(c: Ctx) -> Iterable[Problem]:
    fg = c.cfg.algorithm.filter_groups
    if not fg.enable:
        return
    metric, manager = fg.metric, c.cfg.reward.reward_manager.name
    if not metric:
        yield error("algorithm.filter_groups.enable=true without algorithm.filter_groups.metric: DAPO's dynamic "
                    "sampling has nothing to compare the answers of a group by (verl raises after start-up)",
                    ALT.join(["algorithm.filter_groups.metric=acc reward.reward_manager.name=dapo",
                              "algorithm.filter_groups.metric=reward"]))
    elif metric not in ("reward",) and manager != "dapo":
        yield warn(f"algorithm.filter_groups.metric={metric!r} must be reported by the reward function's extra info; "
                   f"the {manager!r} reward manager reports only the score (metric 'reward'): verl stops with "
                   f"'Finished groups are missing DAPO metric' after the first generation",
                   ALT.join(["algorithm.filter_groups.metric=reward", "reward.reward_manager.name=dapo"]))


@rule("dapo_overlong_buffer", kind="setup", phase="reward")
def dapo_overlong_buffer(c: Ctx) -> Iterable[Problem]:
    """DAPO's soft overlong punishment ramps over the last `len` tokens before max_resp_len: verl 0.9.1's DAPO reward
    manager (verl/experimental/reward_loop/reward_manager/dapo.py) adds min(-(length - (max_resp_len - len)) / len x
    factor, 0), and asserts max_resp_len >= len inside its worker."""
    kw = c.cfg.reward.reward_kwargs
    cfg = kw.get("overlong_buffer_cfg")
    if c.cfg.reward.reward_manager.name != "dapo" or not (isinstance(cfg, Mapping) and cfg.get("enable")):
        return
    ramp = as_int(cfg.get("len"), 0)
    limit = as_int(kw.get("max_resp_len"), 0) or as_int(c.cfg.data.max_response_length, 0)
    if ramp <= 0 or limit <= 0:
        return
    fix = f"reward.reward_kwargs.overlong_buffer_cfg.len={max(1, limit // 4)}"
    if ramp > limit:
        yield error(f"DAPO's overlong ramp (reward.reward_kwargs.overlong_buffer_cfg.len={ramp}) is longer than the "
                    f"response limit ({limit} tokens): verl 0.9.1's DAPO reward manager asserts 'max_resp_len must be "
                    f"larger than overlong_buffer.len' when its reward workers start "
                    f"(verl/experimental/reward_loop/reward_manager/dapo.py DAPORewardManager.__init__)", fix)
    elif ramp == limit:
        yield warn(f"DAPO's overlong ramp (reward.reward_kwargs.overlong_buffer_cfg.len={ramp}) covers the whole "
                   f"response limit ({limit} tokens): verl 0.9.1 accepts it (it asserts max_resp_len >= len) and runs, "
                   f"but the ramp starts at 0 tokens, so every answer, however short, gets a penalty in proportion "
                   f"to its length (dapo.py: expected_len = max_resp_len - len = 0)", fix)
    elif ramp > limit // 2:
        yield warn(f"DAPO's overlong ramp ({ramp} tokens) is more than half of the response limit ({limit}): answers "
                   f"past {limit - ramp} tokens are penalised (DAPO used 4k of 20k)", fix)


@rule("thinking_response_length", kind="setup", phase="rollout")
def thinking_response_length(c: Ctx) -> Iterable[Problem]:
    info = c.model.info
    base = str(c.cfg.model.path or "").rstrip("/").lower().endswith("-base")
    thinking = (bool(info.get("thinking", False)) and not base
                and c.cfg.data.apply_chat_template_kwargs.get("enable_thinking") is not False)
    resp = as_int(c.cfg.data.max_response_length)
    if thinking and 0 < resp < THINKING_MIN_RESPONSE:
        name = info.get("name") or "the model"
        base = {"qwen3_1_7b": "model=qwen3_1_7b_base", "qwen3_4b": "model=qwen3_4b_base"}.get(str(name))
        yield warn(f"{name} is a Qwen3 chat model with thinking on, and max_response_length={resp} is below "
                   f"{THINKING_MIN_RESPONSE}: Qwen3 reasons in <think>...</think> before answering, and on GSM8K-level "
                   f"problems those traces often run past 1000 tokens (Qwen recommends budgets of up to 32k for "
                   f"thinking), so many answers are cut before '#### n' and score 0. Watch response_length/clip_ratio",
                   ALT.join([f"max_response_length={THINKING_MIN_RESPONSE}"] + ([base] if base else [])
                            + ["+data.apply_chat_template_kwargs.enable_thinking=false"]))


@rule("nccl_p2p", kind="setup", phase="start-up")
def nccl_p2p(c: Ctx) -> Iterable[Problem]:
    set_in = "NCCL_P2P_DISABLE" in c.cfg.env_vars or "NCCL_P2P_DISABLE" in c.environ
    if c.lab.hardware.p2p is False and c.batch["n_gpus"] > 1 and not set_in:
        yield warn(f"{c.lab.hardware.name or 'this hardware'} has no GPU peer-to-peer "
                   f"(lab.hardware.p2p=false): NCCL can hang at initialisation unless NCCL_P2P_DISABLE=1 reaches "
                   f"the Ray workers", f"'+{ENV_VARS}.NCCL_P2P_DISABLE=\"1\"'")


# verl 0.9.1's logger backends (verl/utils/tracking.py Tracking.supported_backend, and "tracking", its deprecated
# wandb) and the module each imports when the trainer's Tracking starts (None: verl's own)
LOGGERS = {"wandb": "wandb", "tracking": "wandb", "mlflow": "mlflow", "swanlab": "swanlab",
           "vemlp_wandb": "volcengine_ml_platform", "tensorboard": "tensorboard", "console": None,
           "clearml": "clearml", "trackio": "trackio", "file": None, "rl_insight": "rl_insight"}


def _loggers(c: Ctx) -> list[str]:
    v = c.cfg.trainer.logger
    return [v] if isinstance(v, str) else [str(x) for x in v or ()]


@rule("logger_unknown", kind="setup", phase="start-up")
def logger_unknown(c: Ctx) -> Iterable[Problem]:
    """A backend verl does not know: Tracking asserts '<name> is not supported' when the trainer starts, after Ray and
    the workers. Without `file`, no metrics.jsonl (VERL_FILE_LOGGER_PATH, grpo_lab/launch/prepare.py) for the report."""
    loggers, typed = _loggers(c), quote(c.cfg.trainer.logger)
    if bad := [x for x in loggers if x not in LOGGERS]:
        near = [x if x in LOGGERS else next(iter(difflib.get_close_matches(x, LOGGERS, n=1, cutoff=0.6)), None)
                for x in loggers]
        fixed = list(dict.fromkeys(x for x in near if x)) or ["console", "file"]
        yield error(f"trainer.logger={typed}: verl 0.9.1 knows no logger {', '.join(bad)} (it knows "
                    f"{', '.join(LOGGERS)}); its Tracking asserts '{bad[0]} is not supported' when the trainer "
                    f"starts, after Ray and the workers", f"'trainer.logger={quote(fixed)}'")
    elif "file" not in loggers:
        yield warn(f"trainer.logger={typed} leaves out verl's file logger: the job writes no metrics.jsonl, "
                   f"so `make report` will have no metrics", f"'trainer.logger={quote([*loggers, 'file'])}'")


@rule("logger_package_missing", kind="setup", phase="start-up", launching_only=True)
def logger_package_missing(c: Ctx) -> Iterable[Problem]:
    loggers = _loggers(c)
    if missing := [x for x in loggers if LOGGERS.get(x) and not facts.module_available(LOGGERS[x])]:
        keep = [x for x in loggers if x not in missing] or ["console", "file"]
        needs = ", ".join(f"{x} needs the {LOGGERS[x]} package" for x in missing)
        yield error(f"trainer.logger={quote(loggers)}: {needs}, not installed here; verl imports it when the trainer "
                    f"starts, after Ray and the workers (verl/utils/tracking.py). Install it, or log without it",
                    f"'trainer.logger={quote(keep)}'")


# ---- the machine (only when launching: Ray is about to start here) ---------------------------------------------

@rule("environment_skipped", kind="setup", phase="preflight")
def environment_skipped(c: Ctx) -> Iterable[Problem]:
    if not c.launching:
        yield note("environment checks skipped (not launching): flash-attn, the rollout engine and the loggers' "
                   "packages importable, visible GPUs >= n_gpus_per_node, the Ray cluster a `ray start` on this node "
                   "recorded for ray.init() to join; a plan through run.py lists what this machine lacks under 'Not "
                   "ready to launch here' instead of refusing")
    if (impl := attn_impl(c)[0]) in ("sdpa", "eager") and c.cfg.model.use_remove_padding:
        yield note(f"use_remove_padding with attn_implementation={impl} is correct because verl's FSDP engine "
                   f"calls the model with use_cache=False (tests/test_remove_padding.py pins it)")


@rule("padded_with_flash_attn", kind="setup", phase="preflight")
def padded_with_flash_attn(c: Ctx) -> Iterable[Problem]:
    impl = attn_impl(c)[0]
    if impl.startswith("flash") and not c.cfg.model.use_remove_padding:
        yield warn(f"actor_rollout_ref.model.use_remove_padding=false with attn_implementation={impl}: verl 0.9.1 "
                   f"then pads each micro-batch to its longest answer (its FSDP engine's prepare_model_inputs), while "
                   f"flash-attn's varlen kernel already attends within each answer of a packed one: the padding only "
                   f"adds tokens (padded micro-batches are for sdpa and eager, where they save the attention across "
                   f"answers: benchmarks/gpu/results/2026-12-06-h100-padded)", f"{A}model.use_remove_padding=true")


@rule("flash_attn_missing", kind="setup", phase="start-up", launching_only=True)
def flash_attn_missing(c: Ctx) -> Iterable[Problem]:
    impl, key = attn_impl(c)
    if not impl.startswith("flash_attention"):
        return
    mods = ("flash_attn_interface",) if impl == "flash_attention_3" else ("flash_attn", "flash_attn_2_cuda")
    if not all(facts.module_available(m) for m in mods):
        why = f"{key}={impl}" if key else f"verl's default when {A}model.override_config.attn_implementation is not set"
        yield error(f"the actor would load with attn_implementation={impl} ({why}), but the flash-attn "
                    f"package is not installed; verl fails when it builds the model. sdpa is correct with "
                    f"use_remove_padding (verl calls the model with use_cache=False)",
                    f"+{key or A + 'model.override_config.attn_implementation'}=sdpa")


@rule("rollout_engine_missing", kind="setup", phase="start-up", launching_only=True)
def rollout_engine_missing(c: Ctx) -> Iterable[Problem]:
    """verl imports the rollout engine where its rollout servers start, after Ray and the actor's model."""
    name = str(c.cfg.rollout.name)
    if name not in ("vllm", "sglang") or facts.module_available(name):
        return
    other = [f"{A}rollout.name={e}" for e in ("vllm", "sglang") if e != name and facts.module_available(e)]
    how = "as docs/sglang.md says" if name == "sglang" else "(make setup: verl[vllm] in .venv-gpu/bin/python)"
    yield error(f"{A}rollout.name={name}, and the {name} package is not installed here: verl imports it when it "
                f"starts the rollout servers, after Ray and the actor's model",
                ALT.join([*other, f"install {name} {how}"]))


@rule("visible_gpus", kind="setup", phase="start-up", launching_only=True)
def visible_gpus(c: Ctx) -> Iterable[Problem]:
    count, how = facts.visible_gpus(c.environ)
    want = c.batch["n_gpus_per_node"]
    c.batch["visible_gpus"] = count
    if count < want:
        yield error(f"trainer.n_gpus_per_node={want} but {count} CUDA GPU(s) are visible ({how}): Ray would wait for "
                    f"GPUs that never come", f"ngpus_per_node={count}" if count else
                    "run on the GPU machine, or check and plan here without GPUs: python run.py preflight.only=true "
                    "(make plan)")
