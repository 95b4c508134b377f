"""The one validation stage: every rule for what the verb is about to do, run once, every
problem in one ConfigError before anything is written (the order: docs/design.md, "The
validation stage"). Risks the user may take come back in `Checked.warnings`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.config.report_to import tracker_problems
from launcher.config.schema import RunConfig
from launcher.config.strategies import is_auto
from launcher.data.preprocess import data_dir
from launcher.errors import ConfigError
from launcher.estimator.auto import (
    choice_line,
    choose,
    model_parallel_layout,
    nothing_fits,
    pick,
    pick_notes,
    rejection,
)
from launcher.estimator.disk import measured_save_time, save_time_estimate
from launcher.estimator.estimate import Estimate, estimate
from launcher.schedulers.base import DEFAULT_SCHEDULER, SCHEDULERS, get_scheduler
from launcher.validation import preflight
from launcher.validation.evaluation import eval_task_problems
from launcher.validation.mixture import streaming_problems
from launcher.validation.rules import config_problems, data_problems, strategy_problems

Target = Literal["estimate", "plan", "train", "submit", "preprocess"]


@dataclass
class Checked:
    """A RunConfig that passed validation for its target, with what validation computed."""

    cfg: RunConfig
    """strategy=auto resolved (except for target=estimate)."""
    target: Target
    estimate: Estimate | None = None
    strategy_reasons: list[str] = field(default_factory=list)
    strategy_choice: str = ""
    """strategy=auto's pick in one line (what it turned on with it); empty: named."""
    resume_from: Path | None = None
    data_dir: Path | None = None
    """Where the tokenized data is (or will be) cached; train, submit and preprocess."""
    warnings: list[str] = field(default_factory=list)
    """Each naming key, value and fix, like a problem; the verb prints them."""
    visible_devices: str | None = None
    """`ftl train` on GPUs: this machine's CUDA_VISIBLE_DEVICES, which the deepspeed
    launcher must be told (launchers/command.py)."""


def validate(cfg: RunConfig, target: Target, *, dry_run: bool = False,
             counts_tokens: bool = False) -> Checked:
    """Raise one ConfigError listing every problem; else what the planner needs. dry_run
    (`ftl submit --dry-run`): the output dir's checks, of this machine only, are warnings.
    preprocess checks only what preprocessing reads (rules.data_problems); counts_tokens
    (`ftl estimate --count-tokens`, which tokenizes) adds its sources' checks."""
    checked = Checked(cfg=cfg, target=target)
    if target == "preprocess":
        problems = data_problems(cfg)
        problems += [] if problems else preflight.missing_sources(cfg, preflight.DATA_SOURCES)
        problems += [] if problems else preflight.unreadable_data(cfg)
    else:
        problems = config_problems(cfg)
        if not problems:
            problems += _resolve_strategy(checked)
        if not is_auto(checked.cfg.strategy):
            problems += strategy_problems(checked.cfg)
    if target in ("train", "submit"):
        # not `ftl estimate`'s: a stream's tokens without max_steps come from its sizes
        problems += streaming_problems(checked.cfg) + _launch_problems(checked, dry_run)
    if target in ("train", "submit") and checked.cfg.eval.tasks and not problems:
        # after every other rule: loading the tasks reads their data (seconds)
        problems += eval_task_problems(checked.cfg.eval, "eval.tasks")
    if counts_tokens and not problems:  # the tokenizer and data, before a hub call hangs
        problems += preflight.missing_sources(
            cfg, preflight.DATA_SOURCES, "set dataset.num_tokens (tokens per epoch) or "
            "train.max_steps instead of --count-tokens")
        problems += [] if problems else preflight.unreadable_data(cfg)
    if (target in ("train", "submit", "preprocess") or counts_tokens) and not problems:
        # hub datasets pinned to a commit (the hub or its cache), before the data key
        problems += preflight.hub_problems(checked.cfg)
    if problems:
        raise ConfigError(problems)
    if target in ("train", "submit", "preprocess"):
        checked.data_dir = data_dir(checked.cfg)
    return checked


