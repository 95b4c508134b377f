"""All-reduce bus bandwidth as nccl-tests defines it (doc/PERFORMANCE.md).

busbw = size * 2 * (n - 1) / n / time: the bytes each rank's link carries in a ring
all-reduce per second, comparable across world sizes. Every rank calls these in the same
order (collectives).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

SIZES_MIB = (1, 4, 16, 64, 256)
TIMED_BYTES = 256 * 2**20
"""Bytes all-reduced per size, spread over its iterations (at least 2, at most 20): about
a second in all over gloo on two CPU processes, milliseconds over NVLink."""
GPU_TIMED_BYTES = 16 * TIMED_BYTES
"""On GPUs (NCCL): 16 x as many, so even the 256 MiB size averages 16 iterations (about
10 ms over NVLink), each size after an untimed all-reduce of its own, as nccl-tests does."""


@dataclass(frozen=True)
class Measured:
    scope: str
    """intra-node or inter-node."""
    node: int | None
    """The node of an intra-node group; None across nodes."""
    ranks: int
    size_bytes: int
    seconds: float
    """One all-reduce, the mean over the timed iterations."""
    busbw_gb_s: float


def bus_bandwidth(size_bytes: int, ranks: int, seconds: float) -> float:
    """GB/s (1e9 bytes) of nccl-tests' busbw for one all-reduce of size_bytes."""
    if ranks < 2 or seconds <= 0:
        return 0.0
    return size_bytes * 2 * (ranks - 1) / ranks / seconds / 1e9


def measure(scope: str, node: int | None, group: Any, device: Any) -> list[Measured]:
    """Every size in SIZES_MIB over `group`: timed iterations after one warm-up
    all-reduce (on GPUs one per size). Every member times it; the caller keeps one
    member's figures."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size(group)
    warm = torch.ones(2**18, dtype=torch.float32, device=device)
    dist.all_reduce(warm, group=group)  # connections and buffers before the first timing
    found = []
    on_gpu = device.type == "cuda"
    for mib in SIZES_MIB:
        size = mib * 2**20
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        iterations = max(2, min(20, (GPU_TIMED_BYTES if on_gpu else TIMED_BYTES) // size))
        if on_gpu:  # the size's first all-reduce untimed (gloo's cost nothing measurable)
            dist.all_reduce(tensor, group=group)
        _sync(device)
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor, group=group)
        _sync(device)
        seconds = (time.perf_counter() - start) / iterations
        found.append(Measured(scope, node, ranks, size, seconds,
                              bus_bandwidth(size, ranks, seconds)))
        del tensor
    return found


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_world(local_rank: int, local_size: int, nodes: int, node: int,
                  device: Any) -> list[Measured]:
    """Intra-node where a node has several ranks, inter-node where there are several nodes;
    the figures of each node's local rank 0 (intra) and of rank 0 (inter). Ranks are
    numbered node by node (torchrun and deepspeed both do)."""
    import torch.distributed as dist

    found: list[Measured] = []
    if local_size > 1:
        mine = None if nodes == 1 else dist.new_subgroups(group_size=local_size)[0]
        intra = measure("intra-node", node, mine, device)
        found += intra if local_rank == 0 else []
    if nodes > 1:
        inter = measure("inter-node", None, None, device)
        found += inter if dist.get_rank() == 0 else []
    return found
