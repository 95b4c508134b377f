"""One dataclass per JSON run-dir file, its keys on disk the field names (launcher/rundir/
reads and writes them). `from_dict` ignores unknown keys and fails naming a missing one
without a default; defaults are for keys older run dirs lack. Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Self


class Record:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{key: value for key, value in data.items() if key in names})
        except TypeError as err:  # a missing key: "... missing 1 required ... 'step'"
            raise ValueError(f"{cls.__name__}: {err}") from None


@dataclass(frozen=True)
class PlanRecord(Record):
    """plan.json (the launcher): strategy, estimate, FLOPs, command. The ranks read
    data_dir, flops_per_token, peak_flops_per_device and estimate."""

    overrides: list[str] = field(default_factory=list)
    strategy: str | None = None
    strategy_reasons: list[str] = field(default_factory=list)
    world_size: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None
    precision: str | None = None
    estimate: dict[str, Any] | None = None
    """The chosen strategy's estimate row (launcher/estimator/estimate.py), with params
    and flops."""
    flops_per_token: float = 0.0
    peak_flops_per_device: float | None = None
    resume_from: str | None = None
    data_dir: str | None = None
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunResult(Record):
    """result.json (rank 0, last): the finished run's summary."""

    global_step: int
    world_size: int
    resumed_from: str | None
    start_step: int
    first_train_loss: float | None
    final_train_loss: float | None
    first_eval_loss: float | None
    final_eval_loss: float | None
    tokens_seen: int
    model_dir: str
    memory: dict[str, Any] | None = None
    """predicted_peak_bytes, measured_peak_bytes and measured_rss_bytes per rank."""


@dataclass(frozen=True)
class LaunchRecord(Record):
    """A launches.jsonl line (rank 0 at train begin): one per launch, numbered from 0."""

    launch: int
    time: float
    world_size: int
    resumed_from: str | None
    start_step: int


@dataclass(frozen=True)
class RankMetrics(Record):
    """metrics/rank<R>.json (rank R): its peak memory and tokens seen at train end, and
    "memory" (launcher/rank/memtrace.py summary: peaks per phase) after the final save."""

    rank: int
    peak_memory_mib: float = 0.0
    tokens_seen: int = 0
    memory: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class CompleteMarker(Record):
    """checkpoint-N/COMPLETE (rank 0, after every rank wrote its part)."""

    step: int
    world_size: int
    time: float
    tp: int = 1
    """parallel.tp of the run that wrote it (each rank's shards are its tp split)."""
    sp: int = 1
    """parallel.sp of the run that wrote it (the Ulysses loader's place in the data)."""


@dataclass(frozen=True)
class Example(Record):
    """One held-out prompt of examples.json: the user's text, the reference answer and the
    greedy answers of the initial and the final model."""

    prompt: str
    expected: str
    before: str
    after: str


@dataclass(frozen=True)
class PairsRecord(Record):
    """pairs.json (`ftl train` after the ranks of a DPO run, train.show_examples > 0): the
    share of `count` held-out preference pairs whose chosen answer the model's own
    log-likelihood ranks above the rejected one, with the initial and the final model."""

    count: int
    ranked_before: float
    ranked_after: float


@dataclass(frozen=True)
class ExamplesRecord(Record):
    """examples.json (`ftl train` after the ranks, train.show_examples > 0): the exact-match
    rates over `count` held-out prompts before and after training, and every answer."""

    count: int
    exact_before: float
    exact_after: float
    examples: list[Example] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        examples = [Example.from_dict(row) for row in data.get("examples", [])]
        return super().from_dict({**data, "examples": examples})


@dataclass(frozen=True)
class EvalSummary(Record):
    """eval/<timestamp>/summary.json (`ftl eval`, `ftl train` with eval.tasks): what was
    evaluated and its scores; the harness's own results.json and per-sample logs sit
    beside it."""

    model: str
    """The model dir evaluated; for eval.before: `initial (...)`, the starting weights."""
    label: str
    """final (a run's model/ after training), initial (eval.before), or model (`ftl eval`)."""
    tasks: list[str]
    scores: dict[str, dict[str, float]]
    """task -> metric (the harness's `name,filter` key, e.g. exact_match,none) -> value."""
    samples: int
    """Examples scored, every task together."""
    seconds: float
    """Wall time of the harness (the model's loading included)."""


