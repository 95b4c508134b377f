"""Peak memory per rank: the figure every metrics line carries, and metrics/rank<R>.json's
per-phase live-tensor peaks (launcher/rank/memtrace.py) gathered into result.json."""

from __future__ import annotations

import resource
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from launcher.rank import memtrace
from launcher.rundir import PlanRecord, RankMetrics, RunDir


def peak_memory_mib() -> float:
    """Peak accelerator memory of this rank, or peak resident memory on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def record_memory(trainer: Any, run_dir: RunDir, plan: PlanRecord) -> dict[str, Any]:
    """Every rank, after the final save: its live-tensor peaks per phase into
    metrics/rank<R>.json ("memory"); returns result.json's "memory" with every rank's
    figures (one all_gather_object)."""
    mine = memtrace.summary()
    rank = trainer.args.process_index
    record = run_dir.read_rank_metrics(rank) or RankMetrics(rank)
    run_dir.write_rank_metrics(replace(record, memory=mine))
    ranks = [mine]
    if dist.is_available() and dist.is_initialized():
        ranks = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(ranks, mine)
    predicted = (plan.estimate or {}).get("peak_bytes")  # live tensor bytes
    return {"predicted_peak_bytes": int(predicted) if predicted else None,
            "measured_peak_bytes": [r.get("peak_bytes") for r in ranks],
            "measured_rss_bytes": [r.get("rss_peak_bytes") for r in ranks]}
