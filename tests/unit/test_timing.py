"""Start-up phases (launcher/timing.py): the arithmetic, the line, the hand-over from `ftl`."""

from __future__ import annotations

import json
import os
import time

from launcher import timing


def test_phases_run_from_the_latest_earlier_mark() -> None:
    marks = {"ftl_start": 100.0, "validated": 100.5, "data_ready": 100.6, "spawn": 100.8,
             "process_start": 101.0, "imported": 104.0, "data_loaded": 104.2,
             "args_ready": 104.3, "model_built": 104.5, "trainer_built": 105.0,
             "train_begin": 105.5, "first_eval": 105.9, "first_step": 106.0}
    got = timing.phases(marks)
    assert list(got) == [name for name, _ in timing.STARTUP_PHASES]
    assert got["compose+validate"] == 0.5
    assert got["process launch"] == 0.2
    assert got["imports"] == 3.0
    assert got["first step"] == 0.1
    assert abs(sum(got.values()) - 6.0) < 1e-9


def test_missing_marks_drop_their_phase_and_the_next_spans_the_gap() -> None:
    # Launched by a scheduler (no ftl marks) and no eval before the first step.
    marks = {"process_start": 10.0, "imported": 13.0, "data_loaded": 13.5, "args_ready": 14.0,
             "model_built": 14.5, "trainer_built": 15.0, "train_begin": 16.0,
             "first_step": 16.5}
    got = timing.phases(marks)
    assert "compose+validate" not in got and "process launch" not in got
    assert "first eval" not in got
    assert got["imports"] == 3.0
    assert got["first step"] == 0.5  # from train_begin: there was no eval
    # Without the process start, imports run from the previous mark there is.
    assert timing.phases({"spawn": 1.0, "imported": 4.0})["imports"] == 3.0


def test_a_negative_span_is_dropped_not_shown() -> None:
    got = timing.phases({"ftl_start": 0.0, "spawn": 5.0, "process_start": 4.0, "imported": 6.0})
    assert "process launch" not in got
    assert got["imports"] == 2.0


def test_startup_and_finish_lines() -> None:
    line = timing.startup_line({"imports": 3.0, "first step": 0.25})
    assert line.startswith("[ftl] start-up: 3.2 s to the end of the first step")
    assert "imports 3.00" in line and "first step 0.25" in line
    finish = timing.phases({"last_step": 1.0, "train_end": 1.5, "final_eval": 1.75,
                            "saved": 2.0}, timing.FINISH_PHASES, timing.FINISH_FIRST_MARK)
    assert finish == {"last eval+checkpoint": 0.5, "final eval": 0.25, "save": 0.25}
    assert timing.finish_line(finish).startswith("[ftl] finish (s): last eval+checkpoint 0.50")


def test_compile_seconds_move_into_one_phase_and_the_total_stays() -> None:
    """train.compile: what torch.compile spent in the first eval (its no-grad graph) and in
    the first step (forward and backward) becomes the `compile` phase before the first
    step; the phases still add up to the time to the end of the first step."""
    spans = {"engine init": 1.0, "first eval": 4.0, "first step": 20.0}
    compiled = {"train_begin": 0.0, "first_eval": 3.5, "first_step": 21.0}  # cumulative
    got = timing.move_compile(spans, compiled)
    assert list(got) == ["engine init", "first eval", "compile", "first step"]
    assert got == {"engine init": 1.0, "first eval": 0.5, "compile": 21.0, "first step": 2.5}
    # never more than a phase's own wall time (clocks of two counters)
    assert timing.move_compile({"first step": 2.0}, {"first_step": 3.0}) == \
        {"compile": 2.0, "first step": 0.0}
    assert timing.move_compile(spans, {}) == spans  # compile off: nothing noted


def test_marks_keep_the_first_time_of_a_name() -> None:
    marks = timing.Marks()
    marks.mark("a", 1.0)
    marks.mark("a", 2.0)
    assert marks.marks == {"a": 1.0} and marks.has("a") and not marks.has("b")


def test_ftl_marks_reach_only_the_run_dir_they_name(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = timing.launch_env(str(run_dir), {"ftl_start": 1.0, "spawn": 2.0})
    assert json.loads(env[timing.ENV])["run_dir"] == str(run_dir)
    assert timing.inherited_marks(str(run_dir), env) == {"ftl_start": 1.0, "spawn": 2.0}
    assert timing.inherited_marks(str(tmp_path / "other"), env) == {}
    assert timing.inherited_marks(str(run_dir), {timing.ENV: "not json"}) == {}
    assert timing.inherited_marks(str(run_dir), {}) == {}


def test_process_start_is_in_the_past_and_recent() -> None:
    started = timing.process_start_time()
    if os.path.exists("/proc/self/stat"):
        assert started is not None
        assert time.time() - 3600 * 24 * 365 < started <= time.time()
    assert timing.process_start_time(pid=2**30) is None  # no such process


IMPORT_CODE = """
import sys
from launcher.config.compose import compose_config
from launcher import timing
from launcher.engines import engine_of
from launcher.rank import imports
cfg = compose_config(sys.argv[1:])
imports.import_stack(cfg, engine_of(cfg.strategy))
import transformers.utils
print("deepspeed" in sys.modules, transformers.utils.is_peft_available(),
      transformers.utils.is_datasets_available(), timing.MARKS.has("imported"))
"""


def test_a_rank_imports_its_stack_in_one_phase_and_hides_nothing() -> None:
    """The worker's import phase: the engine's own library (deepspeed for ZeRO) is imported
    in it and marks its end; installed libraries stay visible to transformers."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", IMPORT_CODE, "strategy=zero2"],
                          capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "True True True True"


# --- the training loop's own cost: tokens seen without a collective per step ------------


class _Args:
    include_num_input_tokens_seen = "all"


class _Trainer:
    """What TokenCounter.install touches of a transformers Trainer."""

    def __init__(self) -> None:
        self.args, self.model, self.added = _Args(), object(), []

    def _track_num_input_tokens(self, inputs) -> None:  # the Trainer's own (gathers)
        raise AssertionError("replaced by TokenCounter")

    def add_callback(self, callback) -> None:
        self.added.append(callback)


def test_token_counter_counts_locally_and_sums_when_read() -> None:
    import torch
    from transformers import Trainer, TrainerControl, TrainerState

    from launcher.rank.callbacks.tokens import TokenCounter

    # The Trainer method it replaces exists in this transformers (else it counts as before).
    assert callable(getattr(Trainer, "_track_num_input_tokens", None))
    trainer = _Trainer()
    counter = TokenCounter.install(trainer)
    assert counter is not None and trainer.added == [counter]
    trainer._track_num_input_tokens({"input_ids": torch.zeros(4, 9, dtype=torch.long)})
    trainer._track_num_input_tokens({"input_ids": torch.zeros(4, 7, dtype=torch.long)})
    state = TrainerState(num_input_tokens_seen=100)
    counter.on_step_end(None, state, TrainerControl())  # nothing reads the count: no sync
    assert state.num_input_tokens_seen == 100 and counter.pending == 64
    counter.on_step_end(None, state, TrainerControl(should_log=True))
    assert state.num_input_tokens_seen == 164 and counter.pending == 0
    counter.track({"input_ids": torch.zeros(2, 3)})
    counter.on_step_end(None, state, TrainerControl(should_save=True))
    assert state.num_input_tokens_seen == 170
    other = _Trainer()
    other.args.include_num_input_tokens_seen = "non_padding"
    assert TokenCounter.install(other) is None and other.added == []  # the Trainer counts
