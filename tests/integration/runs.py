"""Real multi-process runs for the integration tests, through the launcher's own path:
compose -> validate(target="train") -> planner -> atomic run dir (launcher.run.launch.create_run),
then the run dir's own command (torchrun or deepspeed) starts the ranks.

Evidence comes from probes the tests inject with `train.callbacks`
(tests/integration/probes.py), never from the worker itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.config.compose import PROJECT_ROOT
from launcher.run.launch import BuiltRun, create_run
from launcher.run.planner import resolve_tool
from launcher.rundir import RunDir

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
    "train.eval_steps=0",  # evaluate at the start (eval_on_start) and at the end only
    "train.eval_on_start=true",
    "train.epochs=1",
    "cluster.gpus_per_node=2",
    "train.show_examples=0",  # `ftl train` runs answer no held-out prompts unless a test asks
]
MIXTURE = ("dataset=mix",)
"""The mixture preset (configs/dataset/mix.yaml) in place of the bundled sums: the runs
test_train_strategies.MIXTURE_RUNS names and test_sequence_parallel.py's chain."""
MOE = ("model=tiny-moe",)
"""The tiny mixture of experts (configs/model/tiny-moe.yaml) in place of the tiny Llama:
the runs test_train_strategies.MOE_RUNS names and test_chaos.py's."""
EXPERT_LORA = ("model=tiny-moe", "peft.target_modules=[all-linear]")
"""LoRA on the tiny MoE's experts and router as well as its attention: the ddp LoRA run
test_train_peft.py and test_eval.py share (and zero3's in `make test-full`)."""
RUN_TIMEOUT_S = 600
RUN_TIMES: dict[str, float] = {}
"""name -> wall seconds of each run, printed at the end of the session."""
EVIDENCE = ("ShardingProbe", "LogitsProbe", "WrapperProbe", "PrecisionProbe", "PartitionProbe")


def callbacks(*probes: str, **stop: int) -> str:
    """The train.callbacks override for probes of tests/integration/probes.py; `stop=N`
    adds StopAfterStep(N)."""
    specs = [f"{{_target_:tests.integration.probes.{name}}}" for name in probes]
    specs += [f"{{_target_:tests.integration.probes.StopAfterStep,step:{n}}}"
              for n in stop.values()]
    return f"train.callbacks=[{','.join(specs)}]"


@dataclass
class Run:
    run_dir: Path
    returncode: int
    seconds: float
    output: str
    shm_left: set[Path] = field(default_factory=set)
    """DeepSpeed all-reduce segments in /dev/shm that appeared during the launch and are
    still there after it (DeepSpeedEngine.release_rank removes them)."""

    @property
    def result(self) -> dict[str, Any]:
        return json.loads(RunDir(self.run_dir).result.read_text())

    def metrics(self) -> list[dict[str, Any]]:
        return jsonl(RunDir(self.run_dir).metrics)

    def train_losses(self) -> dict[int, float]:
        return train_losses(self.run_dir)

    def launches(self) -> list[dict[str, Any]]:
        return jsonl(RunDir(self.run_dir).launches)

    def probe(self, name: str, rank: int) -> dict[str, Any]:
        return json.loads((RunDir(self.run_dir).probes / f"{name}-rank{rank}.json").read_text())

    def logits(self) -> dict[str, torch.Tensor]:
        return torch.load(RunDir(self.run_dir).probes / "logits.pt")


def stop_then_resume(runs_root: Path, name: str, overrides: list[str], stop: int,
                     *probes: str) -> tuple[Run, Run]:
    """Run `name` until the checkpoint of step `stop`, then the same command again (with
    `probes`), which resumes it to the end: the two launches, each asserted to succeed."""
    first = launch(plan_run(runs_root, name, [*overrides, callbacks(stop=stop)]))
    assert first.returncode == 0, describe_failure(first)
    second = launch(plan_run(runs_root, name, [*overrides, callbacks(*probes)]))
    assert second.returncode == 0, describe_failure(second)
    return first, second


