"""`ftl report RUN_DIR`: a PNG of loss, learning rate and tokens/s, and a summary that puts
the plan's estimate beside what the run measured (memory: predicted / measured peak live
tensor bytes per phase and rank). Reads only the run dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.config.compose import load_run_config
from launcher.errors import DataError
from launcher.estimator.flops import run_flops, run_seconds
from launcher.estimator.memory import GIB
from launcher.estimator.peak import RANK0_MOMENTS, other_ranks_peak
from launcher.rundir import METRICS, MetricsEvent, PlanRecord, RankMetrics, RunDir


def series(history: list[MetricsEvent], key: str) -> tuple[list[float], list[float]]:
    points = [(e.step, e.values[key]) for e in history if e.kind == "log" and key in e.values]
    return [p[0] for p in points], [p[1] for p in points]


REWARD_CURVES = (
    ("rewards/margins", "train margin"), ("rewards/accuracies", "train accuracy"),
    ("eval_rewards/margins", "eval margin"), ("eval_rewards/accuracies", "eval accuracy"),
)
"""TRL DPOTrainer's logged keys: the chosen reward minus the rejected one, and the share of
pairs where it is positive."""


def draw_png(history: list[MetricsEvent], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    preference = any(series(history, key)[0] for key, _ in REWARD_CURVES)
    figure, axes = plt.subplots(1, 4 if preference else 3, figsize=(20 if preference else 15, 4))
    for key, label in (("loss", "train loss"), ("eval_loss", "eval loss")):
        axes[0].plot(*series(history, key), marker="o", markersize=3, label=label)
    axes[0].set_title("loss")
    axes[0].legend()
    lr_key = "learning_rate" if series(history, "learning_rate")[0] else "lr"
    axes[1].plot(*series(history, lr_key), color="tab:green")
    axes[1].set_title("learning rate")
    axes[2].plot(*series(history, "tokens_per_s"), color="tab:red")
    axes[2].set_title("tokens / s (all ranks)")
    if preference:
        for key, label in REWARD_CURVES:
            axes[3].plot(*series(history, key), marker="o", markersize=3, label=label)
        axes[3].set_title("DPO implicit reward (policy vs reference)")
        axes[3].legend()
    for axis in axes:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def summary(files: RunDir, history: list[MetricsEvent]) -> str:
    plan = files.read_plan() if files.plan.is_file() else PlanRecord()
    estimate = plan.estimate or {}
    ranks = files.all_rank_metrics()
    losses = series(history, "loss")[1]
    evals = series(history, "eval_loss")[1]
    lines = [f"run dir: {files.path}", f"strategy: {plan.strategy}  "
             f"world size: {plan.world_size}  gpu: {plan.gpu}"]
    if losses:
        lines.append(f"train loss: {losses[0]:.4f} -> {losses[-1]:.4f} ({len(losses)} logs)")
    if evals:
        lines.append(f"eval loss: {evals[0]:.4f} -> {evals[-1]:.4f}")
    for key, label in REWARD_CURVES:
        values = series(history, key)[1]
        if values:
            lines.append(f"reward {label}: {values[0]:.4f} -> {values[-1]:.4f}")
    for key, label in (("tokens_per_s", "throughput, tokens/s"), ("tflops", "achieved TFLOP/s"),
                       ("mfu", "MFU")):
        values = series(history, key)[1]
        if values:
            lines.append(f"{label}: {sum(values) / len(values):.4g} (mean of {len(values)} logs)")
    lines += _memory_lines(estimate, ranks)
    lines += _time_lines(files, history)
    lines += straggler_lines(history)
    return "\n".join(lines)


def _memory_lines(estimate: dict[str, Any], ranks: list[RankMetrics]) -> list[str]:
    """The per-phase, per-rank table when the run recorded live tensor bytes and the plan
    has per-moment predictions; else (older run dirs) the device totals."""
    table = memory_table(estimate, ranks)
    if table:
        return table
    lines = ([f"estimated memory per device: {estimate['gpu_bytes'] / GIB:.3f} GiB"]
             if estimate.get("gpu_bytes") else [])
    return lines + [f"measured peak memory, rank {rank.rank}: "
                    f"{rank.peak_memory_mib / 1024:.3f} GiB" for rank in ranks]


def predicted_for(estimate: dict[str, Any], phase: str, rank: int) -> float | None:
    """The predicted peak of memtrace's `phase` on `rank`: its moment of
    launcher/estimator/peak.py (the model build and the engine wrapping: construction), or
    None when the plan has none (startup, eval; final outside LoRA runs)."""
    if phase == "steady":
        return estimate.get("steady_bytes")
    moment = "construction" if phase in ("model", "engine") else phase
    if moment in RANK0_MOMENTS and rank > 0:
        moment = f"{moment}_other_ranks"
    return (estimate.get("moments") or {}).get(moment)


def _cell(predicted: float | None, measured: int | None) -> str:
    pred = "-" if predicted is None else f"{predicted / GIB:.3f}"
    meas = "-" if measured is None else f"{measured / GIB:.3f}"
    return f"{pred} / {meas}"


def _row(label: str, cells: list[str]) -> str:
    return "  " + f"{label:<12}" + "".join(f"{cell:>21}" for cell in cells)


def memory_table(estimate: dict[str, Any], ranks: list[RankMetrics]) -> list[str]:
    """Lines: one row per phase, one `predicted / measured` GiB column per rank, then the
    whole run's peak with measured/predicted, and the peak RSS beside it."""
    records = [r for r in ranks if r.memory]
    if not records or not estimate.get("moments"):
        return []
    lines = ["memory per rank, live tensor GiB (predicted / measured):",
             _row("phase", [f"rank {r.rank}" for r in records])]
    # every phase any rank recorded, in the order the first rank that has it wrote them
    for phase in dict.fromkeys(name for r in records for name in r.memory.get("phases", {})):
        lines.append(_row(phase, [
            _cell(predicted_for(estimate, phase, r.rank),
                  r.memory["phases"].get(phase, {}).get("peak_bytes")) for r in records]))
    lines.append(_row("run peak", [_cell(_rank_peak(estimate, r.rank), r.memory.get("peak_bytes"))
                                   for r in records]))
    lines.append(_row("RSS peak", [_cell(None, r.memory.get("rss_peak_bytes")) for r in records]))
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


