"""The hang watchdog's pieces without a training run: its keys' rules, its bounds, a real
watchdog thread in a child process that dumps a real faulthandler stack and exits 76,
the stack summary read from that dump, and the straggler lines of `ftl report`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.config.compose import PROJECT_ROOT, compose_config
from launcher.rank.watchdog import Watchdog, collective_timeout_s
from launcher.run.hang_report import Frame, hang_lines, parse_threads, where
from launcher.run.report import straggler_lines
from launcher.rundir import MetricsEvent, RunDir
from launcher.validation.rules import config_problems


def watchdog_problems(*overrides: str) -> list[str]:
    return [p for p in config_problems(compose_config(list(overrides))) if "timeout_s" in p]


def test_the_default_bounds_are_valid_and_zero_turns_the_watchdog_off() -> None:
    assert watchdog_problems() == []
    assert watchdog_problems("train.hang_timeout_s=0", "train.first_step_timeout_s=0") == []
    assert watchdog_problems("train.hang_timeout_s=-1", "train.first_step_timeout_s=1") == []


def test_a_first_step_bound_shorter_than_a_steps_is_refused_with_the_fix() -> None:
    (problem,) = watchdog_problems("train.hang_timeout_s=600", "train.first_step_timeout_s=60")
    assert problem.startswith("train.first_step_timeout_s=60.0: shorter than "
                              "train.hang_timeout_s=600.0")
    assert "Fix: train.first_step_timeout_s=600 or more" in problem
    (problem,) = watchdog_problems("train.first_step_timeout_s=0")
    assert "must be greater than 0" in problem and "train.hang_timeout_s=0" in problem


def test_collectives_outwait_the_watchdog() -> None:
    assert collective_timeout_s(0, 0) == 1800  # off: the Trainer's own default
    assert collective_timeout_s(6, 300) == 1800
    assert collective_timeout_s(1800, 3600) == 3600 + 300


def test_the_first_step_has_its_own_bound_until_a_step_completes(tmp_path: Path) -> None:
    now = [100.0]
    dog = Watchdog(RunDir(tmp_path), 0, 1, 5, 50, clock=lambda: now[0])
    assert dog.bound_s() == 50
    dog.beat()  # an eval batch before the first step: still the first step's bound
    assert dog.bound_s() == 50 and dog.step == 0
    dog.beat(1)
    assert dog.bound_s() == 5 and dog.step == 1 and dog.last == 100.0


USER_CODE = '''
import sys, threading, time
from pathlib import Path
from launcher.rank.watchdog import Watchdog
from launcher.rundir import RunDir


class Loader:
    def wait_for_data(self):
        threading.Event().wait()  # stuck in the standard library, called from here


dog = Watchdog(RunDir(Path(sys.argv[1])), 1, 1, 0.3, 0.3).start()
dog.beat(7)
Loader().wait_for_data()
'''


@pytest.fixture(scope="module")
def hung_child(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunDir, Path, int]:
    """A real process whose watchdog runs out: (its run dir, its user file, exit code)."""
    root = tmp_path_factory.mktemp("hung")
    script = root / "user_code.py"
    script.write_text(textwrap.dedent(USER_CODE))
    done = subprocess.run([sys.executable, str(script), str(root)], cwd=PROJECT_ROOT,
                          env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert "hang watchdog" in done.stderr, done.stderr
    return RunDir(root), script, done.returncode


def test_a_watchdog_that_runs_out_dumps_every_thread_and_exits_76(
    hung_child: tuple[RunDir, Path, int],
) -> None:
    run_dir, _, returncode = hung_child
    assert returncode == 76  # the documented status, not the constant it comes from
    (record,) = run_dir.read_hangs()
    assert (record.rank, record.step, record.bound_s) == (1, 7, 0.3)
    assert record.waited_s >= 0.3 and record.flight_recorder is None
    threads = parse_threads(run_dir.hang_stacks(1).read_text())
    assert len(threads) == 2  # the main thread and the watchdog's own
    assert record.main_thread in threads


def test_the_summary_names_the_users_frame_not_the_library_it_waits_in(
    hung_child: tuple[RunDir, Path, int],
) -> None:
    run_dir, script, _ = hung_child
    frames = parse_threads(run_dir.hang_stacks(1).read_text())[run_dir.read_hangs()[0].main_thread]
    assert frames[0].path.endswith("threading.py")  # innermost: the standard library
    line = script.read_text().splitlines().index("        threading.Event().wait()  # "
                                                 "stuck in the standard library, called "
                                                 "from here") + 1
    assert where(frames) == f"in Loader.wait_for_data ({script}:{line})"
    lines = hang_lines(run_dir, world_size=3)
    assert lines[0].startswith("hung: no progress within 0.3 s after step 7")
    assert lines[1].endswith(f"in Loader.wait_for_data ({script}:{line}) at step 7")
    assert lines[2].startswith("  rank 0: no hang record") and lines[3].startswith("  rank 2:")


def test_a_rank_in_torch_only_is_named_by_its_collective_and_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(PROJECT_ROOT)  # paths under the working directory are shown relative
    site = "/venv/lib/python3.11/site-packages"
    frames = [Frame(f"{site}/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
              Frame(f"{site}/torch/distributed/c10d_logger.py", 83, "wrapper"),
              Frame(str(PROJECT_ROOT / "launcher/rank/preempt.py"), 150, "vote"),
              Frame(f"{site}/transformers/trainer.py", 1957, "_run_epoch")]
    assert where(frames) == "waiting in all_reduce (called from launcher/rank/preempt.py:150)"
    backward = [Frame(f"{site}/torch/autograd/graph.py", 829, "_engine_run_backward"),
                frames[-1]]
    assert where(backward) == "in _engine_run_backward (torch/autograd/graph.py:829)"


def log(step: int, busy: list[float | None], steps: int = 1,
        forward: list[float | None] | None = None) -> MetricsEvent:
    values = {"loss": 1.0, "rank_busy_s": busy, "busy_steps": steps}
    if forward is not None:
        values["rank_forward_s"] = forward
    return MetricsEvent(step, values=values)


def test_the_report_names_the_slowest_rank_and_the_others_wait() -> None:
    history = [log(2, [0.1, 0.5, 0.2], steps=2, forward=[0.05, 0.3, 0.06]),
               log(3, [0.1, 0.4, 0.1], forward=[0.05, 0.2, 0.07])]
    slowest, waited, forward = straggler_lines(history)
    assert slowest.startswith("slowest rank: 1, busy 0.467 s/step (fastest: rank 0, 0.100")
    # rank 0 waited 2 x 0.4 + 0.3 = 1.1 s, rank 2 2 x 0.3 + 0.3 = 0.9 s
    assert "waited for the busiest 1.00 s each" in waited and "1.10 s at most, rank 0" in waited
    assert forward.startswith("forward: slowest rank 1, 0.267 s/step (fastest: rank 0, 0.050")
    assert "not measured" in straggler_lines([log(2, [None, None])])[0]
    assert straggler_lines([MetricsEvent(1, values={"loss": 1.0})]) == []