def _resolve_strategy(checked: Checked) -> list[str]:
    """One estimate; for strategy=auto the fastest strategy that fits."""
    cfg = checked.cfg
    checked.estimate = estimate(cfg)
    if not is_auto(cfg.strategy) or checked.target == "estimate":
        return []
    picked = pick(cfg, checked.estimate)
    if picked is not None:
        notes = pick_notes(cfg, checked.estimate, picked)
        checked.cfg, checked.estimate = picked.cfg, picked.estimate
        checked.strategy_reasons = picked.reasons + notes
        checked.strategy_choice = choice_line(picked.cfg, picked.checkpointed)
        return []
    reasons = choose(cfg, checked.estimate)[1]
    layout = model_parallel_layout(cfg)
    if layout is None:
        return nothing_fits(cfg, reasons)
    checked.cfg, checked.estimate, chosen = layout
    checked.strategy_reasons = reasons + chosen
    checked.strategy_choice = choice_line(checked.cfg, False)
    return []


def _launch_problems(checked: Checked, dry_run: bool) -> list[str]:
    cfg = checked.cfg
    if checked.target == "train":
        problems = preflight.local_launch_problems(cfg)
        problems += preflight.host_memory_problems(cfg, checked.estimate)
        checked.visible_devices, visible = preflight.visible_devices(cfg, os.environ)
        problems += visible + preflight.fused_adam_problems(
            cfg, os.environ, preflight.torch_cuda_version())
    else:
        # The job reads the same files: a bad row is better found on the login node.
        problems = (_scheduler_problems(cfg) + preflight.model_dir_problems(cfg)
                    + preflight.unreadable_data(cfg))
    # this machine's, not the job's: warnings for a dry run; too little space is a risk
    # the user may take (run.force)
    here, space = preflight.output_checks(cfg, checked.estimate)
    (checked.warnings if dry_run or cfg.run.force else here).extend(space)
    (checked.warnings if dry_run else problems).extend(here)
    # a tracker's package and credential: this environment's, which a batch job inherits
    (checked.warnings if dry_run else problems).extend(tracker_problems(cfg))
    checked.resume_from, resume_problems = preflight.find_resume_from(cfg)
    problems += resume_problems
    if checked.target == "submit" and not problems:  # not for an unregistered scheduler
        checked.warnings += _scheduler_warnings(checked)
    return problems + _fit_problems(checked)


def _scheduler_problems(cfg: RunConfig) -> list[str]:
    if cfg.cluster.scheduler not in SCHEDULERS:
        return [
            f"cluster={cfg.cluster.name} (cluster.scheduler={cfg.cluster.scheduler}): "
            f"`ftl submit` sends a batch job to a scheduler ({', '.join(SCHEDULERS)}). "
            f"Fix: cluster={DEFAULT_SCHEDULER}, or `ftl train` to run on this machine."
        ]
    return get_scheduler(cfg.cluster.scheduler).problems(cfg)


def _scheduler_warnings(checked: Checked) -> list[str]:
    """Given a checkpoint's save time: measured by the run this one resumes, else estimated."""
    cfg, est, resume = checked.cfg, checked.estimate, checked.resume_from
    if est is None:
        return []
    measured = measured_save_time(resume.parent.parent) if resume is not None else None
    save = measured or save_time_estimate(cfg, est.params, est.trainable_params)
    return get_scheduler(cfg.cluster.scheduler).warnings(cfg, save)


def _fit_problems(checked: Checked) -> list[str]:
    cfg, est = checked.cfg, checked.estimate
    row = est.row(cfg.strategy.name) if est is not None else None
    if row is None or row.fits or cfg.run.force:
        return []
    return [  # the same verdict strategy=auto gives each rung it passes over
        f"strategy={cfg.strategy.name}: {rejection(cfg, row)}. Fix: see `ftl estimate` for "
        "a strategy that fits (or strategy=auto), peft=lora, more GPUs, or run.force=true to "
        "try anyway."
    ]
