"""grpo-lab's own config sections, typed: `lab` (hardware, model facts, dataset, ...) and `preflight`.

`store()` registers them with Hydra's ConfigStore (conf/config.yaml lists `lab_schema` and `preflight_schema` in its
defaults), so a wrong key or a wrong type in a conf/*.yaml or on the command line fails at compose with Hydra's own
error. A job reads them through one typed view, `Lab`, made once from the resolved config (grpo_lab/cli/config.py's
split) with what the job's launch adds; a field left out of a file is None ("not known").

Units: sizes of cards and RAM in GiB as CUDA and `free -g` report them (an H200 is 139.8); ports and counts plain.
"""

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, Mapping, Optional, get_type_hints


@dataclass
class Emulate:  # a smaller card rehearsed on a bigger one (grpo_lab/memory/emulate.py)
    real_gpu_memory_gb: Optional[float] = None  # GiB of the cards the job really runs on; None: no emulation
    real_gpu_name: Optional[str] = None


@dataclass
class Hardware:  # a conf/hardware option: one node's cards and host (ray_cluster: each node's)
    name: Optional[str] = None
    gpu_name: Optional[str] = None
    gpu_memory_gb: Optional[float] = None  # one card, GiB as CUDA reports it; 0, negative or None: unknown
    interconnect: Optional[str] = None  # nvlink | pcie4 | single
    nvlink: Optional[bool] = None
    p2p: Optional[bool] = None  # GPU peer-to-peer (false: NCCL needs NCCL_P2P_DISABLE=1)
    cpu_cores: Optional[int] = None  # of one node: Ray's CPUs when ray_init.num_cpus is null (facts.ray_cpus_needed)
    host_ram_gb: Optional[int] = None  # whole GiB of one node's RAM (the SLURM launcher's mem_gb)
    pcie_gb_s: Optional[float] = None  # host<->card GB/s for offload; None: assumed from interconnect (make fit)
    emulate: Emulate = field(default_factory=Emulate)


@dataclass
class ModelFacts:  # a conf/model option: names, and the architecture planned when no config.json is found
    name: Optional[str] = None
    hub_id: Optional[str] = None
    thinking: Optional[bool] = None  # a chat model that thinks by default (Qwen3)
    num_hidden_layers: Optional[int] = None
    hidden_size: Optional[int] = None
    num_attention_heads: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    intermediate_size: Optional[int] = None
    vocab_size: Optional[int] = None
    tie_word_embeddings: Optional[bool] = None
    max_position_embeddings: Optional[int] = None  # tokens


@dataclass
class Dataset:
    name: Optional[str] = None
    make: Optional[str] = None  # the command that writes its files


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
    variant: Optional[str] = None
    reward_fn: Optional[str] = None
    slurm: Slurm = field(default_factory=Slurm)
    wandb: Wandb = field(default_factory=Wandb)
    checkpoint_root: Optional[str] = None


@dataclass
class Preflight:  # conf's `preflight` (grpo_lab/checks/preflight.py, make plan / make fit)
    only: bool = False
    strict: bool = True
    fit: bool = False
    fit_write: Optional[str] = None
    fit_overwrite: bool = False


@dataclass
class Lab(LabConf):
    """One job's typed view: `lab`, `preflight`, and what the job's stages add before the preflight reads it."""

    preflight: Preflight = field(default_factory=Preflight)
    set_apart: Dict[str, Any] = field(default_factory=dict)  # {short key: verl keys set on their own} (cli/knobs.py)
    side_by_side_jobs: int = 1  # hydra/launcher=side_by_side: jobs sharing the cards
    micro_batch: Dict[str, Any] = field(default_factory=dict)  # what the micro-batch settling did
    side_by_side_kv_pin: Optional[Dict[str, Any]] = None  # {"bytes", "by": "launcher" | "user"}
    ray_cluster: Optional[Dict[str, Any]] = None  # the Ray cluster a SLURM job of several nodes starts

    @classmethod
    def of(cls, lab: Optional[Mapping[str, Any]] = None, **more: Any) -> "Lab":
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
