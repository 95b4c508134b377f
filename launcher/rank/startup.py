"""Joining the process group within `cluster.startup_timeout_s`, or one line saying who
never came (docs/guide.md, "Before a multi-node run"). After a batch job's failed step,
`python -m launcher.rank.startup RUN_DIR` (`diagnose`) names the nodes whose launcher never
started (no RUN_DIR/startup/node-<N>.json) or the ranks that never came.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from itertools import groupby

from launcher.config.compose import load_run_config
from launcher.config.schema import RunConfig
from launcher.rundir import RunDir, StartupRecord

JOINED_KEY = "ftl/startup/joined/"


class StartupError(RuntimeError):
    """Some ranks never joined the process group within cluster.startup_timeout_s."""


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    node: int
    master_addr: str
    master_port: str

    @classmethod
    def from_env(cls, gpus_per_node: int) -> World:
        """This rank as its launcher describes it; ranks are numbered node by node, so
        its node is rank // gpus_per_node (torchrun also says GROUP_RANK; deepspeed not)."""
        env = os.environ
        rank = int(env.get("RANK", "0"))
        return cls(rank, int(env.get("WORLD_SIZE", "1")), rank // gpus_per_node,
                   env.get("MASTER_ADDR", "?"), env.get("MASTER_PORT", "?"))


def join_world(cfg: RunConfig, run_dir: RunDir, backend: str, alone_too: bool = False) -> World:
    """Write this rank's start-up record and join the default process group (`backend`:
    Engine.process_group_backend's) within the bound. A world of one is left to accelerate
    (which makes it no group), unless alone_too: the doctor's collectives need a group."""
    import torch
    import torch.distributed as dist

    world = World.from_env(cfg.cluster.gpus_per_node)
    bound = cfg.cluster.startup_timeout_s
    run_dir.write_startup(StartupRecord(
        world.rank, world.world_size, world.node, node_name(), os.getpid(),
        world.master_addr, world.master_port, time.time()))
    if world.world_size == 1 and not (alone_too and "MASTER_ADDR" in os.environ):
        return world
    if backend != "gloo":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    started = time.monotonic()
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=bound))
        joined = check_in(world, bound - (time.monotonic() - started))
    except Exception as error:  # noqa: BLE001 - any failure to join is diagnosed alike
        raise StartupError(missing_message(cfg, run_dir, world, None, error)) from error
    if len(joined) < world.world_size:
        raise StartupError(missing_message(cfg, run_dir, world, joined, None))
    return world


def collective_timeout(seconds: float) -> None:
    """The default group's timeout from now on (the start-up bound until then), and every
    group made later without a timeout of its own: DeepSpeed's ZeRO, AutoTP and Ulysses
    groups (dist.new_group) would get torch's default, 10 minutes on NCCL (30 on gloo; torch
    2.13 distributed_c10d._get_default_timeout), and end a hung or slow-starting run ahead
    of the hang watchdog, with no stacks."""
    import torch.distributed as dist

    if dist.is_initialized():
        timeout = timedelta(seconds=seconds)
        c10d = dist.distributed_c10d
        c10d._set_pg_timeout(timeout)
        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout


def check_in(world: World, left_s: float) -> set[int]:
    """The ranks whose key is on the rendezvous store within what is left of the bound: an
    NCCL group connects lazily, so a missing rank would only show at the first collective."""
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    store.set(f"{JOINED_KEY}{world.rank}", node_name())
    keys = [f"{JOINED_KEY}{rank}" for rank in range(world.world_size)]
    try:
        store.wait(keys, timedelta(seconds=max(left_s, 1.0)))
        return set(range(world.world_size))
    except Exception:  # noqa: BLE001 - the store's timeout error: who is there?
        return {rank for rank, key in enumerate(keys) if store.check([key])}


