"""Real multi-process runs for the integration tests: write a run dir, launch, read results.

The run dir follows the launcher's contract (config.yaml, ds_config.json / fsdp.json) and is
built from the same pure builders `ftl train` uses; the command comes from
launcher.command.build_launch, so the tests exercise the real argv of both launchers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from launcher.command import build_launch
from launcher.compose import PROJECT_ROOT, compose_config
from launcher.ds_config import build_ds_config
from launcher.fsdp import build_fsdp_settings

# A few optimizer steps of the tiny Llama on the bundled data: long enough for the loss to
# fall, short enough that the whole suite fits CI's budget on 2 cores.
FAST_TRAIN = [
    "train.max_steps=8",
    "train.micro_batch_size=4",
    "train.grad_accum=1",
    "train.lr=3e-3",
    "train.warmup_ratio=0.0",
    "train.lr_scheduler=constant",
    "train.logging_steps=1",
    "train.save_steps=4",
    "train.eval_steps=0",  # evaluate at the start and the end only
    "train.epochs=1",
    "cluster.gpus_per_node=2",
]
RUN_TIMEOUT_S = 600


@dataclass
class Run:
    run_dir: Path
    returncode: int
    seconds: float
    output: str

    @property
    def result(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "result.json").read_text())

    def metrics(self) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def train_losses(self) -> dict[int, float]:
        """step -> train loss (a resumed run appends; later lines win)."""
        return {m["step"]: m["loss"] for m in self.metrics() if "loss" in m}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_run_dir(run_dir: Path, overrides: list[str]) -> Any:
    """The files `ftl train` writes before launching (the contract a rank reads)."""
    cfg = compose_config([*overrides, f"run.output_dir={run_dir.parent}"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    if cfg.strategy.backend == "deepspeed":
        (run_dir / "ds_config.json").write_text(json.dumps(build_ds_config(cfg), indent=2))
    if cfg.strategy.backend == "fsdp":
        (run_dir / "fsdp.json").write_text(json.dumps(build_fsdp_settings(cfg), indent=2))
    return cfg


def launch(run_dir: Path, extra_env: dict[str, str] | None = None) -> Run:
    """Start the ranks with the launcher's own argv and wait; output captured."""
    cfg = compose_config_from(run_dir)
    spec = build_launch(cfg, str(run_dir))
    tool = Path(sys.executable).parent / spec.argv[0]
    argv = [str(tool) if tool.exists() else spec.argv[0], *spec.argv[1:]]
    env = {**os.environ, **spec.env, **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    start = time.monotonic()
    proc = subprocess.run(
        argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    seconds = time.monotonic() - start
    output = proc.stdout + proc.stderr
    (run_dir / "launcher-output.txt").write_text(output)
    return Run(run_dir, proc.returncode, seconds, output)


def compose_config_from(run_dir: Path) -> Any:
    from launcher.compose import to_run_config

    return to_run_config(OmegaConf.load(run_dir / "config.yaml"))


def train(run_dir: Path, overrides: list[str], extra_env: dict[str, str] | None = None) -> Run:
    write_run_dir(run_dir, [*FAST_TRAIN, f"cluster.master_port={free_port()}", *overrides])
    return launch(run_dir, extra_env)


def describe_failure(run: Run) -> str:
    errors = sorted((run.run_dir / "logs").glob("rank*.error"))
    texts = [f"--- {e.name}\n{e.read_text()[-3000:]}" for e in errors]
    return f"rc={run.returncode}\n{run.output[-4000:]}\n" + "\n".join(texts)
