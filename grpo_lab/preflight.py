"""Preflight: refuse configs that will fail, explain the batch arithmetic and the memory plan, before Ray starts.

    from grpo_lab.preflight import run_preflight
    report = run_preflight(verl_cfg, lab_cfg, launching=True)
    print(report.format()); json.dump(report.to_json(), f)      # plan.json
    if not report.ok: sys.exit(1)

`verl_cfg` is the resolved config verl will receive (plain dict), `lab_cfg` grpo-lab's own `lab` section. Every
rule runs and every problem is collected. Each Problem names what is wrong, the numbers, and the override to try.

Fast on purpose (the whole `python run.py <bad config>` must refuse within ~2 s): this module imports neither verl,
torch, ray nor vllm. It reads verl's YAML/source text for the known keys, a parquet footer for the row count, and
/proc or `nvidia-smi -L` for the GPUs. The memory model is grpo_lab/memplan.py.

Rules (the `rule` id of a Problem):
  batch:        train_batch_vs_mini_batch, updates_per_step_integer, batch_divisibility, mini_batch_divisibility,
                micro_batch, log_prob_micro_batch, rollout_parallel
  tokens:       token_budget (error), token_budget_advice (note)
  pitfalls:     flash_attn_missing (launch), visible_gpus (launch), ray_cpus, ray_env_vars, dynamic_bsz_mismatch,
                model_key_unknown, gpu_memory_utilization_range, lora_load_format, dapo_filter_metric,
                thinking_response_length (warning), full_finetune_too_big, data_files (fewer rows than a batch),
                nccl_p2p (warning), model_arch_mismatch (warning)
  (missing data and model files are grpo_lab.inputs' to report)
  memory:       memory_generation, memory_training, memory_weight_sync, memory_host_ram, vllm_kv_cache
                (predicted OOM: error when preflight.strict, else warning; tight: warning)
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import math
import os
import re
import struct
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from grpo_lab import memplan
from grpo_lab.config import get as _get
from grpo_lab.inputs import local_files

# A Qwen3 chat model thinks first (<think>...</think>); the answer's "#### n" comes after the trace. Qwen's model card
# recommends output budgets of 32k tokens for thinking, and on GSM8K-level problems the traces commonly run past
# 1000 tokens (the guide: answers cut before "####" at its 1024). Below this many response tokens, warn.
THINKING_MIN_RESPONSE = 2048

A = "actor_rollout_ref."


@dataclass
class Problem:
    """One thing wrong: a short rule id, what is wrong with the numbers, and the override(s) that fix it."""

    rule: str
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class PreflightReport:
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    batch: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    title: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "memory": self.memory, "errors": [p.to_json() for p in self.errors],
                "warnings": [p.to_json() for p in self.warnings], "notes": list(self.notes)}

    def format(self) -> str:
        return _format(self)


# ---------------------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------------------

def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


class _Collector:
    def __init__(self, strict: bool):
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []
        self.notes: list[str] = []
        self.strict = strict

    def error(self, rule: str, message: str, fix: str = "") -> None:
        self.errors.append(Problem(rule, message, fix))

    def warn(self, rule: str, message: str, fix: str = "") -> None:
        self.warnings.append(Problem(rule, message, fix))

    def predicted_oom(self, rule: str, message: str, fix: str = "") -> None:
        """A predicted out-of-memory: an error under preflight.strict, else a warning."""
        if self.strict:
            self.error(rule, message + " (preflight.strict=false makes this a warning)", fix)
        else:
            self.warn(rule, message, fix)


# ---------------------------------------------------------------------------------------------------------------
# facts from the filesystem, cheaply
# ---------------------------------------------------------------------------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(buf: bytes, pos: int, ttype: int) -> int:
    """Skip one thrift-compact value of type `ttype`."""
    if ttype in (1, 2):          # bool inside a struct: value is in the type nibble
        return pos
    if ttype == 3:               # byte
        return pos + 1
    if ttype in (4, 5, 6):       # i16, i32, i64: varints
        return _varint(buf, pos)[1]
    if ttype == 7:               # double
        return pos + 8
    if ttype == 8:               # binary/string
        n, pos = _varint(buf, pos)
        return pos + n
    if ttype in (9, 10):         # list, set
        head = buf[pos]
        pos += 1
        size, etype = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        for _ in range(size):
            pos = pos + 1 if etype in (1, 2) else _skip(buf, pos, etype)
        return pos
    if ttype == 11:              # map
        size, pos = _varint(buf, pos)
        if size:
            kv = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(buf, pos, kv >> 4)
                pos = _skip(buf, pos, kv & 0x0F)
        return pos
    if ttype == 12:              # struct
        fid = 0
        while True:
            fid, ft, pos = _field_header(buf, pos, fid)
            if ft == 0:
                return pos
            pos = _skip(buf, pos, ft)
    raise ValueError(f"unknown thrift type {ttype}")


def _field_header(buf: bytes, pos: int, fid: int) -> tuple[int, int, int]:
    """The next field header of a thrift-compact struct: (field id, type, position after it); type 0 ends it."""
    head = buf[pos]
    pos += 1
    if head == 0:
        return fid, 0, pos
    delta, ft = head >> 4, head & 0x0F
    if delta:
        fid += delta
    else:
        raw, pos = _varint(buf, pos)
        fid = _zigzag(raw)
    return fid, ft, pos


def parquet_num_rows(path: str | os.PathLike) -> int:
    """Row count from a parquet file's footer (FileMetaData.num_rows), without pyarrow: reads only the footer.

    Falls back to pyarrow's metadata when the footer is not the plain thrift-compact kind (e.g. encrypted).
    """
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != b"PAR1":
            raise ValueError(f"{path} is not a plain parquet file")
        (footer_len,) = struct.unpack("<I", tail[:4])
        f.seek(size - 8 - footer_len)
        buf = f.read(footer_len)
    try:
        pos, fid = 0, 0
        while True:
            fid, ft, pos = _field_header(buf, pos, fid)
            if ft == 0:
                break
            if fid == 3 and ft == 6:  # FileMetaData.num_rows: i64
                raw, pos = _varint(buf, pos)
                return _zigzag(raw)
            pos = _skip(buf, pos, ft)
    except (IndexError, ValueError):
        pass
    import pyarrow.parquet as pq  # slow import (~0.3 s): only when the footer is unusual

    return int(pq.ParquetFile(path).metadata.num_rows)


def _proc_gpus() -> int | None:
    path = "/proc/driver/nvidia/gpus"
    try:
        return len([e for e in os.listdir(path) if not e.startswith(".")])
    except OSError:
        return None


def _smi_gpus() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def visible_gpus(environ: Mapping[str, str]) -> tuple[int, str]:
    """How many CUDA GPUs this process would see, without importing torch: (count, how it was found)."""
    physical, source = _proc_gpus(), "/proc/driver/nvidia/gpus"
    if physical is None:
        physical, source = _smi_gpus(), "nvidia-smi -L"
    if physical is None:
        physical, source = 0, "no NVIDIA driver found (/proc/driver/nvidia, nvidia-smi)"
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return physical, source
    entries = []
    for e in cvd.split(","):  # CUDA stops at the first invalid entry
        e = e.strip()
        if not e or e.startswith("-"):
            break
        entries.append(e)
    return min(len(entries), physical), f"CUDA_VISIBLE_DEVICES={cvd!r} of {physical} ({source})"


def machine_cpus() -> int:
    """CPUs Ray would find when num_cpus is null: the affinity mask, capped by a cgroup v2 quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def _module_available(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def known_model_keys() -> tuple[frozenset[str], str]:
    """Keys verl accepts under actor_rollout_ref.model: verl's model/hf_model.yaml + HFModelConfig's fields."""
    from grpo_lab.verl_paths import verl_config_dir

    root = verl_config_dir()
    if root is None:
        return frozenset(), "verl is not installed"
    keys: set[str] = set()
    sources = []
    yml = Path(root) / "model" / "hf_model.yaml"
    if yml.is_file():
        import yaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when there: ~20 ms less
        keys |= set((yaml.load(yml.read_text(), Loader=loader) or {}).keys())
        sources.append("verl/trainer/config/model/hf_model.yaml")
    src = Path(root).parent.parent / "workers" / "config" / "model.py"
    if src.is_file():
        tree = ast.parse(src.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "HFModelConfig":
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        keys.add(stmt.target.id)
        sources.append("HFModelConfig in verl/workers/config/model.py")
    return frozenset(k for k in keys if not k.startswith("__")), " + ".join(sources)


def _hf_cache_config(repo_id: str, environ: Mapping[str, str]) -> Path | None:
    """config.json of a hub model already in the local Hugging Face cache (what verl would download), if any."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        return None
    cache = environ.get("HF_HUB_CACHE") or os.path.join(
        environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    base = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    try:
        ref = (base / "refs" / "main").read_text().strip()
        cfg = base / "snapshots" / ref / "config.json"
        if cfg.is_file():
            return cfg
        return next(iter(sorted(base.glob("snapshots/*/config.json"))), None)
    except OSError:
        return None


def resolve_arch(verl: Mapping[str, Any], lab: Mapping[str, Any], environ: Mapping[str, str],
                 col: _Collector) -> memplan.Arch | None:
    """The model's architecture: local config.json > the Hugging Face cache > lab.model (the model group file)."""
    path = str(_get(verl, A + "model.hf_config_path") or _get(verl, A + "model.path") or "")
    local = Path(os.path.expanduser(path)) if path else None
    if local is not None and (local / "config.json").is_file():
        try:
            cfg = json.loads((local / "config.json").read_text())
            cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
            return memplan.Arch.from_mapping(cfg, source=str(local / "config.json"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            col.notes.append(f"could not read {local / 'config.json'} ({e}); using lab.model")
    cached = _hf_cache_config(path, environ) if path and not (local and local.exists()) else None
    if cached is not None:
        try:
            return memplan.Arch.from_mapping(json.loads(cached.read_text()), source=str(cached))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    m = _get(lab, "model", {}) or {}
    if all(m.get(k) is not None for k in memplan.Arch.FIELDS):
        hub = m.get("hub_id")
        if path and hub and path != hub and not (local and local.exists()):
            col.warn("model_arch_mismatch",
                     f"model_path is {path!r} but the model group is {m.get('name')!r} ({hub}); the memory plan and "
                     f"the thinking-mode check use {m.get('name')}'s architecture and flags",
                     "pick the model group that matches (e.g. model=qwen3_4b), or point model_path at a local folder "
                     "with its config.json")
        return memplan.Arch.from_mapping(m, source=f"lab.model ({m.get('name')})")
    col.notes.append("no architecture facts (no local config.json, no lab.model): memory plan skipped")
    return None


# ---------------------------------------------------------------------------------------------------------------
# batch arithmetic
# ---------------------------------------------------------------------------------------------------------------

def _batch(verl: Mapping[str, Any], col: _Collector) -> dict[str, Any]:
    n_gpus = max(1, _int(_get(verl, "trainer.n_gpus_per_node", 1), 1) * _int(_get(verl, "trainer.nnodes", 1), 1))
    sp = max(1, _int(_get(verl, A + "actor.ulysses_sequence_parallel_size", 1), 1))
    dp = max(1, n_gpus // sp)
    tb = _int(_get(verl, "data.train_batch_size", 0))
    n = _int(_get(verl, A + "rollout.n", 1), 1)
    mini = _int(_get(verl, A + "actor.ppo_mini_batch_size", 0))
    prompt = _int(_get(verl, "data.max_prompt_length", 0))
    resp = _int(_get(verl, "data.max_response_length", 0))
    tp = max(1, _int(_get(verl, A + "rollout.tensor_model_parallel_size", 1), 1))
    rdp = max(1, _int(_get(verl, A + "rollout.data_parallel_size", 1), 1))
    rpp = max(1, _int(_get(verl, A + "rollout.pipeline_model_parallel_size", 1), 1))
    traj = tb * n
    mini_traj = mini * n
    replica = tp * rdp * rpp
    replicas = n_gpus // replica if replica else 0
    b: dict[str, Any] = {
        "n_gpus": n_gpus,
        "data_parallel_size": dp,
        "train_batch_size": tb,
        "rollout_n": n,
        "ppo_mini_batch_size": mini,
        "ppo_epochs": _int(_get(verl, A + "actor.ppo_epochs", 1), 1),
        "trajectories_per_step": traj,
        "mini_batch_trajectories": mini_traj,
        "updates_per_step": (tb // mini if mini and tb % mini == 0 else round(tb / mini, 3) if mini else None),
        "trajectories_per_gpu": (mini_traj // dp if mini_traj % dp == 0 else round(mini_traj / dp, 3)),
        "trajectories_per_gpu_per_step": (traj // dp if traj % dp == 0 else round(traj / dp, 3)),
        "sequence_length": prompt + resp,
        "rollout_replicas": replicas,
        "trajectories_per_replica": math.ceil(traj / replicas) if replicas else None,
        "train_rows": None,
        "steps_per_epoch": None,
        "total_epochs": _int(_get(verl, "trainer.total_epochs", 1), 1),
        "total_training_steps": _get(verl, "trainer.total_training_steps"),
    }
    # rules
    if tb <= 0 or mini <= 0 or n <= 0:
        col.error("batch_divisibility", f"batch sizes must be positive: data.train_batch_size={tb}, "
                  f"actor.ppo_mini_batch_size={mini}, rollout.n={n}", "train_batch_size=128 ppo_mini_batch_size=64")
        return b
    if tb < mini:
        col.error("train_batch_vs_mini_batch",
                  f"the train batch ({tb} prompts) is smaller than the PPO mini-batch ({mini} prompts): there is not "
                  f"one full update per step", f"ppo_mini_batch_size={_best_mini(tb, mini, n, dp) or tb}")
    elif tb % mini:
        col.error("updates_per_step_integer",
                  f"the train batch ({tb} prompts) is not a whole number of PPO mini-batches ({mini}): "
                  f"{tb}/{mini} = {tb / mini:.2f} updates per step. verl's V1 trainer then pads the step with "
                  f"synthetic no-op samples up to lcm(data-parallel size, mini-batch x n) = "
                  f"{math.lcm(dp, mini_traj)} trajectories: compute spent on nothing",
                  f"ppo_mini_batch_size={_best_mini(tb, mini, n, dp) or tb}")
    if traj % dp:
        col.error("batch_divisibility",
                  f"{tb} prompts x {n} answers = {traj} trajectories per step do not split over the {dp} data-parallel "
                  f"GPUs ({traj}/{dp} = {traj / dp:.2f})",
                  f"train_batch_size={_round_to(tb, dp // math.gcd(dp, n))}")
    if mini_traj % dp:
        good = _best_mini(tb, mini, n, dp) or _round_to(mini, dp // math.gcd(dp, n))
        col.error("mini_batch_divisibility",
                  f"mini-batch {mini} x {n} = {mini_traj} trajectories do not split over the {dp} data-parallel GPUs "
                  f"({mini_traj}/{dp} = {mini_traj / dp:.2f} per GPU); verl normalises the mini-batch per GPU",
                  f"ppo_mini_batch_size={good}")
    if replica > n_gpus or n_gpus % replica:
        col.error("rollout_parallel",
                  f"a vLLM replica spans tensor_model_parallel_size {tp} x data_parallel_size {rdp} x pipeline {rpp} "
                  f"= {replica} GPUs, which does not divide the {n_gpus} GPUs",
                  f"rollout_tp={max(d for d in (1, 2, 4, 8) if n_gpus % d == 0 and d <= n_gpus)}")
    _micro_rules(verl, col, b, dp)
    return b


def _round_to(x: int, m: int) -> int:
    m = max(1, m)
    return max(m, int(round(x / m)) * m)


def _best_mini(tb: int, mini: int, n: int, dp: int) -> int | None:
    """The mini-batch closest to `mini` that divides the train batch and whose trajectories split over the GPUs."""
    ok = [m for m in range(1, tb + 1) if tb % m == 0 and (m * n) % dp == 0]
    return min(ok, key=lambda m: (abs(m - mini), -m)) if ok else None


def _micro_rules(verl: Mapping[str, Any], col: _Collector, b: dict[str, Any], dp: int) -> None:
    per_gpu_mini = b["mini_batch_trajectories"] / dp
    per_gpu_step = b["trajectories_per_step"] / dp
    if not _get(verl, A + "actor.use_dynamic_bsz", False):
        micro = _get(verl, A + "actor.ppo_micro_batch_size_per_gpu")
        old = _get(verl, A + "actor.ppo_micro_batch_size")
        if old is not None:
            col.error("micro_batch",
                      f"actor.ppo_micro_batch_size={old} is the deprecated global form; verl wants the per-GPU "
                      f"actor.ppo_micro_batch_size_per_gpu (performance sizes are local per GPU)",
                      f"~actor_rollout_ref.actor.ppo_micro_batch_size "
                      f"ppo_micro_batch_size_per_gpu={max(1, _int(old) // dp)}")
        if micro is None and old is None:
            col.error("micro_batch", "dynamic batch size is off and actor.ppo_micro_batch_size_per_gpu is not set",
                      "ppo_micro_batch_size_per_gpu=2 (or actor_rollout_ref.actor.use_dynamic_bsz=true)")
        elif micro is not None:
            micro = _int(micro)
            if micro <= 0:
                col.error("micro_batch", f"actor.ppo_micro_batch_size_per_gpu={micro} must be positive",
                          "ppo_micro_batch_size_per_gpu=2")
            elif micro > per_gpu_mini:
                col.error("micro_batch",
                          f"the micro-batch ({micro} per GPU) is larger than the mini-batch's share of a GPU "
                          f"({_num(per_gpu_mini)} trajectories)",
                          f"ppo_micro_batch_size_per_gpu={max(1, int(per_gpu_mini))}")
            elif per_gpu_mini.is_integer() and int(per_gpu_mini) % micro:
                col.error("micro_batch",
                          f"each GPU's {int(per_gpu_mini)} trajectories per mini-batch do not split into micro-batches "
                          f"of {micro}: verl requires the per-GPU mini-batch to be divisible by the micro-batch",
                          f"ppo_micro_batch_size_per_gpu={_divisor_le(int(per_gpu_mini), micro)}")
            b["micro_batches_per_update"] = (int(per_gpu_mini) // micro) if micro > 0 else None
    for role, key in (("rollout", "rollout"), ("ref", "ref")):
        if not _get(verl, A + f"{key}.log_prob_use_dynamic_bsz", False):
            micro = _get(verl, A + f"{key}.log_prob_micro_batch_size_per_gpu")
            if micro is None:
                if key == "ref" and not _ref_used(verl):
                    continue
                col.error("log_prob_micro_batch",
                          f"{key}.log_prob_use_dynamic_bsz is off and {key}.log_prob_micro_batch_size_per_gpu is "
                          f"not set", f"actor_rollout_ref.{key}.log_prob_micro_batch_size_per_gpu=4")
            elif per_gpu_step.is_integer() and int(per_gpu_step) % max(1, _int(micro)):
                col.error("log_prob_micro_batch",
                          f"each GPU's {int(per_gpu_step)} trajectories per step do not split into log-prob "
                          f"micro-batches of {micro} ({key}.log_prob_micro_batch_size_per_gpu)",
                          f"actor_rollout_ref.{key}.log_prob_micro_batch_size_per_gpu="
                          f"{_divisor_le(int(per_gpu_step), _int(micro))}")


def _divisor_le(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def _ref_used(verl: Mapping[str, Any]) -> bool:
    return bool(_get(verl, A + "actor.use_kl_loss", False)) or bool(_get(verl, "algorithm.use_kl_in_reward", False))


def _steps(verl: Mapping[str, Any], b: dict[str, Any], lab: Mapping[str, Any], col: _Collector) -> None:
    files = local_files(_get(verl, "data.train_files"))
    if files is None:
        col.notes.append("data.train_files is remote: steps per epoch unknown until verl reads it")
        return
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:  # a missing file is grpo_lab.inputs' to report (with the command that makes it)
        make = _get(lab, "dataset.make")
        col.notes.append(f"train file not there yet ({', '.join(missing)}): steps_per_epoch unknown"
                         + (f"; make it with `{make}`" if make else ""))
        return
    try:
        rows = sum(parquet_num_rows(f) for f in files)
    except (OSError, ValueError, ImportError) as e:
        col.notes.append(f"could not read the row count of {files} ({e})")
        return
    b["train_rows"] = rows
    tb = b["train_batch_size"]
    if tb > 0:
        b["steps_per_epoch"] = rows // tb  # verl's train dataloader drops the last partial batch
        if b["total_training_steps"] is None:
            b["total_training_steps"] = b["steps_per_epoch"] * b["total_epochs"]
        if rows < tb:
            col.error("data_files", f"the train file has {rows} rows, fewer than one train batch ({tb}): verl's "
                      f"dataloader (drop_last) yields no step", f"train_batch_size={max(1, rows)}")


# ---------------------------------------------------------------------------------------------------------------
# token budgets
# ---------------------------------------------------------------------------------------------------------------

def _tokens(verl: Mapping[str, Any], b: dict[str, Any], col: _Collector) -> None:
    seq = b["sequence_length"]
    budgets = {}
    checks = [("actor", "actor.use_dynamic_bsz", "actor.ppo_max_token_len_per_gpu", "ppo_max_token_len_per_gpu",
               "the actor update")]
    checks.append(("rollout", "rollout.log_prob_use_dynamic_bsz", "rollout.log_prob_max_token_len_per_gpu",
                   "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "the old-log-prob pass"))
    if _ref_used(verl):
        checks.append(("ref", "ref.log_prob_use_dynamic_bsz", "ref.log_prob_max_token_len_per_gpu",
                       "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "the reference log-prob pass"))
    for name, dyn_key, key, override, what in checks:
        if not _get(verl, A + dyn_key, False):
            continue
        budget = _int(_get(verl, A + key, 0))
        budgets[name] = budget
        if budget < seq:
            col.error("token_budget",
                      f"{A}{key}={budget} cannot hold one full sequence of max_prompt_length + max_response_length "
                      f"= {seq} tokens: verl asserts max_token_len >= the longest sequence, so {what} fails the first "
                      f"time a long answer appears (mid-run)", f"{override}={seq}")
        elif budget < 2 * seq:
            col.notes.append(
                f"{key}={budget} is below 2 x (prompt + response) = {2 * seq}: verl's tuning guide advises "
                f"ppo_max_token_len_per_gpu >= 2 x (max_prompt_length + max_response_length) so that a micro-batch "
                f"packs at least two full sequences (the official script's 3000 is a cautious choice on 32 GB cards; "
                f"raise it if memory allows)")
    b["token_budgets"] = budgets
    if "actor" in budgets:
        per_gpu_tokens = b["trajectories_per_gpu"] * seq if isinstance(b["trajectories_per_gpu"], int) else None
        if per_gpu_tokens:
            b["max_tokens_per_gpu_per_update"] = per_gpu_tokens
            b["micro_batches_per_update_max"] = math.ceil(per_gpu_tokens / max(1, budgets["actor"]))


# ---------------------------------------------------------------------------------------------------------------
# pitfalls
# ---------------------------------------------------------------------------------------------------------------

def _attn_impl(verl: Mapping[str, Any]) -> str:
    override = _get(verl, A + "model.override_config", {}) or {}
    if isinstance(override, Mapping):
        inner = override.get("model_config") if isinstance(override.get("model_config"), Mapping) else override
        return str(inner.get("attn_implementation") or "flash_attention_2")
    return "flash_attention_2"


def _pitfalls(verl: Mapping[str, Any], lab: Mapping[str, Any], b: dict[str, Any], launching: bool,
              environ: Mapping[str, str], col: _Collector) -> None:
    # gpu_memory_utilization in (0, 1)
    util = _get(verl, A + "rollout.gpu_memory_utilization")
    try:
        u = float(util)
    except (TypeError, ValueError):
        u = None
    if u is None or not 0.0 < u < 1.0:
        col.error("gpu_memory_utilization_range",
                  f"actor_rollout_ref.rollout.gpu_memory_utilization={util!r} is outside (0, 1): it is the fraction of "
                  f"each card's total memory vLLM may take (on 32 GB cards the guide starts at 0.4)",
                  "rollout_gpu_mem_util=0.4")

    # Ray CPU budget
    n_gpus = b["n_gpus"]
    v1 = bool(_get(verl, "trainer.use_v1", True))
    units = _int(_get(verl, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8), 8)
    storage = _get(verl, "transfer_queue.backend.storage_backend", "SimpleStorage")
    units = units if storage == "SimpleStorage" else 0
    needed = 3 * n_gpus + 1 + ((1 + units) if v1 else 0)
    num_cpus = _get(verl, "ray_kwargs.ray_init.num_cpus")
    if num_cpus is not None:
        have, source = _int(num_cpus), f"ray_kwargs.ray_init.num_cpus={num_cpus}"
    elif launching:
        have, source = machine_cpus(), "this machine's CPUs (ray_kwargs.ray_init.num_cpus is null)"
    else:
        have = _int(_get(lab, "hardware.cpu_cores", 0))
        source = f"lab.hardware.cpu_cores={have} (ray_kwargs.ray_init.num_cpus is null: Ray takes the machine's cores)"
    b["ray_cpus"] = {"needed": needed, "available": have, "source": source, "use_v1": v1}
    if have and needed > have:
        how = (f"3 per GPU x {n_gpus} + 1 TaskRunner + 1 TransferQueue controller + {units} storage units"
               if v1 else f"3 per GPU x {n_gpus} + 1 TaskRunner")
        fixes = []
        if v1 and units > 1 and have - 3 * n_gpus - 2 >= 1:
            fixes.append(f"transfer_queue.backend.SimpleStorage.num_data_storage_units={have - 3 * n_gpus - 2}")
        fixes.append(f"ray_kwargs.ray_init.num_cpus={needed}")
        if v1:
            fixes.append("trainer.use_v1=false")
        col.error("ray_cpus",
                  f"Ray's CPU budget cannot hold the job: it needs {needed} CPUs ({how}) but has {have} ({source}). "
                  f"Ray's placement groups then wait forever: verl prints its config and hangs silently (seen on the "
                  f"H200: num_cpus=8 hung for 8 minutes, 16 ran)", "  or  ".join(fixes))

    # Ray env vars must be strings
    env_vars = _get(verl, "ray_kwargs.ray_init.runtime_env.env_vars", {}) or {}
    if isinstance(env_vars, Mapping):
        for k, v in env_vars.items():
            if not isinstance(v, str):
                col.error("ray_env_vars",
                          f"ray_kwargs.ray_init.runtime_env.env_vars.{k}={v!r} is a {type(v).__name__}: Ray's "
                          f"runtime_env takes string values only and ray.init fails",
                          f"'ray_kwargs.ray_init.runtime_env.env_vars.{k}=\"{_env_str(v)}\"'")

    # dynamic batch settings that disagree
    actor_dyn = bool(_get(verl, A + "actor.use_dynamic_bsz", False))
    others = {"rollout": bool(_get(verl, A + "rollout.log_prob_use_dynamic_bsz", False))}
    if _ref_used(verl):
        others["ref"] = bool(_get(verl, A + "ref.log_prob_use_dynamic_bsz", False))
    wrong = [k for k, v in others.items() if v != actor_dyn]
    if wrong:
        val = "true" if actor_dyn else "false"
        col.error("dynamic_bsz_mismatch",
                  f"actor.use_dynamic_bsz={str(actor_dyn).lower()} but "
                  + ", ".join(f"{k}.log_prob_use_dynamic_bsz={str(others[k]).lower()}" for k in wrong)
                  + ": the update and the log-prob passes batch differently, and verl validates the log-prob "
                    "micro-batch sizes only when the actor's dynamic batching is off, so a missing one fails inside "
                    "the workers after start-up",
                  " ".join(f"actor_rollout_ref.{k}.log_prob_use_dynamic_bsz={val}" for k in wrong))

    # misspelt keys under actor_rollout_ref.model
    model_cfg = _get(verl, A + "model", {}) or {}
    known, source = known_model_keys()
    if known and isinstance(model_cfg, Mapping):
        for key in model_cfg:
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                fix = f"~actor_rollout_ref.model.{key}" + (
                    f" actor_rollout_ref.model.{close[0]}={_override_value(model_cfg[key])}" if close else "")
                col.error("model_key_unknown",
                          f"actor_rollout_ref.model.{key} is not a key verl knows ({source}){hint} verl would "
                          f"fail on it inside a worker, after Ray and the model have started", fix)
    elif not known:
        col.notes.append(f"actor_rollout_ref.model keys not checked: {source}")

    # LoRA needs safetensors loading in the rollout
    lora = _int(_get(verl, A + "model.lora_rank", 0)) or _int(_get(verl, A + "model.lora.rank", 0))
    load_format = str(_get(verl, A + "rollout.load_format", "dummy"))
    if lora > 0 and load_format != "safetensors":
        col.error("lora_load_format",
                  f"LoRA (lora_rank={lora}) with actor_rollout_ref.rollout.load_format={load_format}: verl's LoRA "
                  f"recipe loads the base weights into vLLM from the checkpoint (safetensors); with "
                  f"{load_format!r} vLLM starts without them", "actor_rollout_ref.rollout.load_format=safetensors")

    # DAPO group filtering
    fg = _get(verl, "algorithm.filter_groups", {}) or {}
    if isinstance(fg, Mapping) and fg.get("enable"):
        metric = fg.get("metric")
        manager = _get(verl, "reward.reward_manager.name", "naive")
        if not metric:
            col.error("dapo_filter_metric",
                      "algorithm.filter_groups.enable=true without algorithm.filter_groups.metric: DAPO's dynamic "
                      "sampling has nothing to compare the answers of a group by (verl raises after start-up)",
                      "algorithm.filter_groups.metric=acc (with variant=dapo's reward manager) or "
                      "algorithm.filter_groups.metric=reward")
        elif metric not in ("reward",) and manager != "dapo":
            col.warn("dapo_filter_metric",
                     f"algorithm.filter_groups.metric={metric!r} must be reported by the reward function's extra "
                     f"info; the {manager!r} reward manager reports only the score (metric 'reward'): verl stops with "
                     f"'Finished groups are missing DAPO metric' after the first generation",
                     "algorithm.filter_groups.metric=reward  or  reward.reward_manager.name=dapo")

    # Qwen3 thinking mode vs response length
    thinking = bool(_get(lab, "model.thinking", False))
    path = str(_get(verl, A + "model.path", ""))
    if path.rstrip("/").lower().endswith("-base"):
        thinking = False
    tmpl = _get(verl, "data.apply_chat_template_kwargs", {}) or {}
    if isinstance(tmpl, Mapping) and tmpl.get("enable_thinking") is False:
        thinking = False
    resp = _int(_get(verl, "data.max_response_length", 0))
    if thinking and resp < THINKING_MIN_RESPONSE:
        name = _get(lab, "model.name", "the model")
        base = {"qwen3_1_7b": "model=qwen3_1_7b_base", "qwen3_4b": "model=qwen3_4b_base"}.get(str(name),
                                                                                             "model=qwen3_1_7b_base")
        col.warn("thinking_response_length",
                 f"{name} is a Qwen3 chat model with thinking on, and max_response_length={resp} is below "
                 f"{THINKING_MIN_RESPONSE}: Qwen3 reasons in <think>...</think> before answering, and on GSM8K-level "
                 f"problems those traces often run past 1000 tokens (Qwen recommends budgets of up to 32k for "
                 f"thinking), so many answers are cut before '#### n' and score 0. Watch response_length/clip_ratio",
                 f"max_response_length={THINKING_MIN_RESPONSE}  or  {base}  or  "
                 f"+data.apply_chat_template_kwargs.enable_thinking=false")

    # NCCL without P2P on GeForce cards
    if _get(lab, "hardware.p2p", True) is False and n_gpus > 1:
        set_in = (isinstance(env_vars, Mapping) and "NCCL_P2P_DISABLE" in env_vars) or "NCCL_P2P_DISABLE" in environ
        if not set_in:
            col.warn("nccl_p2p",
                     f"{_get(lab, 'hardware.name', 'this hardware')} has no GPU peer-to-peer (lab.hardware.p2p=false): "
                     f"NCCL can hang at initialisation unless NCCL_P2P_DISABLE=1 reaches the Ray workers",
                     "'+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_P2P_DISABLE=\"1\"'")

    # environment (only when launching)
    if launching:
        impl = _attn_impl(verl)
        if impl.startswith("flash_attention"):
            mods = ("flash_attn_interface",) if impl == "flash_attention_3" else ("flash_attn", "flash_attn_2_cuda")
            if not all(_module_available(m) for m in mods):
                col.error("flash_attn_missing",
                          f"the actor would load with attn_implementation={impl} (verl's default when "
                          f"actor_rollout_ref.model.override_config.attn_implementation is not set), but the "
                          f"flash-attn package is not installed; verl fails when it builds the model. sdpa is "
                          f"correct with use_remove_padding (verl calls the model with use_cache=False)",
                          "+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
        count, how = visible_gpus(environ)
        want = _int(_get(verl, "trainer.n_gpus_per_node", 1), 1)
        b["visible_gpus"] = count
        if count < want:
            col.error("visible_gpus",
                      f"trainer.n_gpus_per_node={want} but {count} CUDA GPU(s) are visible ({how}): Ray would wait "
                      f"for GPUs that never come", f"ngpus_per_node={count}" if count else
                      "run on the GPU machine, or check and plan here without GPUs: python run.py preflight.only=true (make plan)")
    else:
        col.notes.append("environment checks skipped (not launching): flash-attn importable, visible GPUs >= "
                         "n_gpus_per_node")
    if _attn_impl(verl) in ("sdpa", "eager") and _get(verl, A + "model.use_remove_padding", False):
        col.notes.append(f"use_remove_padding with attn_implementation={_attn_impl(verl)} is correct because verl's "
                         f"FSDP engine calls the model with use_cache=False (tests/test_remove_padding.py pins it)")


def _env_str(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return "" if v is None else str(v)


def _override_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return str(v)
    if v is None:
        return "null"
    return json.dumps(v) if not isinstance(v, str) else v


# ---------------------------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------------------------

def _memory(verl: Mapping[str, Any], lab: Mapping[str, Any], environ: Mapping[str, str],
            col: _Collector) -> dict[str, Any]:
    arch = resolve_arch(verl, lab, environ, col)
    if arch is None:
        return {}
    s = memplan.settings_from_verl(verl, lab)
    if s.card_gb <= 0:
        col.notes.append("lab.hardware.gpu_memory_gb is not set: memory plan skipped")
        return {"params": arch.params(), "architecture_source": arch.source}
    util_ok = 0.0 < s.gpu_memory_utilization < 1.0
    if not util_ok:  # reported by gpu_memory_utilization_range; plan the rest with the guide's 0.4
        s = replace(s, gpu_memory_utilization=0.4)
        col.notes.append("memory plan made with gpu_memory_utilization 0.4 (the configured value is out of range)")
    plan = memplan.memory_plan(arch, s)
    card = s.card_gb
    rem = plan.get("remedies", {})

    for phase, opts in list(rem.items()):  # once some remedy ends the OOM, drop those that do not
        if any(o["verdict"] != "oom" for o in opts):
            rem[phase] = [o for o in opts if o["verdict"] != "oom"]

    def fix_for(phase: str) -> str:
        opts = rem.get(phase, [])
        good = [r for r in opts if r["verdict"] == "fits"] or [r for r in opts if r["verdict"] == "tight"]
        return good[0]["override"] if good else (opts[0]["override"] if opts else "")

    def alternatives(phase: str) -> str:
        opts = rem.get(phase, [])
        if not opts:
            return ""
        return " Remedies (guide's order), predicted peak after each: " + "; ".join(
            f"{r['override']} -> {r['peak_gb_per_gpu']} GB {r['verdict']}" for r in opts) + "."

    # full fine-tuning far too big: point at LoRA
    state_full = plan["actor_state_full_gb_per_gpu"]
    if s.lora_rank == 0 and state_full > memplan.TIGHT_FRACTION * card:
        pointer = "model=qwen3_8b_lora" if arch.params() > 6e9 else (
            "actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32 "
            "actor_rollout_ref.rollout.load_format=safetensors")
        col.predicted_oom(
            "full_finetune_too_big",
            f"full fine-tuning of a {arch.params() / 1e9:.1f}B-parameter model needs 16 B per parameter for its "
            f"weights, gradients and Adam state: {state_full:.1f} GB per GPU over {s.fsdp} GPUs, against "
            f"{card:g} GB cards, before any activation. verl loads all of it for the update even with offload. "
            f"The guide: 8B and above only with LoRA (plus offload)", pointer)

    kv = plan["kv_cache"]
    if kv["tokens"] <= 0:
        col.predicted_oom(
            "vllm_kv_cache",
            f"vLLM's budget gpu_memory_utilization {s.gpu_memory_utilization} x {card:g} GB = {kv['budget_gb']} GB "
            f"cannot hold its own weights ({kv['vllm_weights_gb']} GB at TP {s.tp}) and activations "
            f"({kv['vllm_activation_gb']} GB): no room for a KV cache, vLLM refuses to start", fix_for("generation"))
    elif not kv["fits_max_model_len"]:
        col.predicted_oom(
            "vllm_kv_cache",
            f"vLLM's KV cache ({kv['kv_cache_gb']} GB = {kv['tokens']} tokens) cannot hold one sequence of "
            f"max_model_len={kv['max_model_len']} tokens, and vLLM refuses to start. rollout.max_model_len is null, "
            f"so verl uses the model's max_position_embeddings; GRPO here never generates past prompt + response "
            f"= {kv['sequence_length']}", f"actor_rollout_ref.rollout.max_model_len={kv['sequence_length']}")

    names = {"generation": "generation", "training": "training", "weight_sync": "weight-sync"}
    for phase, label in names.items():
        ph = plan["phases"][phase]
        v = plan["verdict"][phase]
        parts = " + ".join(f"{k.replace('_', ' ')} {val}" for k, val in ph["components_gb"].items() if val)
        if phase == "training":
            parts = f"{ph['peak_of']}: {parts}"
        if v == "oom":
            if phase == "generation" and ph["peak_gb_per_gpu"] <= card:
                continue  # the KV-cache problem above says why
            col.predicted_oom(f"memory_{phase}",
                              f"{label} phase: predicted peak {ph['peak_gb_per_gpu']} GB per GPU on {card:g} GB cards "
                              f"({parts}).{alternatives(phase)}", fix_for(phase))
        elif v == "tight":
            col.warn(f"memory_{phase}",
                     f"{label} phase is tight: predicted peak {ph['peak_gb_per_gpu']} GB of {card:g} GB "
                     f"(> {int(memplan.TIGHT_FRACTION * 100)}%; the plan is within ~15%) ({parts})."
                     f"{alternatives(phase)}",
                     fix_for(phase))
    host = plan["host_ram"]
    if host["verdict"] == "oom":
        col.predicted_oom("memory_host_ram",
                          f"host RAM: predicted {host['total_gb']} GB of {host['capacity_gb']} GB "
                          f"({', '.join(f'{k} {v}' for k, v in host['components_gb'].items() if v)})."
                          f"{alternatives('host_ram')}", fix_for("host_ram"))
    elif host["verdict"] == "tight":
        col.warn("memory_host_ram", f"host RAM is tight: predicted {host['total_gb']} GB of {host['capacity_gb']} GB",
                 fix_for("host_ram"))
    return plan


# ---------------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------------

def run_preflight(verl: dict, lab: dict, *, launching: bool, environ: Mapping[str, str] | None = None
                  ) -> PreflightReport:
    """Check a resolved verl config (plain dict) and grpo-lab's `lab` dict; collect every problem.

    launching=True: Ray is about to start here, so the environment checks run too (flash-attn importable, visible
    GPUs, the machine's CPUs when ray num_cpus is null); launching=False (preflight.only on any machine) skips
    them and says so in the notes.
    """
    environ = os.environ if environ is None else environ
    verl = verl or {}
    lab = lab or {}
    col = _Collector(strict=bool(_get(lab, "preflight.strict", True)))
    report = PreflightReport()
    report.title = (f"{_get(lab, 'model.name', _get(verl, A + 'model.path', '?'))} on "
                    f"{_get(lab, 'hardware.name', '?')}, variant {_get(lab, 'variant', '?')}")
    stages = [
        ("batch arithmetic", lambda: report.batch.update(_batch(verl, col))),
        ("steps per epoch", lambda: _steps(verl, report.batch, lab, col)),
        ("token budgets", lambda: _tokens(verl, report.batch, col)),
        ("pitfalls", lambda: _pitfalls(verl, lab, report.batch, launching, environ, col)),
        ("memory plan", lambda: report.memory.update(_memory(verl, lab, environ, col))),
    ]
    for name, stage in stages:
        try:
            stage()
        except Exception as e:  # a check must never take the launcher down; say what was skipped
            col.notes.append(f"{name}: check skipped after an internal error ({type(e).__name__}: {e})")
    report.errors, report.warnings, report.notes = col.errors, col.warnings, col.notes
    return report


# ---------------------------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------------------------

def _format(r: PreflightReport) -> str:
    out = [f"grpo-lab preflight: {r.title}" if r.title else "grpo-lab preflight"]
    b = r.batch
    if b.get("train_batch_size"):
        out.append("")
        out.append("Batch arithmetic")
        dp = b["data_parallel_size"]
        out.append(f"  {b['train_batch_size']} prompts x {b['rollout_n']} answers = {b['trajectories_per_step']} "
                   f"trajectories per step ({_num(b['trajectories_per_gpu_per_step'])} per GPU over {dp} "
                   f"data-parallel GPUs)")
        if b.get("ppo_mini_batch_size"):
            out.append(f"  mini-batch {b['ppo_mini_batch_size']} x {b['rollout_n']} = {b['mini_batch_trajectories']} "
                       f"trajectories -> {_num(b['updates_per_step'] or 0)} actor update(s) per step"
                       + (f" x {b['ppo_epochs']} epochs" if b.get("ppo_epochs", 1) != 1 else ""))
            out.append(f"  {b['mini_batch_trajectories']} / {dp} GPUs = {_num(b['trajectories_per_gpu'])} "
                       f"trajectories per GPU per mini-batch (algorithm sizes are global, micro-batch and token "
                       f"budgets are per GPU)")
        if b.get("token_budgets", {}).get("actor"):
            out.append(f"  actor token budget {b['token_budgets']['actor']} per micro-batch on each GPU; sequences up "
                       f"to {b['sequence_length']} tokens"
                       + (f"; up to {b['micro_batches_per_update_max']} micro-batches per update"
                          if b.get("micro_batches_per_update_max") else ""))
        if b.get("rollout_replicas"):
            out.append(f"  {b['rollout_replicas']} vLLM replica(s): {b['trajectories_per_replica']} trajectories each "
                       f"per step")
        if b.get("steps_per_epoch") is not None:
            out.append(f"  {b['train_rows']} train rows / {b['train_batch_size']} = {b['steps_per_epoch']} steps per "
                       f"epoch (last partial batch dropped) x {b['total_epochs']} epochs -> "
                       f"{b['total_training_steps']} steps")
        rc = b.get("ray_cpus")
        if rc:
            out.append(f"  Ray CPUs: {rc['needed']} needed, {rc['available']} available ({rc['source']})")
    m = r.memory
    if m.get("phases"):
        out.append("")
        size = f"{m['params_b']}B" if m["params"] >= 1e8 else f"{m['params'] / 1e6:.1f}M"
        out.append(f"Memory plan per GPU ({m['card_gb']:g} GB cards, {m['n_gpus']} GPU(s), FSDP over {m['fsdp_size']}; "
                   f"{size} params from {m['architecture_source']})")
        out.append(f"  actor state {m['actor_state_gb_per_gpu']} GB per GPU (16 B per trained parameter / "
                   f"{m['fsdp_size']}, minus offloaded)")
        out.append(f"  {'phase':<12} {'peak GB':>8}  {'verdict':<7}  what")
        for phase in ("generation", "training", "weight_sync"):
            ph = m["phases"][phase]
            parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ph["components_gb"].items() if v)
            if phase == "training":
                parts = f"{ph['peak_of']}: {parts}"
            out.append(f"  {phase.replace('_', ' '):<12} {ph['peak_gb_per_gpu']:>8}  {ph['verdict']:<7}  {parts}")
        kv = m["kv_cache"]
        waves = kv["waves"] if kv["waves"] is not None else "-"
        out.append(f"  KV cache {kv['kv_cache_gb']} GB = {kv['tokens']} tokens = {kv['sequences']} sequences of "
                   f"{kv['sequence_length']}; {kv['trajectories_per_replica']} trajectories per replica -> {waves} "
                   f"wave(s); max_model_len {kv['max_model_len']}")
        h = m["host_ram"]
        cap = f" of {h['capacity_gb']:g} GB" if h.get("capacity_gb") else ""
        out.append(f"  host RAM {h['total_gb']} GB{cap}: {h['verdict']}")
        out.append(f"  overall: {m['verdict']['overall']}")
        for phase, opts in (m.get("remedies") or {}).items():
            if opts:
                out.append(f"  remedies for {phase.replace('_', ' ')}:")
                for o in opts:
                    out.append(f"    {o['override']}  -> {o['peak_gb_per_gpu']} GB {o['verdict']}")
    for title, items in (("Errors", r.errors), ("Warnings", r.warnings)):
        if items:
            out.append("")
            out.append(f"{title} ({len(items)})")
            for p in items:
                out.append(f"  [{p.rule}] {p.message}")
                if p.fix:
                    out.append(f"      fix: {p.fix}")
    if r.notes:
        out.append("")
        out.append("Notes")
        out.extend(f"  - {n}" for n in r.notes)
    out.append("")
    out.append("preflight: " + ("OK" if r.ok else f"REFUSED ({len(r.errors)} error(s))"))
    return "\n".join(out)
