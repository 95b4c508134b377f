"""`ftl report`'s memory table: predicted beside measured peak live tensor bytes, per phase
and per rank.

Predicted: plan.json's estimate (launcher/estimator/peak.py moments). Measured: each rank's
metrics/rank<R>.json "memory" (launcher/rank/memtrace.py phases). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from launcher.estimator.peak import RANK0_MOMENTS, other_ranks_peak
from launcher.rundir.records import RankMetrics

GIB = 1024**3

PHASE_MOMENTS = {
    "model": "construction",
    "engine": "construction",
    "first_step": "first_step",
    "steady": "steady",
    "checkpoint": "checkpoint",
    "final": "final",
}
"""Phase (metrics/rank<R>.json) -> the moment that predicts its peak. Construction bounds
both the model build and the engine wrapping; "final" is predicted for LoRA runs only (the
merged save: launcher/estimator/peak.py RANK0_MOMENTS); phases not listed (startup, eval) have no
prediction."""


def predicted_for(estimate: dict[str, Any], phase: str, rank: int) -> float | None:
    """The predicted peak of `phase` on `rank`, or None when the plan has none."""
    moments = estimate.get("moments") or {}
    moment = PHASE_MOMENTS.get(phase)
    if moment == "steady":
        return estimate.get("steady_bytes")
    if moment in RANK0_MOMENTS and rank > 0:
        moment = f"{moment}_other_ranks"
    return moments.get(moment) if moment else None


def _cell(predicted: float | None, measured: int | None) -> str:
    pred = "-" if predicted is None else f"{predicted / GIB:.3f}"
    meas = "-" if measured is None else f"{measured / GIB:.3f}"
    return f"{pred} / {meas}"


def _ordered_phases(ranks: list[RankMetrics]) -> list[str]:
    """Every phase any rank recorded, in the order the first rank that has it wrote them."""
    seen: list[str] = []
    for rank in ranks:
        for name in (rank.memory or {}).get("phases", {}):
            if name not in seen:
                seen.append(name)
    return seen


def memory_table(estimate: dict[str, Any], ranks: list[RankMetrics]) -> list[str]:
    """Lines: one row per phase, one `predicted / measured` GiB column per rank, then the
    whole run's peak with measured/predicted, and the peak RSS beside it."""
    records = [r for r in ranks if r.memory]
    if not records or not estimate.get("moments"):
        return []
    width = 21
    lines = ["memory per rank, live tensor GiB (predicted / measured):",
             "  " + f"{'phase':<12}" + "".join(f"{'rank ' + str(r.rank):>{width}}"
                                               for r in records)]
    for phase in _ordered_phases(records):
        cells = []
        for record in records:
            measured = record.memory["phases"].get(phase, {}).get("peak_bytes")
            cells.append(_cell(predicted_for(estimate, phase, record.rank), measured))
        lines.append("  " + f"{phase:<12}" + "".join(f"{c:>{width}}" for c in cells))
    lines.append("  " + f"{'run peak':<12}" + "".join(
        f"{_cell(_rank_peak(estimate, r.rank), r.memory.get('peak_bytes')):>{width}}"
        for r in records))
    lines.append("  " + f"{'RSS peak':<12}" + "".join(
        f"{_cell(None, r.memory.get('rss_peak_bytes')):>{width}}" for r in records))
    if estimate.get("construction_above_training"):
        lines.append("  predicted: model construction peaks above training")
    return lines


def _rank_peak(estimate: dict[str, Any], rank: int) -> float | None:
    """Rank 0 saves the gathered checkpoint (and LoRA's merged model); the other ranks'
    peak leaves those out."""
    moments = estimate.get("moments") or {}
    if rank == 0 or "checkpoint_other_ranks" not in moments:
        return estimate.get("peak_bytes")
    return other_ranks_peak(moments)
