"""Strategy table on CPU: every strategy of the table on the tiny Llama, 2 CPU ranks.

For ddp, zero1, zero2, zero2_offload, zero3, zero3_offload, fsdp and fsdp_offload, the same
run (`ftl train`, STEPS steps, the bundled arith data) measures, per strategy (medians of
--runs interleaved rounds):
- training-loop throughput: input tokens of all ranks per second from the end of step WARM
  to the last (bench.callbacks.StepClock), beside ddp's from the same rounds;
- peak RSS per rank (the larger of the two ranks, metrics/rank<R>.json), beside ddp's;
- model-state bytes per rank: measured (bench.callbacks.StateBytes: every live tensor as
  the second optimizer step starts) beside the estimator's prediction for that moment
  (launcher/estimator/memory.py: params + grads + optimizer on the device, plus the offloaded
  states on the host without DeepSpeed's 1.5 headroom factor; on CPU both are the same
  memory). A ratio that moves shows estimator drift; DDP's reducer buckets (4 bytes per
  parameter) are C++-only and invisible to the measurement, so ddp reads about 0.8.
- the run's peak of live tensor bytes per rank (the larger rank; result.json's "memory",
  launcher/rank/memtrace.py) beside the estimate's predicted peak (launcher/estimator/peak.py): the
  figure `ftl estimate` prints, against what the run reached.

Regressions show as a ratio that moves between runs of this benchmark, not as absolute
figures (the machine is shared). Run: `.venv/bin/python bench/strategy_table.py` (part of
`make bench`; 7-12 minutes on 2 cores). Writes bench/results/strategy_table.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT, entry, load_average, report
from train_overhead import clock_window, launcher_cmd, timed

STRATEGIES = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp",
              "fsdp_offload")
STEPS = 60
WARM = 10
OVERRIDES = [f"train.max_steps={STEPS}", "train.logging_steps=10", "train.eval_steps=0",
             "train.save_steps=1000", "train.eval_on_start=false", "cluster.gpus_per_node=2",
             "train.show_examples=0", "train.cpu_live_bytes=true"]
"""train.cpu_live_bytes: the live-tensor peak column needs the counting allocator, which CPU
ranks install only when asked (it costs every allocation: each strategy pays it alike)."""
MIB = 2**20


def predicted_state_bytes(strategy: str) -> float:
    """The estimator's per-rank model states at the start of an optimizer step."""
    sys.path.insert(0, str(ROOT))
    from launcher.config.architecture import count_params, largest_layer_params
    from launcher.config.compose import compose_config
    from launcher.engines import engine_of
    from launcher.estimator.memory import engine_model_state_parts, param_bytes

    cfg = compose_config([*OVERRIDES, f"strategy={strategy}"])
    s = cfg.strategy
    psi, n, p = count_params(cfg.model), cfg.world_size, param_bytes(cfg.precision.name)
    parts = engine_model_state_parts(psi, largest_layer_params(cfg.model), n,
                                     engine_of(s).memory_stage(s), s.offload_optimizer,
                                     s.offload_param, p)
    device = parts["params"] + parts["grads"] + parts["optimizer"]
    host = (16 + (p if s.offload_param else 0)) * psi / n if s.offload_optimizer else 0.0
    return device + host


def one_run(strategy: str, work: Path, tag: str) -> dict[str, float]:
    out, clock = work / f"out-{tag}", work / f"clock-{tag}"
    callbacks = (f"train.callbacks=[{{_target_:bench.callbacks.StepClock,out:{clock}}},"
                 f"{{_target_:bench.callbacks.StateBytes,out:{clock}}}]")
    timed(launcher_cmd("train", *OVERRIDES, f"strategy={strategy}", f"run.output_dir={out}",
                       f"dataset.cache_dir={work / 'data'}", callbacks))
    seconds, tokens, _ = clock_window(clock, WARM)
    (run_dir,) = out.glob("*/*/")
    rss = [json.loads(p.read_text())["peak_memory_mib"]
           for p in (run_dir / "metrics").glob("rank*.json")]
    states = [json.loads(p.read_text())["model_state_bytes"] for p in clock.glob("state-*.json")]
    memory = json.loads((run_dir / "result.json").read_text())["memory"]
    return {"tokens_per_s": tokens / seconds, "rss_mib": max(rss),
            "state_bytes": max(s for s in states if s is not None),
            "live_peak_bytes": max(memory["measured_peak_bytes"]),
            "predicted_peak_bytes": memory["predicted_peak_bytes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    options = parser.parse_args()
    strategies = ["ddp", *[s for s in options.strategies if s != "ddp"]]
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in strategies}
    load: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(options.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for i in range(options.runs):
            load.append(load_average())
            for strategy in strategies:
                runs[strategy].append(one_run(strategy, work, f"{strategy}-{i}"))
                r = runs[strategy][-1]
                print(f"  round {i} {strategy}: {r['tokens_per_s']:.0f} tok/s, peak RSS "
                      f"{r['rss_mib']:.0f} MiB, states {r['state_bytes'] / MIB:.2f} MiB, "
                      f"live peak {r['live_peak_bytes'] / MIB:.1f} MiB "
                      f"(predicted {r['predicted_peak_bytes'] / MIB:.1f})",
                      file=sys.stderr, flush=True)
    entries: list[dict[str, Any]] = []
    ddp = runs["ddp"]
    for strategy in strategies:
        mine = runs[strategy]
        extra = {"strategy": strategy, "load_average": load}
        entries.append(entry(f"tok/s {strategy} (vs ddp)", [r["tokens_per_s"] for r in mine],
                             [r["tokens_per_s"] for r in ddp], "tokens/s", **extra))
        entries.append(entry(f"peak RSS/rank {strategy} (vs ddp)", [r["rss_mib"] for r in mine],
                             [r["rss_mib"] for r in ddp], "MiB", **extra))
        predicted = predicted_state_bytes(strategy) / MIB
        measured = [r["state_bytes"] / MIB for r in mine]
        entries.append(entry(f"model states/rank {strategy} (meas/est)", measured,
                             [predicted] * len(measured), "MiB", **extra,
                             measured_median_bytes=statistics.median(
                                 r["state_bytes"] for r in mine)))
        entries.append(entry(f"live peak/rank {strategy} (meas/pred)",
                             [r["live_peak_bytes"] / MIB for r in mine],
                             [r["predicted_peak_bytes"] / MIB for r in mine], "MiB", **extra))
    report("strategy_table", entries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
