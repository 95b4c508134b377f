"""The plan: a validated RunConfig (strategy=auto resolved), its cost, the DeepSpeed or
FSDP settings, and the text of every run-dir file. Pure: no I/O."""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from launcher import rundir
from launcher.config.schema import RunConfig
from launcher.engines import engine_of
from launcher.estimator.flops import flops_per_token, peak_flops_per_device
from launcher.estimator.memory import GIB
from launcher.launchers.command import Launch, render_argv, render_command
from launcher.rundir.records import PlanRecord
from launcher.validation.validate import Checked


@dataclass
class Plan:
    cfg: RunConfig
    strategy_reasons: list[str] = field(default_factory=list)
    estimate: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    """The engine's settings (ds_config, FSDP), written to RUN_DIR/`settings_file`."""
    settings_file: str | None = None
    resume_from: Path | None = None
    data_dir: Path | None = None
    flops_per_token: float = 0.0
    peak_flops_per_device: float | None = None


def make_plan(checked: Checked) -> Plan:
    """What validation produced, turned into the strategy's settings and the cost figures."""
    cfg = checked.cfg
    engine = engine_of(cfg.strategy)
    return Plan(
        cfg=cfg,
        strategy_reasons=checked.strategy_reasons,
        estimate=_chosen_estimate(checked),
        settings=engine.settings(cfg),
        settings_file=engine.settings_file,
        resume_from=checked.resume_from,
        data_dir=checked.data_dir,
        flops_per_token=flops_per_token(cfg),
        peak_flops_per_device=peak_flops_per_device(cfg),
    )


def _chosen_estimate(checked: Checked) -> dict[str, Any] | None:
    est = checked.estimate
    row = est.row(checked.cfg.strategy.name) if est is not None else None
    return None if est is None or row is None else {
        **asdict(row), "params": est.params, "flops": est.flops}


def run_dir_files(plan: Plan, launch: Launch, overrides: list[str]) -> dict[str, str]:
    """Every file of the run dir, as text (the worker reads config.yaml and the settings)."""
    files = {
        rundir.CONFIG: OmegaConf.to_yaml(OmegaConf.structured(plan.cfg)),
        rundir.PLAN: rundir.json_text(plan_record(plan, launch, overrides).to_dict()),
        rundir.LAUNCH_SCRIPT: launch_script(launch, overrides),
    }
    if plan.settings is not None and plan.settings_file is not None:
        files[plan.settings_file] = rundir.json_text(plan.settings)
    if launch.hostfile is not None:
        files[rundir.HOSTFILE] = launch.hostfile
    if plan.resume_from is not None:
        files[rundir.RESUME_FROM] = f"{plan.resume_from}\n"
        # Its settings for a checkpoint of another world size: whether one is converted is
        # the rank's call (a requeued job resumes its own checkpoints instead).
        engine = engine_of(plan.cfg.strategy)
        universal = (engine.universal_settings(plan.settings)
                     if plan.settings is not None else None)
        if universal is not None and engine.universal_settings_file:
            files[engine.universal_settings_file] = rundir.json_text(universal)
    return files


def plan_record(plan: Plan, launch: Launch, overrides: list[str]) -> PlanRecord:
    """plan.json: what the ranks and `ftl report` read of the plan."""
    cfg = plan.cfg
    return PlanRecord(
        overrides=overrides, strategy=cfg.strategy.name, strategy_reasons=plan.strategy_reasons,
        world_size=cfg.world_size, nodes=cfg.cluster.nodes,
        gpus_per_node=cfg.cluster.gpus_per_node, gpu=cfg.cluster.gpu,
        precision=cfg.precision.name, estimate=plan.estimate,
        flops_per_token=plan.flops_per_token, peak_flops_per_device=plan.peak_flops_per_device,
        resume_from=str(plan.resume_from) if plan.resume_from else None,
        data_dir=str(plan.data_dir) if plan.data_dir else None,
        command=launch.argv, env=launch.env,
    )


def resolve_tool(argv: list[str]) -> list[str]:
    """The torchrun/deepspeed beside this Python (the venv's), else whatever PATH has."""
    tool = Path(sys.executable).parent / argv[0]
    return [str(tool) if tool.exists() else argv[0], *argv[1:]]


def launch_script(launch: Launch, overrides: list[str]) -> str:
    """launch.sh: the exact command, runnable by hand from any directory."""
    argv = resolve_tool(launch.argv)
    lines = [
        "#!/usr/bin/env bash",
        f"# written by: ftl {shlex.join(overrides)}".rstrip(),
        "set -euo pipefail",
        *(f': "${{{name}:?set {name} on each node}}"' for name in launch.shell_vars),
        *(f"export {key}={shlex.quote(value)}" for key, value in launch.env.items()),
        f"exec {render_argv(argv, launch.shell_vars)} \"$@\"",
    ]
    return "\n".join(lines) + "\n"


def render_plan(plan: Plan, launch: Launch, run_dir: Path | None) -> str:
    """What `ftl plan` prints: config, strategy choice, estimate, settings, command."""
    cfg = plan.cfg
    parts = ["# resolved config", OmegaConf.to_yaml(OmegaConf.structured(cfg)).rstrip()]
    parts += ["", f"# strategy: {cfg.strategy.name} ({cfg.strategy.backend})"]
    parts += [f"#   {reason}" for reason in plan.strategy_reasons]
    if plan.estimate:
        parts += ["", "# estimate (per GPU)", _render_estimate(plan.estimate)]
    if plan.settings is not None:
        parts += ["", f"# {cfg.strategy.backend} settings ({plan.settings_file})",
                  rundir.json_text(plan.settings).rstrip()]
    parts += ["", f"# launch ({cfg.world_size} processes on {cfg.cluster.nodes} node(s))"]
    if launch.per_node:
        needed = " ".join(f"{name}=..." for name in launch.shell_vars)
        parts.append(f"# run on every node, with {needed} set there (ftl submit does this):")
    parts.append(render_command(launch))
    if run_dir is not None:
        parts += ["", f"# run dir: {run_dir}"]
    return "\n".join(parts) + "\n"


def _render_estimate(row: dict[str, Any]) -> str:
    fits = "fits" if row.get("fits") else "DOES NOT FIT"
    text = (
        f"gpu {row['gpu_bytes'] / GIB:.2f} GiB (predicted peak {row['peak_bytes'] / GIB:.2f} "
        f"GiB of tensors, step {row['steady_bytes'] / GIB:.2f} GiB; model states "
        f"{row['model_state_gpu_bytes'] / GIB:.2f} GiB), host {row['host_bytes'] / GIB:.2f} GiB"
        f" -> {fits}"
    )
    if row.get("est_seconds"):
        text += f"; est. time {row['est_seconds'] / 3600:.2f} h"
    if row.get("host_peak_bytes"):
        text += f"\nhost tensors per rank up to {row['host_peak_bytes'] / GIB:.2f} GiB"
    if row.get("construction_above_training"):
        text += "\nmodel construction peaks above training: " + (
            f"{row['moments']['construction'] / GIB:.2f} GiB")
    return text