def assert_resumed_like(chain: tuple[Run, Run], reference: Run, stop: int,
                        rel: float = 1e-5) -> None:
    """A 2-rank run stopped after checkpoint-`stop` and resumed by the same command to step
    8: one launch record for the resume, from that checkpoint, and every step's loss equal
    to the reference's (to `rel`), falling."""
    assert reference.returncode == 0, describe_failure(reference)
    first, second = chain
    (resumed,) = second.launches()
    assert resumed["start_step"] == stop and resumed["world_size"] == 2
    assert resumed["resumed_from"].endswith(f"checkpoint-{stop}")
    losses = {**first.train_losses(), **second.train_losses()}
    expected = reference.train_losses()
    assert sorted(losses) == sorted(expected) == list(range(1, 9))
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, rel=rel), step
    assert losses[8] < losses[1]


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines run-dir file (metrics.jsonl, launches.jsonl)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_router_loss_logged(run_dir: Path, experts: int = 4, per_token: int = 2) -> None:
    """An MoE run logged the router's load-balancing loss with every training loss: between
    experts_per_token (perfectly balanced) and num_experts (all tokens on one expert)."""
    records = [r for r in jsonl(RunDir(run_dir).metrics) if "loss" in r]
    assert records and all("aux_loss" in r for r in records), records
    assert all(per_token * 0.99 <= r["aux_loss"] <= experts for r in records), records


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train loss of a run dir's metrics.jsonl (each step must be logged once)."""
    records = jsonl(RunDir(run_dir).metrics)
    steps = [r["step"] for r in records if "loss" in r]
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plan_run(root: Path, name: str, overrides: list[str]) -> BuiltRun:
    """The run dir `ftl train` would write: root/name/<timestamp>. Planned from the
    project root, where the ranks start (the probes' module is checked from there)."""
    with contextlib.chdir(PROJECT_ROOT):
        return create_run(
            [*FAST_TRAIN, f"cluster.master_port={free_port()}", f"run.output_dir={root}",
             f"run.name={name}", *overrides],
            "train",
        )


def project_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment plus `extra`, with the project root first on PYTHONPATH."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


SHM = Path("/dev/shm")
SHM_PATTERN = f"deepspeed_allreduce_buffer_{os.getuid()}_*"


def launch(built: BuiltRun) -> Run:
    """Start the ranks with the run dir's own argv and wait; output captured. The ranks
    start in the project root, so the injected probes import as tests.integration.probes."""
    env = project_env(built.launch.env)
    shm_before = set(SHM.glob(SHM_PATTERN))
    start = time.monotonic()
    proc = subprocess.run(
        resolve_tool(built.launch.argv), cwd=PROJECT_ROOT, env=env, capture_output=True,
        text=True, timeout=RUN_TIMEOUT_S,
    )
    seconds = time.monotonic() - start
    output = proc.stdout + proc.stderr
    (built.run_dir / "launcher-output.txt").write_text(output)
    shm_left = set(SHM.glob(SHM_PATTERN)) - shm_before
    return Run(built.run_dir, proc.returncode, seconds, output, shm_left)


def train(root: Path, name: str, overrides: list[str]) -> Run:
    return launch(plan_run(root, name, overrides))


def ftl_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`ftl ARGS` run from the project root in this process, its exit code and output as a
    subprocess's: for verbs that start no process of their own (quantize, chat, report),
    whose code is the same either way; the interpreter's start-up and imports are saved."""
    from launcher.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(PROJECT_ROOT), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's refusals
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(["ftl", *args], code, out.getvalue(), err.getvalue())


def describe_failure(run: Run) -> str:
    errors = RunDir(run.run_dir).rank_errors().values()
    texts = [f"--- {e.name}\n{e.read_text()[-3000:]}" for e in errors]
    return f"rc={run.returncode}\n{run.output[-4000:]}\n" + "\n".join(texts)


USER_TASK = """task: my_sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{instruction}}}}"
doc_to_target: "{{{{output}}}}"
generation_kwargs: {{until: [], do_sample: false, max_gen_toks: 4}}
metric_list: [{{metric: exact_match, aggregation: mean, higher_is_better: true}}]
"""
"""A user's own lm-evaluation-harness task (two sums), as eval.include_path / --include-path
reads it."""


def write_user_task(root: Path) -> Path:
    """tasks/my_sums.yaml and its two-row data under `root`; the folder to include."""
    tasks = root / "tasks"
    tasks.mkdir()
    data = root / "sums.jsonl"
    data.write_text('{"instruction": "1+1", "output": "2"}\n'
                    '{"instruction": "2+2", "output": "4"}\n')
    (tasks / "my_sums.yaml").write_text(USER_TASK.format(data=data))
    return tasks
