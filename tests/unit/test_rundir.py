"""The run dir's typed files: each record reads what the writers put on disk (same keys as
before they were typed, so older run dirs still read), and the readers' edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.rundir import (
    MetricsEvent,
    PlanRecord,
    RankMetrics,
    RunDir,
    read_complete_marker,
    write_complete_marker,
)

# metrics.jsonl lines as rank 0 writes them, one per kind.
LOG = {"step": 4, "launch": 1, "time": 5.0, "loss": 2.5, "learning_rate": 0.001,
       "tokens_per_s": 900.0, "peak_memory_mib": 512.0}
STARTUP = {"step": 1, "launch": 1, "time": 3.0, "event": "startup",
           "startup": {"imports": 1.5, "model": 0.5}, "peak_memory_mib": 100.0}
SAVE = {"step": 4, "launch": 1, "time": 6.0, "event": "save", "seconds": 3.5, "bytes": 10,
        "peak_memory_mib": 512.0}


@pytest.mark.parametrize(("line", "kind"), [(LOG, "log"), (STARTUP, "startup"), (SAVE, "save")])
def test_a_metrics_event_round_trips_its_line(line: dict, kind: str) -> None:
    event = MetricsEvent.from_dict(line)
    assert event.kind == kind and event.step == line["step"] and event.launch == 1
    assert event.to_dict() == line
    assert "peak_memory_mib" not in event.values and "event" not in event.values


def test_metrics_reader_skips_a_torn_line_and_reads_old_lines(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    assert run_dir.read_metrics() == []
    run_dir.append_metrics(MetricsEvent.from_dict(LOG))
    with run_dir.metrics.open("a") as out:
        out.write('{"step": 2, "loss": 1.0}\n{"step": 5, "lo')  # no launch (older); torn
    events = run_dir.read_metrics()
    assert [(e.step, e.launch, e.values.get("loss")) for e in events] == [(4, 1, 2.5),
                                                                          (2, 0, 1.0)]


def test_launches_are_numbered_once_and_read_back(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    assert run_dir.current_launch() == 0
    first = run_dir.record_launch(2, None, 0)
    second = run_dir.record_launch(4, "/ckpt/checkpoint-4", 4)
    assert (first.launch, second.launch) == (0, 1) and run_dir.current_launch() == 1
    lines = [json.loads(line) for line in run_dir.launches.read_text().splitlines()]
    assert set(lines[1]) == {"launch", "time", "world_size", "resumed_from", "start_step"}
    assert run_dir.read_launches()[1] == second


def test_records_ignore_unknown_keys_and_name_a_missing_one(tmp_path: Path) -> None:
    plan = PlanRecord.from_dict({"strategy": "zero2", "data_dir": "/d", "new_key": 1})
    assert plan.strategy == "zero2" and plan.data_dir == "/d" and plan.flops_per_token == 0.0
    with pytest.raises(ValueError, match="RankMetrics.*'rank'"):
        RankMetrics.from_dict({"peak_memory_mib": 1.0})
    run_dir = RunDir(tmp_path)
    run_dir.write_rank_metrics(RankMetrics(1, 2.5, 7))
    assert json.loads(run_dir.rank_metrics_file(1).read_text()) == {
        "rank": 1, "peak_memory_mib": 2.5, "tokens_seen": 7}  # no "memory": null
    assert run_dir.read_rank_metrics(1) == RankMetrics(1, 2.5, 7)
    assert run_dir.read_rank_metrics(0) is None


def test_complete_marker_round_trips(tmp_path: Path) -> None:
    assert read_complete_marker(tmp_path) is None
    write_complete_marker(tmp_path, 8, world_size=2)
    marker = read_complete_marker(tmp_path)
    assert marker is not None and (marker.step, marker.world_size) == (8, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["COMPLETE"]  # no temp file left
