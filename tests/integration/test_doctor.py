"""`ftl doctor` and the start-up bound on real CPU ranks (gloo), nothing mocked.

- `ftl doctor` on 2 local ranks: the table, gloo's bus bandwidth measured at every size,
  every check passing; `python -m launcher.doctor RUN_DIR --json` prints the same report.
- A node-local output directory: the doctor's two ranks are started by hand with the
  environment torchrun gives them, rank 1 with its own copy of the run dir (what a node
  whose run.output_dir is a local disk sees: the same files written at launch, but not
  what rank 0 writes later). The check itself runs unchanged and names rank 1.
- A rank that never starts: rank 0 of a world of 2 alone; its join ends within
  cluster.startup_timeout_s with an error naming rank 1 and the address and port. It mostly
  waits, so it starts with the module (`start_early`) and waits beside the other tests.
The 2-node Slurm job step is in test_slurm.py (`cluster.doctor=true`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr
from io import StringIO
from pathlib import Path

import pytest

from launcher.config.compose import PROJECT_ROOT
from launcher.run.launch import create_run
from tests.integration.runs import free_port, project_env

pytestmark = pytest.mark.slow

TIMEOUT_S = 300


def ftl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=PROJECT_ROOT,
                          env=project_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def only_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.glob("*/*") if p.is_dir()]
    return run_dir


def test_ftl_doctor_on_two_cpu_ranks_measures_gloo_and_passes(tmp_path: Path) -> None:
    done = ftl("doctor", f"run.output_dir={tmp_path}", "cluster.gpus_per_node=2")
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout
    assert "ftl doctor: 2 rank(s) on 1 node(s), backend gloo" in table
    for check in ("process group", "all-reduce intra-node node 0", "versions",
                  "optimizer build", "output dir", "free space", "data cache"):
        assert any(line.startswith(check) for line in table.splitlines()), table
    assert "busbw GB/s over 2 ranks: 1 MiB" in table and "256 MiB" in table
    assert "FAIL" not in table and "ftl doctor: every check passed" in table
    run_dir = only_run_dir(tmp_path)
    shown = subprocess.run([sys.executable, "-m", "launcher.doctor", str(run_dir), "--json"],
                           cwd=PROJECT_ROOT, env=project_env(), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["ok"] is True and report["world_size"] == 2
    sizes = [m["size_bytes"] // 2**20 for m in report["bandwidth"]]
    assert sizes == [1, 4, 16, 64, 256]  # local rank 0's figures of the node's group
    assert all(m["busbw_gb_s"] > 0 and m["ranks"] == 2 for m in report["bandwidth"])
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["output_shared"] and r["cache_shared"] for r in report["ranks"])
    assert all(r["build_problems"] == [] for r in report["ranks"])  # cpu: nothing to compile
    status = {row["check"]: row["status"] for row in report["rows"]}
    assert status.pop("all-reduce intra-node node 0") == "info"  # no CPU figure to judge by
    assert status.pop("all-reduce inter-node") == "info"  # one node
    assert status.pop("gpus") == "info"  # cluster.gpu=cpu
    assert set(status.values()) == {"ok"}, status
    assert not list((run_dir / "doctor").glob(".ftl-doctor-*"))  # its token is removed


def planned(tmp_path: Path, *overrides: str) -> Path:
    """The run dir `ftl plan` writes (in this process: no second interpreter to start)."""
    with contextlib.chdir(PROJECT_ROOT), redirect_stderr(StringIO()):
        built = create_run([f"run.output_dir={tmp_path / 'out'}", "cluster.gpus_per_node=2",
                            *overrides], "plan")
    return built.run_dir


def start_rank(rank: int, run_dir: Path, port: int) -> subprocess.Popen[str]:
    """One doctor rank with the environment torchrun gives it (2 ranks, one node)."""
    env = project_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    return subprocess.Popen([sys.executable, "-m", "launcher.doctor.probe", str(run_dir)],
                            cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_doctor_names_the_rank_whose_output_dir_is_not_shared(tmp_path: Path) -> None:
    run_dir = planned(tmp_path)
    local_copy = tmp_path / "node1-local-disk" / run_dir.name
    shutil.copytree(run_dir, local_copy)  # the launch's files, as a node-local disk has them
    port = free_port()
    ranks = [start_rank(0, run_dir, port), start_rank(1, local_copy, port)]
    outputs = [rank.communicate(timeout=TIMEOUT_S)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    shown = subprocess.run([sys.executable, "-m", "launcher.doctor", str(run_dir)],
                           cwd=PROJECT_ROOT, env=project_env(), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    rows = {row["check"]: row for row in json.loads((run_dir / "doctor.json").read_text())["rows"]}
    output = rows["output dir"]
    assert output["status"] == "FAIL", rows
    assert "rank 1 (node 0" in output["detail"] and str(local_copy) in output["detail"]
    assert "rank 0 (" not in output["detail"]
    assert "same path" in output["fix"]
    assert rows["data cache"]["status"] == "ok" and rows["process group"]["status"] == "ok"
    assert "output dir" in shown.stdout and "fix: put run.output_dir" in shown.stdout
    assert "ftl doctor: a check FAILED" in shown.stdout


@pytest.fixture(scope="module")
def never_joined(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, int, subprocess.Popen[str]]]:
    """Rank 0 of a world of 2, alone, with a 3 s start-up bound: (run dir, port, process)."""
    run_dir = planned(tmp_path_factory.mktemp("never-joins"), "cluster.startup_timeout_s=3")
    port = free_port()
    alone = start_rank(0, run_dir, port)
    yield run_dir, port, alone
    if alone.poll() is None:
        alone.kill()


@pytest.fixture(scope="module", autouse=True)
def start_early(request: pytest.FixtureRequest) -> None:
    """Starts never_joined with the module when a selected test uses it."""
    if any(getattr(item, "module", None) is request.module
           and "never_joined" in getattr(item, "fixturenames", ())
           for item in request.session.items):
        request.getfixturevalue("never_joined")


def test_a_rank_that_never_starts_is_named_within_the_start_up_bound(
    never_joined: tuple[Path, int, subprocess.Popen[str]],
) -> None:
    run_dir, port, alone = never_joined
    # Far below torch's own 30-minute default: the 3 s bound (plus the imports) ended it.
    output = alone.communicate(timeout=120)[0]
    assert alone.returncode != 0, output
    error = (run_dir / "logs" / "rank0.error").read_text().strip().splitlines()[-1]
    assert ("StartupError: start-up: the process group did not form within "
            "cluster.startup_timeout_s=3 ") in error, error
    assert f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}" in error
    assert "Never joined: rank(s) 1 (node(s) 0)" in error
    started = json.loads((run_dir / "startup" / "rank-0.json").read_text())
    assert started["master_port"] == str(port) and started["world_size"] == 2
    assert not (run_dir / "startup" / "rank-1.json").exists()