def missing_message(cfg: RunConfig, run_dir: RunDir, world: World,
                    joined: set[int] | None, error: BaseException | None) -> str:
    """One line: who never joined within the bound, where they were told to meet, what
    each left in RUN_DIR/startup/, and the fix. joined: the ranks the store saw, or None
    when the group itself did not form (then a start-up record is all there is)."""
    records = current_records(run_dir, world, cfg.cluster.startup_timeout_s)
    everyone = range(world.world_size)
    silent = [rank for rank in everyone if rank not in records]
    stuck = [] if joined is None else [r for r in everyone if r in records and r not in joined]
    parts = [f"start-up: the process group did not form within cluster.startup_timeout_s="
             f"{cfg.cluster.startup_timeout_s:g} (MASTER_ADDR={world.master_addr} "
             f"MASTER_PORT={world.master_port}; this is rank {world.rank} on "
             f"{node_name()})."]
    if silent:
        nodes = sorted({rank // cfg.cluster.gpus_per_node for rank in silent})
        parts.append(f"Never joined: rank(s) {_ranges(silent)} (node(s) {_ranges(nodes)}) "
                     f"wrote no {run_dir.startup.name}/rank-<R>.json: they never started or "
                     "are stuck before joining; check their node's launcher and logs, and "
                     "that the run dir is the same directory on every node (ftl doctor).")
    if stuck or (not silent and joined is None):
        told = ", ".join(f"rank {r} on {records[r].host} told {records[r].master_addr}:"
                         f"{records[r].master_port}" for r in (stuck or sorted(records)))
        parts.append(f"Started but did not connect: {told}; check that the address is "
                     "reachable from every node and the port open.")
    if error is not None and not silent:
        first = str(error).splitlines()[0] if str(error) else ""
        parts.append(f"({type(error).__name__}: {first})")
    parts.append("Fix: start every rank (or raise cluster.startup_timeout_s if start-up "
                 "is just slow).")
    return " ".join(parts)


def diagnose(run_dir: RunDir, head: str | None) -> str | None:
    """Who never started, from RUN_DIR/startup/ alone (a job clears it at each start); None
    when every rank started (the failure came later)."""
    cfg = load_run_config(run_dir.config)
    ranks, nodes = run_dir.read_startups(), run_dir.started_nodes()
    silent = [rank for rank in range(cfg.world_size) if rank not in ranks]
    if not silent:
        return None
    where = f"{head or '<head node>'}:{cfg.cluster.master_port}"
    absent = [node for node in range(cfg.cluster.nodes) if node not in nodes]
    parts = [f"start-up: {len(ranks)} of {cfg.world_size} ranks started; rank(s) "
             f"{_ranges(silent)} never did."]
    if absent:
        parts.append(f"Node(s) {_ranges(absent)} (the job's node numbers) never started their "
                     f"launcher (no {run_dir.startup.name}/node-<N>.json): check those nodes' "
                     "output above and cluster.setup.")
    else:
        # torchrun numbers nodes in the order they join, so a rank's node is not known
        # before it starts: the launchers are named, not the nodes of the missing ranks.
        parts.append(f"Every node's launcher started, but their rendezvous at {where} did "
                     f"not complete within cluster.startup_timeout_s="
                     f"{cfg.cluster.startup_timeout_s:g}: check that every node reaches that "
                     "address and port.")
    return " ".join(parts)


def current_records(run_dir: RunDir, world: World, bound_s: float) -> dict[int, StartupRecord]:
    """This start's records: a requeued job's earlier start left its own, older than this
    rank's by more than the bound."""
    records = run_dir.read_startups()
    mine = records.get(world.rank)
    if mine is None:
        return records
    return {rank: r for rank, r in records.items() if r.time >= mine.time - bound_s}


def node_name() -> str:
    """Slurm's node name where there is one (several slurmd "nodes" may share a host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5' (in a run of consecutive numbers, number - index is constant)."""
    runs = [[n for _, n in run] for _, run in groupby(enumerate(numbers), lambda p: p[1] - p[0])]
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    message = diagnose(RunDir(Path(sys.argv[1])), os.environ.get("FTL_HEAD_NODE"))
    if message:
        print(f"ftl: {message}", flush=True)
