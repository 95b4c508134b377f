"""`python -m launcher.doctor.probe RUN_DIR`: one rank of `ftl doctor` (launcher/doctor/):
what it sees (versions, GPUs, the shared directories, free space) and its bandwidth figures.

Exit 0 when the checks ran (their verdict is in doctor.json); a rank that fails writes
logs/rank<R>.error like the worker.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.architecture import count_params
from launcher.config.compose import load_run_config
from launcher.config.hardware import gpu_preset
from launcher.config.schema import RunConfig
from launcher.data.preprocess import read_prepared
from launcher.doctor import checks
from launcher.doctor.bandwidth import measure_world
from launcher.engines import engine_of
from launcher.estimator.disk import disk_need
from launcher.estimator.flops import trainable_params
from launcher.rank.startup import World, join_world, node_name
from launcher.rank.worker import exit_now, write_error
from launcher.rundir import DoctorReport, RunDir
from launcher.validation.preflight import fused_adam_problems

TOKEN_WAIT_S = 3.0
"""A network filesystem may show a new file to the other nodes a moment late."""


@dataclass
class RankFacts:
    rank: int
    node: int
    host: str
    local_rank: int
    torch: str = ""
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None
    gpus: list[str] = field(default_factory=list)
    """Names of the GPUs this rank's process can see."""
    visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES as this rank has it."""
    output_dir: str = ""
    output_shared: bool = False
    free_bytes: int = 0
    cache_root: str = ""
    cache_shared: bool = False
    data_built: bool = False
    build_problems: list[str] = field(default_factory=list)
    """What stops the ranks compiling DeepSpeed's FusedAdam on this node (preflight's
    check, run where the job runs: `ftl submit` cannot see the compute nodes' toolkit)."""


def main() -> int:
    args = sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m launcher.doctor.probe RUN_DIR", file=sys.stderr)
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
    on_gpu = not gpu_preset(cfg.cluster.gpu).is_cpu
    backend = engine_of(cfg.strategy).process_group_backend(not on_gpu)
    started = time.monotonic()
    world = join_world(cfg, run_dir, backend, alone_too=True)  # the bound holds throughout
    join_s = time.monotonic() - started
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    gpus = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    facts = RankFacts(world.rank, world.node, node_name(), local_rank, gpus=gpus,
                      visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                      build_problems=fused_adam_problems(cfg, os.environ, torch.version.cuda),
                      **versions())
    shared_dirs(cfg, run_dir, world, facts)
    nodes = cfg.cluster.nodes
    measured = measure_world(local_rank, world.world_size // nodes, nodes, world.node,
                             device)
    reports: list[Any] = [None] * world.world_size
    dist.all_gather_object(reports, (asdict(facts), [asdict(m) for m in measured]))
    if world.rank == 0:
        write_report(cfg, run_dir, reports, join_s, backend)
    dist.barrier()


def versions() -> dict[str, str | None]:
    import torch

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda is not None else None
    return {"torch": torch.__version__, "cuda": cuda, "nccl": nccl, "driver": driver()}


def driver() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def shared_dirs(cfg: RunConfig, run_dir: RunDir, world: World, facts: RankFacts) -> None:
    """Rank 0 writes one token into the run dir (inside run.output_dir) and one into the
    data cache's root; every rank reads both back (a node-local disk at the same path has
    other contents), then rank 0 removes them."""
    import torch.distributed as dist

    data_dir = Path(run_dir.read_plan().data_dir or "")
    cache_root = data_dir.parent
    box = [secrets.token_hex(8) if world.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    token = str(box[0])
    tokens = [directory / f".ftl-doctor-{token}" for directory in (run_dir.doctor_dir,
                                                                    cache_root)]
    if world.rank == 0:
        for path in tokens:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(token)
        os.sync()  # what a network filesystem flushes on close anyway; cheap here
    dist.barrier()
    facts.output_dir = str(run_dir.path)
    facts.output_shared = sees_token(tokens[0], token)
    with contextlib.suppress(OSError):
        facts.free_bytes = shutil.disk_usage(run_dir.path).free
    facts.cache_root = str(cache_root)
    facts.cache_shared = sees_token(tokens[1], token)
    facts.data_built = read_prepared(data_dir) is not None
    dist.barrier()
    if world.rank == 0:
        for path in tokens:
            path.unlink(missing_ok=True)


def sees_token(path: Path, token: str) -> bool:
    """Rank 0's token file, with its token inside, within TOKEN_WAIT_S."""
    deadline = time.monotonic() + TOKEN_WAIT_S
    while True:
        with contextlib.suppress(OSError):
            if path.read_text() == token:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def write_report(cfg: RunConfig, run_dir: RunDir, reports: list[Any], join_s: float,
                 backend: str) -> None:
    facts = [fact for fact, _ in reports]
    measured = [m for _, found in reports for m in found]
    preset = gpu_preset(cfg.cluster.gpu)
    need = disk_need(cfg, count_params(cfg.model), trainable_params(cfg))
    exp = checks.Expectation(
        backend=backend, world_size=cfg.world_size, nodes=cfg.cluster.nodes,
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
