"""Training overhead: `ftl train` against a hand-written HF Trainer script (issue #12).

Both train the tiny Llama (built from config) on the bundled arith data, tokenized once by
the launcher's cache so data, template and masking are identical, with the same batch,
learning rate, schedule, seed and steps, on 2 CPU ranks (torchrun, gloo), under ddp and
zero2. Runs are interleaved (ours, baseline, ours, ...) because the machine is shared.

Figures per strategy (medians of --runs runs, ratio = ours / baseline):
- training-loop throughput: input tokens (all ranks) per second between the end of step
  WARM and the end of the last step, timed by the same injected callback in both
  (bench/callbacks.py: StepClock). Target: ratio >= 0.98. Mid-run evaluation and
  checkpoints are off in both, so the window holds training steps and their logging only.
  The logged losses of both must agree (same batches, same updates), which the bench checks.
- training-loop CPU time per step (all ranks, same window): what the steps cost, nearly
  immune to other processes on a shared machine, which lengthen wall time instead. The
  baseline also pins what both do alike (gloo, adamw_torch, no unused-parameter search,
  no tqdm): see bench/baseline_trainer.py.
- train_runtime, the Trainer's own figure (what a user compares): train() from start to end,
  so the train-begin callbacks, the eval on start and the warm-up steps too;
  `hand_over_ftl` (baseline / ftl) >= 0.98 means ftl costs at most 2 % more.
- whole-process wall time: `python -m launcher train ...` (compose, validate, plan, run dir,
  torchrun, ranks, eval on start, 150 steps, final eval, model save) against
  `torchrun bench/baseline_trainer.py` (same eval on start, steps, final eval and save).
- where `ftl train`'s start-up goes: the phases every run logs ("[ftl] start-up: ..."),
  and the finish after the last step, read from metrics.jsonl's "startup" and "finish"
  events (launcher/timing.py), medians per phase.

Run: `.venv/bin/python bench/train_overhead.py` (part of `make bench`; about 5 minutes on 2
cores; `--runs N --strategies ddp zero2`). Writes bench/results/train_overhead.json.
`--contend N` runs N busy-looping processes beside both sides for the whole measurement (a
machine shared with another job, where ftl once fell to half the script's speed) and writes
bench/results/train_overhead_contended.json instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import ROOT, bench_env, entry, load_average, report

STEPS = 150
WARM = 10
"""Steps left out of the throughput window: the first step builds DeepSpeed's buckets,
allocator pools and the autograd graph caches."""
BENCH_OVERRIDES = [
    f"train.max_steps={STEPS}", "train.logging_steps=10", "train.eval_steps=0",
    "train.save_steps=1000", "train.eval_on_start=true", "cluster.gpus_per_node=2",
    "train.show_examples=0",  # the baseline answers no held-out prompts either
]
LOSS_TOLERANCE = 1e-3
"""Relative: the same batches and updates give the same losses up to reduction order."""


@dataclass
class Run:
    wall_s: float
    tokens_per_s: float
    tokens: int
    seconds: float
    cpu_ms_per_step: float
    """CPU time of all ranks together per step, in the throughput window."""
    losses: dict[int, float]
    train_runtime: float
    """The Trainer's own train_runtime: train()'s start to its end, so also its callbacks'
    train-begin work, the eval on start and the first steps outside the window."""
    startup: dict[str, float] = field(default_factory=dict)
    spans: dict[str, float] = field(default_factory=dict)
    """Wall seconds: process start to the first step's end, first to last step's end, last
    step's end to the process's exit (final eval, save, teardown)."""


def run_figures(wall: float, clock: Path) -> dict[str, Any]:
    seconds, tokens, cpu, losses = clock_figures(clock)
    rank0 = json.loads((clock / "clock-rank0.json").read_text())["steps"]
    start, end = LAST_SPAN
    spans = {"to first step": rank0[0][1] - start, "steps": rank0[-1][1] - rank0[0][1],
             "after last step": end - rank0[-1][1]}
    return {"wall_s": wall, "tokens_per_s": tokens / seconds, "tokens": tokens,
            "seconds": seconds, "cpu_ms_per_step": cpu * 1e3 / (STEPS - WARM),
            "losses": losses, "spans": spans,
            "train_runtime": json.loads((clock / "clock-rank0.json").read_text())["train_runtime"]}


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *args]


LAST_SPAN: list[float] = [0.0, 0.0]
"""time.monotonic() at the start and end of the latest `timed` process (one clock for every
process of this machine, StepClock's too)."""


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                          env={**bench_env(), **(env or {})})
    LAST_SPAN[:] = [start, time.monotonic()]
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return LAST_SPAN[1] - start, done.stdout


