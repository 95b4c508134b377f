"""The doctor's verdicts (launcher/doctor/checks.py), its bandwidth formula and the
start-up diagnosis text (launcher/rank/startup.py): pure parts, on made-up facts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.doctor import checks
from launcher.doctor.bandwidth import bus_bandwidth
from launcher.rank.startup import (
    World,
    _ranges,
    current_records,
    diagnose,
    missing_message,
)
from launcher.rundir import RunDir, StartupRecord
from launcher.validation.preflight import fused_adam_problems

EXP = checks.Expectation(backend="cuda:nccl,cpu:gloo", world_size=4, nodes=2, gpus_per_node=2,
                         on_gpu=True, intra_gb_s=230.0, inter_gb_s=20.0, need_bytes=10 * 2**30)


def fact(rank: int, **changes: Any) -> dict[str, Any]:
    node = rank // 2
    base = {"rank": rank, "node": node, "host": f"gpu{node}", "local_rank": rank % 2,
            "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3", "driver": "570.1",
            "gpus": ["NVIDIA A100-SXM4-80GB"] * 2, "visible_devices": None,
            "output_dir": "/shared/run", "output_shared": True, "free_bytes": 100 * 2**30,
            "cache_root": "/shared/cache", "cache_shared": True, "data_built": True,
            "build_problems": []}
    return {**base, **changes}


def measured(scope: str, node: int | None, busbw: float) -> list[dict[str, Any]]:
    return [{"scope": scope, "node": node, "ranks": 2, "size_bytes": mib * 2**20,
             "seconds": 0.01, "busbw_gb_s": busbw} for mib in (1, 4, 16, 64, 256)]


def rows_of(facts: list[dict[str, Any]], bandwidth: list[dict[str, Any]]) -> dict[str, checks.Row]:
    return {row.check: row for row in checks.judge(facts, bandwidth, EXP, 1.5)}


GOOD_BW = [*measured("intra-node", 0, 200.0), *measured("intra-node", 1, 210.0),
           *measured("inter-node", None, 18.0)]


def test_bus_bandwidth_is_nccl_tests_busbw() -> None:
    assert bus_bandwidth(10**9, 2, 1.0) == pytest.approx(1.0)  # 2 (n-1)/n = 1
    assert bus_bandwidth(10**9, 8, 0.5) == pytest.approx(3.5)  # 2 * 7/8 / 0.5
    assert bus_bandwidth(10**9, 1, 1.0) == 0.0  # no peers, no bus


def test_every_check_passes_on_a_healthy_world() -> None:
    rows = rows_of([fact(r) for r in range(4)], GOOD_BW)
    assert {row.status for row in rows.values()} == {checks.OK}, rows
    assert set(rows) == {"process group", "all-reduce intra-node node 0",
                         "all-reduce intra-node node 1", "all-reduce inter-node", "versions",
                         "gpus", "optimizer build", "output dir", "free space", "data cache"}
    assert checks.passed([row.to_dict() for row in rows.values()])


def test_each_failure_names_its_node_or_rank_and_a_fix() -> None:
    facts = [fact(0), fact(1), fact(2, torch="2.12.0", output_shared=False,
                                    output_dir="/local/run"),
             fact(3, gpus=["NVIDIA A100-SXM4-80GB"], free_bytes=2**30, cache_shared=False)]
    bandwidth = [*measured("intra-node", 0, 200.0), *measured("intra-node", 1, 210.0),
                 *measured("inter-node", None, 1.2)]
    rows = rows_of(facts, bandwidth)
    failed = {name for name, row in rows.items() if row.status == checks.FAIL}
    assert failed == {"versions", "output dir", "gpus", "free space", "data cache",
                      "all-reduce inter-node"}
    assert "torch 2.12.0" in rows["versions"].detail and "node 1 (gpu1)" in rows["versions"].detail
    assert "rank 2 (node 1, gpu1) in /local/run" in rows["output dir"].detail
    assert "rank 1 " not in rows["output dir"].detail and "rank 3 " not in rows["output dir"].detail
    assert "rank 3 (node 1, gpu1)" in rows["gpus"].detail  # local rank 1 sees one GPU
    assert "node 1 (gpu1)" in rows["free space"].detail.split(";")[0]
    assert "rank 3" in rows["data cache"].detail
    assert "NCCL_SOCKET_IFNAME" in rows["all-reduce inter-node"].fix
    assert all(rows[name].fix for name in failed)
    table = checks.render({"rows": [row.to_dict() for row in rows.values()], "world_size": 4,
                           "nodes": 2, "backend": EXP.backend, "run_dir": "/shared/run"})
    assert "fix: put run.output_dir" in table and table.endswith("a check FAILED (fix above)")


def test_a_node_that_cannot_compile_fused_adam_fails_before_training(
        tmp_path: Path) -> None:
    """`ftl submit` cannot see the compute nodes' CUDA toolkit; the doctor step runs
    preflight's check on each node, and the job ends there instead of at every rank's
    first step, after the model was built."""
    cfg = compose_config(["cluster.gpu=a100-80g", "strategy=zero3"])
    no_toolkit = {"CUDA_HOME": str(tmp_path / "cuda"), "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    (problem,) = fused_adam_problems(cfg, no_toolkit, "12.8")  # as node 1's ranks find it
    facts = [fact(0), fact(1), fact(2, build_problems=[problem]),
             fact(3, build_problems=[problem])]
    row = rows_of(facts, GOOD_BW)["optimizer build"]
    assert row.status == checks.FAIL
    assert row.detail.startswith("on node 1 (gpu1): train.optimizer=auto with strategy=zero3")
    assert f"CUDA_HOME={tmp_path / 'cuda'} holds no bin/nvcc" in row.detail
    assert "Fix" not in row.detail and row.fix.startswith("train.optimizer=torch")


def test_a_missing_rank_fails_the_process_group_and_cpu_bandwidth_is_only_reported() -> None:
    cpu = checks.Expectation(backend="gloo", world_size=2, nodes=1, gpus_per_node=2,
                             on_gpu=False, intra_gb_s=0.0, inter_gb_s=0.0, need_bytes=0)
    rows = {row.check: row for row in checks.judge([fact(0)], measured("intra-node", 0, 0.3),
                                                   cpu, 0.2)}
    assert rows["process group"].status == checks.FAIL
    assert rows["all-reduce intra-node node 0"].status == checks.INFO
    assert rows["all-reduce inter-node"].detail == "not measured: one node"
    assert rows["gpus"].status == checks.INFO


def record(rank: int, when: float, port: str = "29500") -> StartupRecord:
    return StartupRecord(rank, 4, rank // 2, f"gpu{rank // 2}", 100 + rank, "gpu0", port, when)


def test_start_up_message_names_the_silent_ranks_their_nodes_and_the_address(
        tmp_path: Path) -> None:
    cfg = compose_config(["cluster.gpus_per_node=2", "cluster.startup_timeout_s=60"])
    run_dir = RunDir(tmp_path)
    for rank in (0, 1):
        run_dir.write_startup(record(rank, 1000.0))
    run_dir.write_startup(record(2, 1000.0 - 3600))  # an earlier start of a requeued job
    world = World(0, 4, 0, "gpu0", "29500")
    text = missing_message(cfg, run_dir, world, None, TimeoutError("timed out"))
    assert "within cluster.startup_timeout_s=60 (MASTER_ADDR=gpu0 MASTER_PORT=29500;" in text
    assert "Never joined: rank(s) 2-3 (node(s) 1)" in text
    assert "\n" not in text  # `ftl train` prints the error file's last line
    assert set(current_records(run_dir, world, 60)) == {0, 1}


def test_start_up_message_says_which_started_ranks_did_not_connect(tmp_path: Path) -> None:
    cfg = compose_config(["cluster.gpus_per_node=2"])
    run_dir = RunDir(tmp_path)
    for rank in range(4):
        run_dir.write_startup(record(rank, 1000.0, port="29999" if rank == 3 else "29500"))
    text = missing_message(cfg, run_dir, World(0, 4, 0, "gpu0", "29500"), {0, 1, 2}, None)
    assert "Never joined" not in text
    assert "Started but did not connect: rank 3 on gpu1 told gpu0:29999" in text


def test_ranges() -> None:
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert _ranges([]) == "none"


def job_run_dir(tmp_path: Path) -> RunDir:
    from omegaconf import OmegaConf

    cfg = compose_config(["cluster=slurm", "cluster.nodes=3", "cluster.gpus_per_node=2",
                          "cluster.master_port=29555", "cluster.startup_timeout_s=120"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return RunDir(tmp_path)


def test_after_a_failed_job_step_the_nodes_whose_launcher_never_started_are_named(
        tmp_path: Path) -> None:
    run_dir = job_run_dir(tmp_path)
    run_dir.startup.mkdir()
    for node in (0, 2):  # what each node's task writes as it starts its launcher
        (run_dir.startup / f"node-{node}.json").write_text(json.dumps({"node": node}))
    run_dir.write_startup(record(0, 1000.0))
    text = diagnose(run_dir, "gpu0")
    assert text is not None
    assert text.startswith("start-up: 1 of 6 ranks started; rank(s) 1-5 never did.")
    assert "Node(s) 1 (the job's node numbers) never started their launcher" in text
    (run_dir.startup / "node-1.json").write_text(json.dumps({"node": 1}))
    text = diagnose(run_dir, "gpu0") or ""
    assert "Every node's launcher started, but their rendezvous at gpu0:29555" in text
    assert "cluster.startup_timeout_s=120" in text
    for rank in range(1, 6):
        run_dir.write_startup(record(rank, 1000.0))
    assert diagnose(run_dir, "gpu0") is None  # every rank started: the failure came later


def test_the_run_backend_is_the_engines() -> None:
    from launcher.config.hardware import gpu_preset
    from launcher.engines import engine_of

    def of(*overrides: str) -> str:
        cfg = compose_config(list(overrides))
        return engine_of(cfg.strategy).process_group_backend(gpu_preset(cfg.cluster.gpu).is_cpu)

    assert of("strategy=fsdp") == of("strategy=zero2") == "gloo"  # cluster.gpu=cpu
    gpu = ["cluster.gpu=a100-80g", "cluster.gpus_per_node=8"]
    assert of("strategy=ddp", *gpu) == of("strategy=zero3", *gpu) == "nccl"
    assert of("strategy=fsdp_offload", *gpu) == "cuda:nccl,cpu:gloo"


def test_ftl_submit_doctor_and_eval_put_their_steps_in_the_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--doctor: ftl doctor's step first; --eval (eval.tasks): ftl eval's step last."""
    from launcher.cli import main

    assert main(["submit", "--dry-run", "--doctor", "--eval", "arith", "cluster.gpu=cpu",
                 "cluster.nodes=2", "cluster.gpus_per_node=1", f"run.output_dir={tmp_path}"]) == 0
    script = capsys.readouterr().out
    assert "--module launcher.doctor.probe" in script
    assert (script.index("launcher.doctor.probe") < script.index("launcher.rank.worker")
            < script.index('python -m launcher eval "$FTL_RUN_DIR"'))
