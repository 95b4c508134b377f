"""`python -m launcher.doctor.rank RUN_DIR`: one rank of `ftl doctor` (launcher/doctor/).

Exit 0 when the checks ran (their verdict is in doctor.json); a rank that fails writes
logs/rank<R>.error like the worker.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launcher.config.compose import load_run_config
from launcher.config.hardware import gpu_preset
from launcher.config.schema import RunConfig
from launcher.doctor import checks
from launcher.doctor.bandwidth import measure_world
from launcher.doctor.facts import (
    RankFacts,
    free_bytes,
    gpus,
    sees_token,
    token_file,
    versions,
    write_token,
)
from launcher.rank.startup import World, backend, join_world, node_name
from launcher.rank.worker import exit_now, write_error
from launcher.rundir import DoctorReport, RunDir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m launcher.doctor.rank RUN_DIR", file=sys.stderr)
        return 2
    run_dir = RunDir(Path(args[0]).resolve())
    try:
        examine(run_dir)
    except BaseException:
        write_error(run_dir, traceback.format_exc())
        raise
    return 0


def examine(run_dir: RunDir) -> None:
    import torch
    import torch.distributed as dist

    cfg = load_run_config(run_dir.config)
    started = time.monotonic()
    world = join_world(cfg, run_dir, alone_too=True)  # the bound holds throughout
    join_s = time.monotonic() - started
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = not gpu_preset(cfg.cluster.gpu).is_cpu
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    facts = RankFacts(world.rank, world.node, node_name(), local_rank, gpus=gpus(),
                      visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                      **versions())
    shared_dirs(cfg, run_dir, world, facts)
    nodes = cfg.cluster.nodes
    measured = measure_world(local_rank, world.world_size // nodes, nodes, world.node,
                             device)
    reports: list[Any] = [None] * world.world_size
    dist.all_gather_object(reports, (asdict(facts), [asdict(m) for m in measured]))
    if world.rank == 0:
        write_report(cfg, run_dir, reports, join_s)
    dist.barrier()


def shared_dirs(cfg: RunConfig, run_dir: RunDir, world: World, facts: RankFacts) -> None:
    """Rank 0 writes one token into the run dir (inside run.output_dir) and one into the
    data cache's root; every rank reads both back, then rank 0 removes them."""
    import torch.distributed as dist

    data_dir = Path(run_dir.read_plan().data_dir or "")
    cache_root = data_dir.parent
    box = [secrets.token_hex(8) if world.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    token = str(box[0])
    if world.rank == 0:
        write_token(run_dir.doctor_dir, token)
        write_token(cache_root, token)
    dist.barrier()
    from launcher.data.preprocess import read_prepared

    facts.output_dir = str(run_dir.path)
    facts.output_shared = sees_token(run_dir.doctor_dir, token)
    facts.free_bytes = free_bytes(run_dir.path)
    facts.cache_root = str(cache_root)
    facts.cache_shared = sees_token(cache_root, token)
    facts.data_built = read_prepared(data_dir) is not None
    dist.barrier()
    if world.rank == 0:
        for directory in (run_dir.doctor_dir, cache_root):
            token_file(directory, token).unlink(missing_ok=True)


def write_report(cfg: RunConfig, run_dir: RunDir, reports: list[Any], join_s: float) -> None:
    from launcher.estimator.disk import disk_need
    from launcher.estimator.flops import count_params, trainable_params

    facts = [fact for fact, _ in reports]
    measured = [m for _, found in reports for m in found]
    preset = gpu_preset(cfg.cluster.gpu)
    need = disk_need(cfg, count_params(cfg.model), trainable_params(cfg))
    exp = checks.Expectation(
        backend=backend(cfg), world_size=cfg.world_size, nodes=cfg.cluster.nodes,
        gpus_per_node=cfg.cluster.gpus_per_node, on_gpu=not preset.is_cpu,
        intra_gb_s=preset.intra_node_busbw_gb_s, inter_gb_s=cfg.cluster.network_gb_s,
        need_bytes=need.total_bytes)
    rows = [row.to_dict() for row in checks.judge(facts, measured, exp, join_s)]
    run_dir.write_doctor(DoctorReport(
        ok=checks.passed(rows), run_dir=str(run_dir.path), backend=exp.backend,
        world_size=exp.world_size, nodes=exp.nodes, rows=rows, ranks=facts,
        bandwidth=measured))


if __name__ == "__main__":
    exit_now(main())  # no process-group teardown at exit (launcher/rank/worker.py: finish)