def clock_window(clock_dir: Path, warm: int = WARM) -> tuple[float, int, dict[int, float]]:
    """(seconds, tokens of all ranks) from the end of step `warm` to the end of the last
    step, and rank 0's logged losses."""
    seconds, tokens, _, losses = clock_figures(clock_dir, warm)
    return seconds, tokens, losses


def clock_figures(clock_dir: Path, warm: int = WARM
                  ) -> tuple[float, int, float, dict[int, float]]:
    """clock_window's figures plus the CPU seconds all ranks spent in the same window: a
    second measure that other processes on a shared machine barely disturb (they take wall
    time from the ranks, not add CPU time to them)."""
    records = [json.loads(p.read_text()) for p in sorted(clock_dir.glob("clock-rank*.json"))]
    if not records:
        raise RuntimeError(f"no StepClock records in {clock_dir}")
    tokens, seconds, cpu = 0, 0.0, 0.0
    losses: dict[int, float] = {}
    for record in records:
        steps = {step: rest for step, *rest in record["steps"]}
        last = max(steps)
        tokens += steps[last][1] - steps[warm][1]
        if len(steps[last]) > 2:
            cpu += steps[last][2] - steps[warm][2]
        if record["rank"] == 0:
            seconds = steps[last][0] - steps[warm][0]
            losses = {int(k): v for k, v in record["losses"].items()}
    return seconds, tokens, cpu, losses


def spec_for(strategy: str, overrides: list[str], work: Path, data: dict[str, Any]) -> dict:
    """What the baseline needs, from the config `ftl train` composes for the same overrides."""
    sys.path.insert(0, str(ROOT))
    from launcher.config.compose import compose_config

    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        cfg = compose_config(overrides)
    finally:
        os.chdir(cwd)
    zero = cfg.strategy
    if zero.backend not in ("ddp", "deepspeed") or zero.offload_optimizer or zero.offload_param:
        raise SystemExit(f"the baseline covers ddp and plain ZeRO stages, not {strategy}")
    # The same ZeRO block ftl writes (buckets, overlap, contiguous gradients): with only
    # {"stage": N}, DeepSpeed's 5e8-element default is one bucket for the tiny model, which
    # is another training (stage 2 would hold every gradient until the end of the backward).
    zero_block = None
    if zero.backend == "deepspeed":
        from launcher.engines.deepspeed.ds_config import build_ds_config

        zero_block = build_ds_config(cfg)["zero_optimization"]
    return {
        "model": asdict(cfg.model), "train": asdict(cfg.train),
        "tokenizer": cfg.model.tokenizer or cfg.model.path,
        "train_data": data["train"], "eval_data": data["eval"],
        "zero_optimization": zero_block,
    }


