"""`ftl train` end to end as a user runs it: the demo as `make train` runs it, with its
run dir, launcher, ranks, live metrics, evaluation before and after, `ftl report` and `ftl
chat`; and a run whose ranks fail says which rank and where its log is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import torch
from transformers import AutoModelForCausalLM

from launcher.cli import main
from launcher.config.compose import PROJECT_ROOT
from launcher.rundir import EvalDir, EvalSummary, RunDir
from launcher.rundir.records import ExamplesRecord
from tests.integration.runs import FAST_TRAIN, ftl_here, write_user_task

pytestmark = pytest.mark.slow


def ftl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                          text=True, timeout=900, cwd=PROJECT_ROOT)


def run_dirs(output_dir: Path) -> list[Path]:
    """outputs/<run.name>/<timestamp> dirs (none under a hidden dir, such as a tokenized-data
    cache that dataset.cache_dir put there)."""
    return [p for p in output_dir.glob("*/*") if p.is_dir() and not p.parent.name.startswith(".")]


def only_run_dir(output_dir: Path) -> Path:
    (run_dir,) = run_dirs(output_dir)
    return run_dir


def test_the_embedded_default_learns_its_held_out_sums_and_records_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make train` as a newcomer runs it (the demo preset; about a minute of training on 2
    cores), with eval.tasks before and after training (the bundled task and a user task from
    eval.include_path): the harness scores >= 90 % of the 200 held-out sums exactly right,
    from none before; train.show_examples agrees; every record of the run is written and
    read back by `ftl report`; `ftl chat` answers a held-out prompt."""
    tasks = write_user_task(tmp_path)
    done = ftl("train", "eval.tasks=[arith,my_sums]", f"eval.include_path={tasks}",
               "eval.before=true", f"run.output_dir={tmp_path}",
               "train.cpu_live_bytes=true")  # live bytes per phase for the report's table
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    assert f"Model: {run_dir / 'model'}" in done.stdout
    record = assert_examples_shown(done.stdout, RunDir(run_dir), 200)
    assert record.exact_before == 0.0 and record.exact_after >= 0.9, record.exact_after
    initial, final = assert_evaluated_before_and_after(
        done.stdout, RunDir(run_dir), {"arith": 200, "my_sums": 2})
    before, after = (s.scores["arith"]["exact_match,none"] for s in (initial, final))
    assert before <= 0.01 and after >= 0.9, (before, after)
    assert abs(after - record.exact_after) <= 0.05  # the harness agrees with show_examples
    assert_records(run_dir, saves=[*range(100, 1201, 100), 1235])
    assert_report(run_dir)
    # ftl chat (in process: its CLI is test_quantize_chat's) on a held-out sum
    assert main(["chat", str(run_dir / "model"), "--prompt", "12+30"]) == 0
    assert capsys.readouterr().out.strip() == "42"


def assert_records(run_dir: Path, saves: list[int]) -> None:
    """What a finished run leaves: a short result (no test probes), rank metrics, model/
    equal to the last checkpoint, the metrics history and the TensorBoard events with the
    harness's scores beside the curves."""
    assert not (run_dir / "probes").exists()  # a real run collects no test evidence
    result = json.loads((run_dir / "result.json").read_text())
    assert set(result) == {
        "global_step", "world_size", "resumed_from", "start_step", "first_train_loss",
        "final_train_loss", "first_eval_loss", "final_eval_loss", "tokens_seen", "model_dir",
        "memory",
    }
    memory = result["memory"]  # live tensor bytes per rank (launcher/rank/memtrace.py) and RSS
    assert len(memory["measured_peak_bytes"]) == len(memory["measured_rss_bytes"]) == 2
    assert all(0 < live < rss for live, rss in zip(memory["measured_peak_bytes"],
                                                    memory["measured_rss_bytes"], strict=True))
    # model/ holds the weights of the last step: those of its checkpoint, not a fresh init.
    saved = AutoModelForCausalLM.from_pretrained(run_dir / "model").state_dict()
    last = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / f"checkpoint-{saves[-1]}")
    assert saved.keys() == last.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in last.state_dict().items())

    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [row for row in history if "tokens_per_s" in row]
    assert speeds and all(row["tokens_per_s"] > 0 and row["tflops"] > 0 for row in speeds)
    # Each save's duration, from its step's end to its COMPLETE marker (ftl submit reads it).
    saved_at = [row for row in history if row.get("event") == "save"]
    assert [row["step"] for row in saved_at] == saves
    assert all(row["seconds"] > 0 and row["bytes"] > 10**6 for row in saved_at), saved_at
    # The typed reader sees every kind rank 0 writes, each naming this (first) launch.
    typed = RunDir(run_dir).read_metrics()
    assert len(typed) == len(history) and {e.launch for e in typed} == {0}
    assert {e.kind for e in typed} == {"log", "startup", "finish", "save"}
    ranks = sorted(p.name for p in (run_dir / "metrics").glob("rank*.json"))
    assert ranks == ["rank0.json", "rank1.json"]
    assert all(json.loads((run_dir / "metrics" / r).read_text())["peak_memory_mib"] > 100
               for r in ranks)
    events = b"".join(e.read_bytes() for e in (run_dir / "tensorboard").rglob("events.out*"))
    assert b"tokens_per_s" in events
    # eval.tasks' scores beside the curves: before (step 0) and after (the last step)
    assert b"eval_harness/arith/exact_match" in events


