"""The scheduler seam: a second scheduler is one module registered in SCHEDULERS, and
`ftl submit`, `ftl status` and `ftl cancel` work with it unchanged; its rules join the one
validation stage."""

from __future__ import annotations

from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.run.submit import cancel, status, submit
from launcher.schedulers import base as scheduler

FAKE = ["cluster=local", "cluster.scheduler=fake", "cluster.gpus_per_node=1"]


@pytest.fixture
def fake_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(scheduler.SCHEDULERS, "fake", "tests.unit.fake_scheduler:FakeScheduler")


@pytest.fixture
def fake_default(fake_registered: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake as the registry's default: bare job ids are its ids."""
    monkeypatch.setattr(scheduler, "DEFAULT_SCHEDULER", "fake")


def test_a_second_scheduler_submits_reports_and_cancels(
    fake_registered: None, tmp_path: Path
) -> None:
    from tests.unit import fake_scheduler

    with redirect_stdout(StringIO()) as printed:
        assert submit([*FAKE, f"run.output_dir={tmp_path}"]) == 0
    (run_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    job_id = (run_dir / "job_id").read_text().strip()
    assert fake_scheduler.SUBMITTED[job_id] == run_dir / "job.fake"
    assert "launcher.rank.worker" in (run_dir / "job.fake").read_text()
    assert f"ftl submit: job {job_id}" in printed.getvalue()

    with redirect_stdout(StringIO()) as printed:
        assert status(str(run_dir)) == 0
    assert f"job {job_id}: PENDING" in printed.getvalue()
    with redirect_stdout(StringIO()):
        assert cancel(str(run_dir)) == 0
    assert fake_scheduler.CANCELLED == [job_id]


def test_its_job_ids_are_its_own_strings(fake_default: None, tmp_path: Path) -> None:
    with redirect_stdout(StringIO()):
        assert submit([*FAKE, f"run.output_dir={tmp_path}"]) == 0
    (run_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    job_id = (run_dir / "job_id").read_text().strip()
    assert job_id.startswith("fake-")
    with redirect_stdout(StringIO()) as printed:
        assert status(job_id) == 0
    assert f"job {job_id}: " in printed.getvalue() and f"run dir: {run_dir}" in printed.getvalue()
    with pytest.raises(ConfigError, match="neither a run directory nor a job id"):
        status("12345")  # a Slurm id means nothing to this scheduler


def test_its_rules_join_the_one_validation_stage(fake_registered: None, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        submit([*FAKE, "cluster.nodes=8", "train.lr=0", f"run.output_dir={tmp_path}"])
    text = str(caught.value)
    assert "the fake cluster has 4 nodes" in text and "train.lr=0.0" in text
    assert not list(tmp_path.rglob("job.fake"))


def test_its_warnings_come_from_the_validation_stage(
    fake_registered: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.run.launch import check

    job = [*FAKE, "cluster.nodes=4", f"run.output_dir={tmp_path}"]
    warning = "cluster.nodes=4: the whole fake cluster; other jobs wait. Fix: cluster.nodes=3"
    assert [w[:len(warning)] for w in check(job, "submit").warnings] == [warning]
    assert not any(tmp_path.iterdir())  # the stage writes nothing
    assert submit(job) == 0
    assert f"ftl: warning: {warning}" in capsys.readouterr().err


def test_an_unregistered_scheduler_is_refused() -> None:
    with pytest.raises(ConfigError, match="cluster.scheduler=pbs: not one of none, slurm"):
        submit(["cluster=local", "cluster.scheduler=pbs"])


def test_cancel_of_a_running_job_asks_its_script_to_stop(
    fake_registered: None, tmp_path: Path
) -> None:
    """A running job is stopped through its run dir (the job script ends it with exit 75
    after the ranks' checkpoint, tests/unit/test_slurm_render.py), not the scheduler."""
    from tests.unit import fake_scheduler

    with redirect_stdout(StringIO()):
        assert submit([*FAKE, f"run.output_dir={tmp_path}"]) == 0
    (run_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    job_id = (run_dir / "job_id").read_text().strip()
    fake_scheduler.RUNNING[job_id] = "RUNNING"
    try:
        with redirect_stdout(StringIO()) as printed:
            assert cancel(str(run_dir)) == 0
        with redirect_stdout(StringIO()) as shown:
            assert status(str(run_dir)) == 0
    finally:
        del fake_scheduler.RUNNING[job_id]
    assert job_id not in fake_scheduler.CANCELLED
    assert (run_dir / "cancel.requested").is_file() and (run_dir / "preempt.requested").exists()
    text = printed.getvalue()
    assert f"job {job_id} is running" in text and "exit status 75" in text
    assert f"fake-cancel {job_id}" in text  # how to end it at once instead
    assert "run: stopping (`ftl cancel`)" in shown.getvalue()
