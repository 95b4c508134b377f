"""A hung rank costs at most the hang bound and says where it is: rank 1 stops in an
injected callback at step 3 (after two slow steps: a straggler) while rank 0 waits in a
collective; each rank's watchdog dumps its stacks to RUN_DIR/hang/ and `ftl train` exits
76 naming where each rank was; `ftl status` says the same, `ftl report` names rank 1 as
the slowest; checkpoint-2 stays complete. `make test-full` also resumes it: the same
command without the probe continues from checkpoint-2 and finishes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from runs import FAST_TRAIN, RUN_TIMES, free_port, project_env
from test_ftl_train import only_run_dir

from launcher.config.compose import PROJECT_ROOT
from launcher.rank.watchdog import PEER_GRACE_S
from launcher.run.report import report
from launcher.run.submit import run_dir_lines
from launcher.rundir import RunDir
from launcher.rundir.checkpoints import is_complete

pytestmark = pytest.mark.slow

BOUND_S = 6
SLOW_S = 0.3
HUNG = [*FAST_TRAIN, "train.max_steps=4", "train.save_steps=2", "train.eval_on_start=false",
        f"train.hang_timeout_s={BOUND_S}", "train.first_step_timeout_s=300"]
BLOCK = ("train.callbacks=[{_target_:tests.integration.probes.BlockAtStep,step:3,"
         f"slow_s:{SLOW_S}}}]")
MARGIN_S = PEER_GRACE_S + 15  # the peers' grace at most, then the launcher's teardown


def ftl_train(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", "train", *HUNG, f"cluster.master_port={free_port()}",
         f"run.output_dir={root}", "run.name=hang", *extra],
        cwd=PROJECT_ROOT, env=project_env(), capture_output=True, text=True, timeout=600)


@dataclass
class Hung:
    root: Path
    run_dir: RunDir
    done: subprocess.CompletedProcess[str]
    ended: float
    """time.time() when `ftl train` had exited."""


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Hung:
    """The launch whose rank 1 blocks at step 3 (shared by the resume, a `full` test)."""
    root = tmp_path_factory.mktemp("hang")
    started = time.monotonic()
    done = ftl_train(root, BLOCK)
    ended = time.time()
    RUN_TIMES["hang (hung launch)"] = time.monotonic() - started
    # 76, written out: the documented status (README, `ftl train --help`, Slurm's 76:0),
    # not the product's own constant, which a test would follow wherever it went.
    assert done.returncode == 76, done.stdout[-3000:] + done.stderr[-3000:]
    return Hung(root, RunDir(only_run_dir(root)), done, ended)


def test_a_hung_rank_ends_the_run_with_its_stacks(hung: Hung) -> None:
    run_dir, done, ended = hung.run_dir, hung.done, hung.ended

    records = run_dir.read_hangs()
    assert [r.rank for r in records] == [0, 1]
    RUN_TIMES["hang (last progress -> ftl train exit)"] = ended - min(
        r.time - r.waited_s for r in records)
    for record in records:
        assert record.step == 3 and record.bound_s == BOUND_S
        assert BOUND_S <= record.waited_s < BOUND_S + 2, record
        assert ended - (record.time - record.waited_s) < BOUND_S + MARGIN_S, record
    # rank 1: the injected frame; rank 0: a collective, waiting for rank 1
    assert 'probes.py", line' in run_dir.hang_stacks(1).read_text()
    assert "in on_step_end" in run_dir.hang_stacks(1).read_text()
    assert "distributed_c10d.py" in run_dir.hang_stacks(0).read_text()
    rank_1 = "rank 1 on {}: in BlockAtStep.on_step_end (tests/integration/probes.py:"
    assert rank_1.format(records[1].host) in done.stderr, done.stderr[-3000:]
    assert f"rank 0 on {records[0].host}: waiting in all_" in done.stderr
    assert "at step 3" in done.stderr and "Exit status 76" in done.stderr

    checkpoints = run_dir.checkpoints
    assert is_complete(checkpoints / "checkpoint-2")
    assert not (checkpoints / "checkpoint-4").exists() and not run_dir.result.exists()

    # What `ftl status RUN_DIR` prints (in this process: a CLI start costs seconds)
    status = "\n".join(run_dir_lines(run_dir))
    assert "run: hung: no progress within 6 s after step 3" in status
    assert rank_1.format(records[1].host) in status
    assert "latest complete checkpoint: " + str(checkpoints / "checkpoint-2") in status

    # Stragglers: rank 1's forwards took SLOW_S longer in steps 1 and 2; rank 0 waited.
    rows = [e.values for e in run_dir.read_metrics() if "rank_busy_s" in e.values]
    assert [len(v["rank_busy_s"]) for v in rows] == [2, 2], rows
    assert all(v["rank_busy_s"][1] > v["rank_busy_s"][0] + SLOW_S / 2 for v in rows), rows
    assert all(v["rank_forward_s"][1] > v["rank_forward_s"][0] + SLOW_S / 2 for v in rows)
    text, _ = report(run_dir.path)  # `ftl report RUN_DIR`
    assert "slowest rank: 1, busy " in text and "forward: slowest rank 1, " in text, text


@pytest.mark.full
def test_the_same_command_resumes_a_hung_run(hung: Hung) -> None:
    """`make test-full` only: a launch that ended 76 left checkpoint-2 complete, as one
    that ended 75 (test_graceful_stop), 1 (test_disk_full) or by kill -9 (test_chaos)
    leaves its own, and the resume takes the newest complete checkpoint whatever ended the
    launch before (launcher/rundir/checkpoints.py)."""
    run_dir, checkpoints = hung.run_dir, hung.run_dir.checkpoints
    started = time.monotonic()
    again = ftl_train(hung.root)  # the same command, without the injected hang
    RUN_TIMES["hang (resume)"] = time.monotonic() - started
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    second = RunDir(max(p for p in run_dir.path.parent.iterdir() if p.is_dir()
                        and not p.name.startswith(".")))
    (launch,) = second.read_launches()
    assert launch.resumed_from == str(checkpoints / "checkpoint-2") and launch.start_step == 2
    assert json.loads(second.result.read_text())["global_step"] == 4
    assert not second.hang.exists()
