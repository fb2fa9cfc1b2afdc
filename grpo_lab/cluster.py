"""More than one machine: checks of a job that runs on a Ray cluster of several nodes (hardware=ray_cluster).

verl runs on whatever Ray cluster `ray.init(**ray_kwargs.ray_init)` reaches. With `address` set it joins a running
cluster (`ray start --head` on one node, `ray start --address=...` on the others); without it, it starts a one-node
cluster of this machine. These rules are meant for the preflight (grpo_lab/preflight.py), each a
(rule, message, fix) triple:

* ray_join_num_cpus: address set and num_cpus given: Ray refuses it ("When connecting to an existing cluster,
  num_cpus and num_gpus must not be provided") after the job has started.
* ray_nnodes_without_cluster: trainer.nnodes > 1 but no address: ray.init() starts a cluster of this machine alone,
  and verl's resource pool asks for nnodes x n_gpus_per_node GPUs that it does not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_lab.config import get


def cluster_problems(verl: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(rule, message, fix) for each problem of the Ray cluster settings; empty when there is none."""
    out = []
    address = get(verl, "ray_kwargs.ray_init.address")
    num_cpus = get(verl, "ray_kwargs.ray_init.num_cpus")
    nnodes = int(get(verl, "trainer.nnodes", 1) or 1)
    gpus = int(get(verl, "trainer.n_gpus_per_node", 1) or 1)
    if address and num_cpus is not None:
        out.append(("ray_join_num_cpus",
                    f"ray_kwargs.ray_init.address={address} joins a running Ray cluster, and Ray refuses "
                    f"num_cpus={num_cpus} when connecting to one: each node's CPUs are what its `ray start "
                    f"--num-cpus` said", "ray_kwargs.ray_init.num_cpus=null"))
    if nnodes > 1 and not address:
        out.append(("ray_nnodes_without_cluster",
                    f"trainer.nnodes={nnodes} needs a Ray cluster of {nnodes} nodes ({nnodes * gpus} GPUs), but "
                    f"ray_kwargs.ray_init.address is not set: ray.init() would start a cluster of this machine "
                    f"alone. Start Ray on the nodes first (README, 'More than one machine') and join it",
                    f"hardware=ray_cluster nnodes={nnodes}  or  +ray_kwargs.ray_init.address=<head ip>:6379"))
    return out
