"""grpo-lab's own config sections, typed: `lab` (hardware, model facts, dataset, ...) and `preflight` (docs/cli.md)."""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, get_type_hints


@dataclass
class Emulate:  # a smaller card rehearsed on a bigger one (grpo_lab/memory/emulate.py)
    real_gpu_memory_gb: float | None = None  # GiB of the cards the job really runs on; None: no emulation
    real_gpu_name: str | None = None


@dataclass
class Hardware:  # a conf/hardware option: one node's cards and host (ray_cluster: each node's)
    name: str | None = None
    gpu_name: str | None = None
    gpu_memory_gb: float | None = None  # one card, GiB as CUDA reports it; 0, negative or None: unknown
    interconnect: str | None = None  # nvlink | pcie4 | single
    nvlink: bool | None = None
    p2p: bool | None = None  # GPU peer-to-peer (false: NCCL needs NCCL_P2P_DISABLE=1)
    cpu_cores: int | None = None  # of one node: Ray's CPUs when ray_init.num_cpus is null (facts.ray_cpus_needed)
    host_ram_gb: int | None = None  # whole GiB of one node's RAM (the SLURM launcher's mem_gb)
    pcie_gb_s: float | None = None  # host<->card GB/s for offload; None: assumed from interconnect (make fit)
    bf16_tflops: float | None = None  # one card's published dense bf16 TFLOP/s (the time plan scales by it)
    memory_gb_s: float | None = None  # one card's published memory bandwidth, GB/s
    emulate: Emulate = field(default_factory=Emulate)


@dataclass
class ModelFacts:  # a conf/model option: names, and the architecture planned when no config.json is found
    name: str | None = None
    hub_id: str | None = None
    thinking: bool | None = None  # a chat model that thinks by default (Qwen3)
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    max_position_embeddings: int | None = None  # tokens


@dataclass
class Dataset:
    name: str | None = None
    make: str | None = None  # the command that writes its files
    prompt_tokens: float | None = None  # mean prompt tokens under the chat template (time plan); None: half the limit
    train_rows: int | None = None  # the published split sizes, for plans made before the files exist
    test_rows: int | None = None


@dataclass
class Slurm:  # a SLURM job of several nodes: the Ray cluster its first node starts (grpo_lab/launch/slurm.py)
    ray_port: int = 6379
    ray_wait_s: int = 300  # seconds for every node to join


@dataclass
class Wandb:
    mode: str = "offline"


@dataclass
class LabConf:  # conf's `lab`
    hardware: Hardware = field(default_factory=Hardware)
    model: ModelFacts = field(default_factory=ModelFacts)
    dataset: Dataset = field(default_factory=Dataset)
    variant: str | None = None
    reward_fn: str | None = None
    slurm: Slurm = field(default_factory=Slurm)
    wandb: Wandb = field(default_factory=Wandb)
    checkpoint_root: str | None = None


@dataclass
class Preflight:  # conf's `preflight` (grpo_lab/checks/preflight.py, make plan / make fit)
    only: bool = False
    strict: bool = True
    fit: bool = False
    fit_write: str | None = None
    fit_overwrite: bool = False
    verbose: bool = False


@dataclass
class Lab(LabConf):
    """One job's typed view: `lab`, `preflight`, and what the job's stages add before the preflight reads it."""

    preflight: Preflight = field(default_factory=Preflight)
    set_apart: dict[str, Any] = field(default_factory=dict)  # {short key: verl keys set on their own} (cli/knobs.py)
    side_by_side_jobs: int = 1  # hydra/launcher=side_by_side: jobs sharing the cards
    micro_batch: dict[str, Any] = field(default_factory=dict)  # what the micro-batch settling did
    side_by_side_kv_pin: dict[str, Any] | None = None  # {"bytes", "by": "launcher" | "user"}
    ray_cluster: dict[str, Any] | None = None  # the Ray cluster a SLURM job of several nodes starts

    @classmethod
    def of(cls, lab: Mapping[str, Any] | None = None, **more: Any) -> "Lab":
        """From plain (resolved) data; keys it does not know are left out (a run folder's older config)."""
        return _build(cls, {**(lab or {}), **more})


def _build(cls: Any, data: Mapping[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kw = {}
    for f in fields(cls):
        v = data.get(f.name)
        if is_dataclass(hints[f.name]):
            kw[f.name] = _build(hints[f.name], v if isinstance(v, Mapping) else {})
        elif f.name in data and (v is not None or f.default is None):
            kw[f.name] = v
    return cls(**kw)


def store() -> None:
    """The schemas conf/config.yaml's defaults list names (`lab_schema`, `preflight_schema`), in Hydra's store."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="lab_schema", node=LabConf, package="lab")
    cs.store(name="preflight_schema", node=Preflight, package="preflight")