def assert_report(run_dir: Path) -> None:
    report = ftl_here("report", str(run_dir))  # the CLI in this process
    assert report.returncode == 0, report.stderr
    # predicted / measured live tensor bytes per phase and rank
    # (launcher/run/report.py, memory_table)
    assert "memory per rank, live tensor GiB (predicted / measured)" in report.stdout
    assert "rank 1" in report.stdout and "run peak" in report.stdout
    assert "estimated train time for those" in report.stdout
    image = matplotlib.image.imread(run_dir / "report.png")
    assert image.shape[0] > 100 and image.std() > 0.01


def assert_evaluated_before_and_after(stdout: str, run_dir: RunDir, counts: dict[str, int]
                                      ) -> tuple[EvalSummary, EvalSummary]:
    """eval.tasks after training: the harness scored the starting weights and the final
    model on each task (`counts`: task -> examples), each into its own RUN_DIR/eval/ dir,
    printed with a before -> after line; the per-sample logs hold the answers."""
    dirs = sorted(run_dir.eval_root.iterdir(), key=lambda d: d.name.rsplit("-", 1)[-1])
    assert [d.name.rsplit("-", 1)[-1] for d in dirs] == ["final", "initial"], dirs
    summaries = []
    for path, label in zip(dirs, ("final", "initial"), strict=True):
        eval_dir = EvalDir(path)
        summary = eval_dir.read_summary()
        assert summary is not None and summary.label == label
        assert summary.samples == sum(counts.values()) and set(summary.scores) == set(counts)
        assert set(summary.scores["arith"]) == {"exact_match,none"}  # no stderr, no counts
        for task, count in counts.items():
            samples = [json.loads(line) for line in eval_dir.samples(task).read_text()
                       .splitlines()]
            assert len(samples) == count and "exact_match" in samples[0]
        first = json.loads(eval_dir.samples("arith").read_text().splitlines()[0])
        assert first["target"] == "35"  # data/arith/eval.jsonl, resolved from the project root
        assert json.loads(eval_dir.results.read_text())["results"]["arith"]
        assert str(path) in stdout
        summaries.append(summary)
    assert "ftl eval: before -> after training:" in stdout
    assert "arith exact_match: " in stdout and "|arith  |" in stdout and "|my_sums|" in stdout
    final, initial = summaries
    return initial, final


def assert_examples_shown(stdout: str, run_dir: RunDir, count: int) -> ExamplesRecord:
    """After the model is saved, `ftl train` answered `count` held-out prompts with the
    initial and the final model (launcher/inference/examples.py), wrote examples.json and
    printed its table and the exact-match rates; each rate is the share of its answers
    equal to the reference."""
    record = ExamplesRecord.from_dict(json.loads(run_dir.examples.read_text()))
    assert record.count == len(record.examples) == count
    eval_rows = [json.loads(line) for line in
                 (PROJECT_ROOT / "data/arith/eval.jsonl").read_text().splitlines()]
    assert [(r.prompt, r.expected) for r in record.examples] == [
        (row["instruction"], row["output"]) for row in eval_rows[:count]]
    for rate, answers in ((record.exact_before, [r.before for r in record.examples]),
                          (record.exact_after, [r.after for r in record.examples])):
        hits = [a.strip() == r.expected for a, r in zip(answers, record.examples, strict=True)]
        assert rate == sum(hits) / count
    table = stdout[stdout.index(f"Model: {run_dir.model}"):]
    assert f"{count} held-out prompts" in table and str(run_dir.examples) in table
    assert (f"exact match: {record.exact_before:.1%} before training, "
            f"{record.exact_after:.1%} after ({count} prompts)") in table
    assert record.examples[0].prompt in table
    return record


def test_a_failing_rank_is_named_with_its_log(tmp_path: Path) -> None:
    # Bad data stops before any rank starts now, so the ranks' failure is injected.
    failing = "train.callbacks=[{_target_:tests.integration.probes.FailAtStep,step:2}]"
    done = ftl("train", *FAST_TRAIN, failing, f"run.output_dir={tmp_path}")
    assert done.returncode == 1, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    assert "ftl train: the run failed" in done.stderr
    assert "rank 0: " in done.stderr and "rank 1: " in done.stderr
    assert str(run_dir / "logs" / "rank0.error") in done.stderr
    assert "injected failure at step 2" in (run_dir / "logs" / "rank0.error").read_text()
    # Both ranks fail; the launcher may kill the slower one before it writes its file.
    errors = sorted((run_dir / "logs").glob("rank*.error"))
    assert {e.name for e in errors} <= {"rank0.error", "rank1.error"}
    for error in errors:
        text = error.read_text()
        assert "Traceback" in text and "injected failure at step 2" in text
    assert not (run_dir / "result.json").exists()