@dataclass(frozen=True)
class Preempted(Record):
    """preempted (rank 0, once the stop's checkpoint is complete)."""

    step: int
    time: float
    reason: str


@dataclass(frozen=True)
class HangRecord(Record):
    """hang/rank-<R>.json (rank R's watchdog, launcher/rank/watchdog.py): no progress
    within the bound; the stacks of every thread are in hang/rank-<R>.txt."""

    rank: int
    host: str
    pid: int
    step: int
    """The last optimizer step this rank completed (before the first of this launch: the
    step it resumed from, 0 for a fresh run)."""
    waited_s: float
    """Seconds since the rank's last progress (a step, an eval batch, a save)."""
    bound_s: float
    """The bound that ran out: train.hang_timeout_s, or first_step_timeout_s before the
    first step."""
    time: float
    main_thread: int
    """threading.main_thread().ident: its stack in the dump is "Thread 0x<ident in hex>"."""
    flight_recorder: str | None = None
    """The NCCL flight recorder's dump beside the stacks (GPU runs), if torch had one."""


@dataclass(frozen=True)
class TrackerRuns(Record):
    """trackers.json (rank 0, when it opens the tracker runs of a launch): the run's id in
    each tracker of train.report_to, so a launch that resumes its checkpoint continues the
    same tracker run (launcher/rank/tracker_runs.py). Ids only: never a credential or URI."""

    wandb: str | None = None
    mlflow: str | None = None
    launches: int = 0
    """Launches that have logged to these tracker runs (all run dirs together)."""


_CORE = ("step", "launch", "time", "event", "peak_memory_mib")


@dataclass(frozen=True)
class MetricsEvent:
    """A metrics.jsonl line (rank 0), by kind:
    - "log": the Trainer's log dict in `values` (loss, learning_rate, eval_loss, the final
      train_loss/train_runtime, tokens_per_s, tflops, mfu; launcher/rank/callbacks/metrics.py;
      on train logs also rank_busy_s, rank_forward_s, busy_steps: step_times.py);
    - "startup" / "finish": seconds per phase in `values` (launcher/timing.py);
    - "save": `values` {"seconds", "bytes"} of one checkpoint save.

    On disk a log line has no "event" key and its values sit beside step/launch/time; a
    phase line nests them under its kind ({"event": "startup", "startup": {...}})."""

    step: int
    launch: int = 0
    time: float = 0.0
    kind: str = "log"
    values: dict[str, Any] = field(default_factory=dict)
    peak_memory_mib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        head: dict[str, Any] = {"step": self.step, "launch": self.launch, "time": self.time}
        if self.kind == "log":
            body = dict(self.values)
        elif self.kind in ("startup", "finish"):
            body = {"event": self.kind, self.kind: self.values}
        else:
            body = {"event": self.kind, **self.values}
        return {**head, **body, "peak_memory_mib": self.peak_memory_mib}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsEvent:
        kind = data.get("event", "log")
        if kind in ("startup", "finish"):
            values = dict(data.get(kind) or {})
        else:
            values = {k: v for k, v in data.items() if k not in _CORE}
        return cls(int(data["step"]), int(data.get("launch", 0)), float(data.get("time", 0.0)),
                   kind, values, data.get("peak_memory_mib"))


@dataclass(frozen=True)
class StartupRecord(Record):
    """startup/rank-<R>.json (rank R, just before it joins the process group): who it is
    and where it was told to meet the others (launcher/rank/startup.py)."""

    rank: int
    world_size: int
    node: int
    host: str
    pid: int
    master_addr: str
    master_port: str
    time: float


@dataclass(frozen=True)
class DoctorReport(Record):
    """doctor.json (rank 0 of `ftl doctor`): the checks' rows and what every rank saw
    (launcher/doctor/)."""

    ok: bool
    run_dir: str
    backend: str
    world_size: int
    nodes: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    """check, status (ok | FAIL | info), detail, fix."""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
