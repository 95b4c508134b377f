"""Where a launch's time goes before its first step (and after its last): start-up phases,
which rank 0 prints after the first step and appends to metrics.jsonl (docs/benchmarks.md,
"Start-up of a launch"). The cost on the ranks is a handful of `time.time()` calls.

Marks are wall-clock seconds, so the `ftl` process and the ranks share one clock; each is
named after the moment that ends a phase. `ftl train` passes its marks to the ranks in ENV
(JSON naming the run dir, so a stale variable never applies to another run); ranks started
by a scheduler or by hand report from their own process start, read from /proc (Linux;
elsewhere "process launch" and "imports" show as one phase).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

ENV = "FTL_STARTUP_MARKS"

# (phase, mark that ends it), in order. A phase runs from the latest earlier mark that
# exists to its own mark; a phase whose mark is missing is left out (e.g. no `ftl`
# process under Slurm, no eval before the first step).
STARTUP_PHASES: tuple[tuple[str, str], ...] = (
    ("compose+validate", "validated"),    # ftl: compose, validate, estimate, machine checks
    ("data cache", "data_ready"),         # ftl: find (or build) the tokenized data
    ("plan+run dir", "spawn"),            # ftl: plan, write the run dir, start the launcher
    ("process launch", "process_start"),  # torchrun/deepspeed start, spawn the rank
    ("imports", "imported"),              # python, torch, transformers, datasets, deepspeed
    ("data", "data_loaded"),              # tokenizer, the cached data from disk
    ("distributed init", "args_ready"),   # process group, TrainingArguments
    ("model build", "model_built"),       # from config or weights (+ PEFT)
    ("trainer", "trainer_built"),         # Trainer, accelerator, callbacks
    ("engine init", "train_begin"),       # DDP / DeepSpeed / FSDP wrap, optimizer, resume
    ("first eval", "first_eval"),         # train.eval_on_start
    ("first step", "first_step"),         # first batch, forward, backward, optimizer step
)
FIRST_MARK = "ftl_start"
# After the last step: the Trainer's own wrap-up (an eval the schedule puts at the last
# step, the final checkpoint, its summary), then the worker's final eval and model save.
FINISH_PHASES: tuple[tuple[str, str], ...] = (
    ("last eval+checkpoint", "train_end"),
    ("final eval", "final_eval"),
    ("save", "saved"),
)
FINISH_FIRST_MARK = "last_step"


COMPILE_PHASE = "compile"
"""train.compile: the seconds torch.compile spent compiling before the first step ended,
moved out of the phases they fell in (see move_compile)."""


class Marks:
    """This process's marks (name -> time.time()); the first mark of a name wins."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.compiled: dict[str, float] = {}
        """Mark name -> seconds torch.compile had spent compiling when it was made (noted
        by the rank side with train.compile only; torch's own count)."""

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.setdefault(name, time.time() if at is None else at)

    def note_compiled(self, name: str, seconds: float) -> None:
        self.compiled.setdefault(name, seconds)

    def has(self, name: str) -> bool:
        return name in self.marks


MARKS = Marks()
"""The process-wide marks: the worker, its callbacks and `ftl train` add to them."""


def mark(name: str) -> None:
    MARKS.mark(name)


def phases(marks: Mapping[str, float], order: tuple[tuple[str, str], ...] = STARTUP_PHASES,
           first: str = FIRST_MARK) -> dict[str, float]:
    """Seconds per phase, in order: each from the latest earlier mark present to its own.
    Phases without their mark, or without any earlier mark, are left out; a negative span
    (clocks of two machines) is dropped rather than shown."""
    out: dict[str, float] = {}
    previous = marks.get(first)
    for phase, end in order:
        at = marks.get(end)
        if at is None:
            continue
        if previous is not None and at >= previous:
            out[phase] = round(at - previous, 3)
        previous = at
    return out


def move_compile(spans: Mapping[str, float], compiled: Mapping[str, float],
                 order: tuple[tuple[str, str], ...] = STARTUP_PHASES) -> dict[str, float]:
    """The phases with the compile seconds each held moved into one COMPILE_PHASE before
    the first step, so the total is unchanged. `compiled`: a mark -> the cumulative compile
    seconds when it was made; a phase held the growth since the previous noted mark (the
    model is compiled lazily: the first eval compiles its no-grad graph, the first step its
    forward and backward). Nothing noted: the phases as they are."""
    if not compiled:
        return dict(spans)
    moved, before, out = 0.0, 0.0, dict(spans)
    for phase, end in order:
        if end not in compiled:
            continue
        inside = max(compiled[end] - before, 0.0)
        before = compiled[end]
        if phase in out:
            inside = min(inside, out[phase])  # within the phase's own wall time
            out[phase] = round(out[phase] - inside, 3)
            moved += inside
    ordered = {}
    for phase, seconds in out.items():
        if phase == "first step":
            ordered[COMPILE_PHASE] = round(moved, 3)
        ordered[phase] = seconds
    ordered.setdefault(COMPILE_PHASE, round(moved, 3))
    return ordered


def _seconds(phases: Mapping[str, float]) -> str:
    return "  ".join(f"{name} {seconds:.2f}" for name, seconds in phases.items())


def startup_line(startup: Mapping[str, float]) -> str:
    """`[ftl] start-up: 14.2 s to the end of the first step (s): compose+validate 0.61  ...`."""
    total = sum(startup.values())
    return f"[ftl] start-up: {total:.1f} s to the end of the first step (s): {_seconds(startup)}"


def finish_line(finish: Mapping[str, float]) -> str:
    return f"[ftl] finish (s): {_seconds(finish)}"


# ----------------------------------------------------------------- across processes


def launch_env(run_dir: str, marks: Mapping[str, float]) -> dict[str, str]:
    """The variable `ftl train` adds to the launcher's environment."""
    return {ENV: json.dumps({"run_dir": str(run_dir), "marks": dict(marks)})}


def inherited_marks(run_dir: str, environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """The `ftl` process's marks, if it launched this very run dir; else none."""
    environ = os.environ if environ is None else environ
    try:
        payload = json.loads(environ.get(ENV, ""))
        if os.path.realpath(payload["run_dir"]) != os.path.realpath(run_dir):
            return {}
        return {str(k): float(v) for k, v in payload["marks"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def process_start_time(pid: int | str = "self") -> float | None:
    """When this process started (time.time() scale), from /proc; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 (starttime) of proc(5), after pid and comm
        since_boot = started_ticks / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age if age >= 0 else None


def rank_startup(run_dir: str) -> dict[str, float]:
    """Phases of this launch up to its first step: the `ftl` process's marks (when it
    launched this run dir), the process start, then this rank's marks."""
    every = dict(inherited_marks(run_dir))
    started = process_start_time()
    if started is not None:
        every["process_start"] = started
    every.update(MARKS.marks)
    return move_compile(phases(every), MARKS.compiled)


def finish() -> dict[str, float]:
    """Phases after the last step (empty for a launch that stopped early)."""
    return phases(MARKS.marks, FINISH_PHASES, FINISH_FIRST_MARK)