def _time_lines(files: RunDir, history: list[MetricsEvent]) -> list[str]:
    """Measured train time beside the estimator's time for the tokens the run really saw."""
    final = [e.values for e in history if "train_loss" in e.values and "train_runtime" in e.values]
    if not final:
        return []
    lines = [f"measured train time: {final[-1]['train_runtime']:.1f} s"]
    tokens = final[-1].get("num_input_tokens_seen")
    if tokens and files.config.is_file():  # the estimator's time for them, as `ftl estimate`'s
        cfg = load_run_config(files.config)
        seconds = run_seconds(cfg, run_flops(cfg, tokens))
        lines.append(f"estimated train time for those {tokens} tokens: {seconds:.1f} s")
    return lines


def straggler_lines(history: list[MetricsEvent]) -> list[str]:
    """The slowest rank and how long the others waited for it, from each train log's
    per-rank busy seconds per step (launcher/rank/callbacks/step_times.py: step begin to
    the end of the rank's own backward), and the ranks' forward seconds. In each logged
    interval every rank waited for the busiest one: its busy time minus their own."""
    rows = [e.values for e in history if e.kind == "log" and e.values.get("rank_busy_s")]
    if not rows:
        return []
    measured = [(v["rank_busy_s"], int(v.get("busy_steps", 1))) for v in rows
                if None not in v["rank_busy_s"]]
    if not measured:
        return ["per-rank busy time: not measured (no rank's backward reached the gradient "
                "of its first trainable parameter)"]
    ranks, steps = len(measured[0][0]), sum(n for _, n in measured)
    means, slowest, fastest = _per_step(measured)
    waited = [sum((max(row) - row[r]) * n for row, n in measured) for r in range(ranks)]
    lines = [f"slowest rank: {slowest}, busy {means[slowest]:.3f} s/step (fastest: rank "
             f"{fastest}, {means[fastest]:.3f} s/step; busy = step begin to the end of the "
             f"rank's own backward, {steps} steps)"]
    others = [r for r in range(ranks) if r != slowest]
    if others:
        most = max(others, key=waited.__getitem__)
        lines.append(f"the other ranks waited for the busiest "
                     f"{sum(waited[r] for r in others) / len(others):.2f} s each over those "
                     f"steps ({waited[most]:.2f} s at most, rank {most})")
    forward = [(v["rank_forward_s"], int(v.get("busy_steps", 1))) for v in rows
               if v.get("rank_forward_s") and None not in v["rank_forward_s"]]
    if forward and ranks > 1:
        f_means, f_slow, f_fast = _per_step(forward)
        lines.append(f"forward: slowest rank {f_slow}, {f_means[f_slow]:.3f} s/step (fastest: "
                     f"rank {f_fast}, {f_means[f_fast]:.3f}; no collective in it under DDP "
                     "and ZeRO-1/2)")
    return lines


def _per_step(rows: list[tuple[list[float], int]]) -> tuple[list[float], int, int]:
    """Each rank's mean over logged intervals of per-step means, weighted by steps; the
    ranks with the largest and the smallest."""
    steps = sum(n for _, n in rows)
    ranks = range(len(rows[0][0]))
    means = [sum(row[r] * n for row, n in rows) / steps for r in ranks]
    return means, max(ranks, key=means.__getitem__), min(ranks, key=means.__getitem__)


def report(run_dir: Path) -> tuple[str, Path]:
    """The summary text and the PNG's path."""
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: not a directory. Fix: pass a run dir from outputs/.")
    files = RunDir(run_dir)
    if not files.metrics.is_file():
        raise DataError(
            f"{run_dir}: no {METRICS}. Fix: pass the run dir of a run that has started "
            "training (outputs/<run.name>/<timestamp>)."
        )
    history = files.read_metrics()
    png = draw_png(history, files.report_png, title=str(run_dir.name))
    return summary(files, history), png