def ours(strategy: str, overrides: list[str], work: Path, tag: str) -> Run:
    clock = work / f"clock-{tag}"
    out = work / f"out-{tag}"
    argv = launcher_cmd("train", *overrides, f"run.output_dir={out}",
                        f"train.callbacks=[{{_target_:bench.callbacks.StepClock,out:{clock}}}]")
    wall, _ = timed(argv)
    figures = run_figures(wall, clock)
    (run_dir,) = out.glob("*/*/")
    phases: dict[str, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") in ("startup", "finish"):
            phases.update(record[record["event"]])
    return Run(**figures, startup=phases)


def baseline(spec: dict[str, Any], work: Path, tag: str) -> Run:
    clock = work / f"clock-{tag}"
    spec = {**spec, "output_dir": str(work / f"out-{tag}"), "clock_dir": str(clock)}
    spec_path = work / f"spec-{tag}.json"
    spec_path.write_text(json.dumps(spec))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [torchrun, "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
            str(ROOT / "bench" / "baseline_trainer.py"), str(spec_path)]
    wall, _ = timed(argv, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return Run(**run_figures(wall, clock))


def check_same_training(a: Run, b: Run, what: str) -> float:
    """Largest relative difference of the logged losses; both runs must log the same steps."""
    if sorted(a.losses) != sorted(b.losses) or not a.losses:
        raise RuntimeError(f"{what}: logged steps differ: {sorted(a.losses)} / {sorted(b.losses)}")
    worst = max(abs(a.losses[s] - b.losses[s]) / abs(b.losses[s]) for s in a.losses)
    if worst > LOSS_TOLERANCE:
        raise RuntimeError(f"{what}: losses differ by {worst:.2e} (relative): not the same "
                           f"training.\nours: {a.losses}\nbaseline: {b.losses}")
    return worst


def medians(figures: list[dict[str, float]]) -> dict[str, float]:
    phases: dict[str, list[float]] = {}
    for run in figures:
        for name, seconds in run.items():
            phases.setdefault(name, []).append(seconds)
    return {name: round(statistics.median(v), 3) for name, v in phases.items()}


def bench_strategy(strategy: str, work: Path, runs: int) -> list[dict[str, Any]]:
    overrides = [*BENCH_OVERRIDES, f"strategy={strategy}", f"dataset.cache_dir={work / 'data'}"]
    _, out = timed(launcher_cmd("preprocess", "--json", *overrides))
    spec = spec_for(strategy, overrides, work, json.loads(out))
    # Untimed: builds what is built once per machine (DeepSpeed's CPU comm op) and warms
    # the page cache, for the baseline as much as for us.
    timed(launcher_cmd("train", *overrides, "train.max_steps=2", "train.eval_on_start=false",
                       f"run.output_dir={work / f'warmup-{strategy}'}"))
    mine: list[Run] = []
    theirs: list[Run] = []
    load: list[float] = []
    for i in range(runs):
        load.append(load_average())
        mine.append(ours(strategy, overrides, work, f"ours-{strategy}-{i}"))
        theirs.append(baseline(spec, work, f"base-{strategy}-{i}"))
        a, b = mine[-1], theirs[-1]
        print(f"  {strategy} run {i}: ours {a.tokens_per_s:.0f} tok/s {a.cpu_ms_per_step:.1f} "
              f"CPU ms/step {a.wall_s:.1f} s, baseline {b.tokens_per_s:.0f} tok/s "
              f"{b.cpu_ms_per_step:.1f} CPU ms/step {b.wall_s:.1f} s (load {load[-1]:.2f})",
              file=sys.stderr, flush=True)
    worst = max(check_same_training(a, b, strategy) for a, b in zip(mine, theirs, strict=True))
    startup = medians([r.startup for r in mine])
    spans = {"ours": medians([r.spans for r in mine]),
             "baseline": medians([r.spans for r in theirs])}
    common = {"strategy": strategy, "load_average": load, "loss_max_rel_diff": worst}
    return [
        entry(f"train loop tok/s {strategy} (ftl/base)", [r.tokens_per_s for r in mine],
              [r.tokens_per_s for r in theirs], "tokens/s", **common,
              window_steps=[WARM, STEPS], tokens=mine[0].tokens),
        entry(f"train loop CPU/step {strategy} (ftl/base)", [r.cpu_ms_per_step for r in mine],
              [r.cpu_ms_per_step for r in theirs], "ms (all ranks)", **common),
        entry(f"train_runtime {strategy} (ftl/base)", [r.train_runtime for r in mine],
              [r.train_runtime for r in theirs], "s", **common,
              hand_over_ftl=statistics.median(r.train_runtime for r in theirs)
              / statistics.median(r.train_runtime for r in mine)),
        entry(f"whole process {strategy} (ftl/base)", [r.wall_s for r in mine],
              [r.wall_s for r in theirs], "s", **common, startup=startup, spans=spans),
    ]


def print_startup(entries: list[dict[str, Any]]) -> None:
    for e in entries:
        if e.get("startup"):
            for who, spans in e["spans"].items():
                parts = "  ".join(f"{k} {v:.2f}" for k, v in spans.items())
                print(f"{e['strategy']} whole process, {who} (s, medians): {parts}")
            phases = "  ".join(f"{k} {v:.2f}" for k, v in e["startup"].items())
            print(f"{e['strategy']} ftl train phases (s, medians): {phases}")


@contextlib.contextmanager
def contending(processes: int) -> Iterator[None]:
    """`processes` pure-Python busy loops for the duration: another job on the same cores,
    the same for ours and the baseline since their runs interleave."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=["ddp", "zero2"])
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    parser.add_argument("--contend", type=int, default=0, metavar="N",
                        help="busy-looping processes beside the runs (default 0: none)")
    options = parser.parse_args()
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, contending(options.contend):
        work = Path(options.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for strategy in options.strategies:
            entries += bench_strategy(strategy, work, options.runs)
    if options.contend:
        entries = [{**e, "contending_processes": options.contend} for e in entries]
    report("train_overhead_contended" if options.contend else "train_overhead", entries)
    print_startup(entries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
