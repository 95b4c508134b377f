"""Chaos: kill -9 a real `ftl train` run again and again, relaunch, and check the end result.

    .venv/bin/python scripts/chaos.py --rounds 20            # or: scripts/chaos.sh 20
    .venv/bin/python scripts/chaos.py --rounds 20 strategy=zero2 cluster.launcher=deepspeed

1. An uninterrupted reference run (run.name=chaos-reference).
2. `--rounds` times: `ftl train` (run.name=chaos, run.resume=auto: each launch continues
   from the newest complete checkpoint of the earlier ones), then SIGKILL at a random time
   once that launch has written a complete checkpoint of its own (so every kill leaves a
   newer checkpoint to resume, however slowly a loaded machine starts the launch). Every
   third kill (the 2nd, 5th, ...) then waits for the next checkpoint being written (its
   directory exists, its COMPLETE marker does not), freezes the process tree (SIGSTOP),
   and kills it only if that save is still unfinished (else it lets the run go on to the
   next save); every fourth from the first (the 1st, 5th, 9th, ...) kills one rank only
   (the launcher then tears down the rest); the others kill the whole process tree (`ftl
   train`, the launcher, every rank) at once. So 2 rounds make a one-rank and a mid-save
   kill, and 3 rounds one kill of each kind. A kill counts as a
   mid-save kill only when, after it, the checkpoint it interrupted is still incomplete.
3. Relaunches without kills until the run finishes.
4. Checks: every launch started at the step of the newest complete checkpoint that existed
   when it started (never from step 0 once a checkpoint exists), the run reached
   train.max_steps, and the final model's logits on a fixed batch equal the reference's
   within --atol. Prints one JSON report (kills, kills that hit a save, launches, the
   largest logit difference) and exits 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.run.supervise import kill_tree  # noqa: E402
from launcher.rundir.checkpoints import checkpoint_step, is_complete, list_checkpoints  # noqa: E402

DEFAULTS = [
    "strategy=ddp", "train.max_steps=800", "train.save_steps=5", "train.save_total_limit=2",
    "train.micro_batch_size=4", "train.grad_accum=1", "train.lr=1e-3",
    "train.lr_scheduler=linear", "train.warmup_ratio=0.05", "train.logging_steps=1",
    "train.eval_steps=0", "train.eval_on_start=false", "cluster.gpus_per_node=2",
    "train.show_examples=0",  # each finished launch would answer the held-out prompts
]
KILL_WINDOW_S = (0.0, 1.0)
"""A random kill lands this long after the launch's first complete checkpoint."""
WAIT_S = 300.0


@dataclass
class Report:
    rounds: int
    kills: int = 0
    kills_during_save: int = 0
    kills_of_one_rank: int = 0
    launches: list[dict[str, object]] = field(default_factory=list)
    final_step: int | None = None
    max_abs_logit_diff: float | None = None
    atol: float = 0.0
    problems: list[str] = field(default_factory=list)


def run_dirs(output: Path, name: str) -> list[Path]:
    base = output / name
    if not base.is_dir():
        return []
    # Not the hidden staging dir a launch writes before renaming it into place.
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def complete_steps(output: Path, name: str) -> list[int]:
    return sorted(checkpoint_step(c) or 0 for d in run_dirs(output, name)
                  for c in list_checkpoints(d / "checkpoints") if is_complete(c))


def start(output: Path, name: str, overrides: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "launcher", "train", *DEFAULTS, *overrides,
            f"run.output_dir={output}", f"run.name={name}", "run.resume=auto"]
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def new_run_dir(output: Path, name: str, before: list[Path],
                proc: subprocess.Popen[bytes]) -> Path | None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        fresh = [d for d in run_dirs(output, name) if d not in before]
        if fresh:
            return fresh[0]
        time.sleep(0.05)
    return None


def checkpointed(run_dir: Path, proc: subprocess.Popen[bytes]) -> bool:
    """Until this launch has written a complete checkpoint (False: it ended first, or none
    within WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if any(is_complete(c) for c in list_checkpoints(run_dir / "checkpoints")):
            return True
        time.sleep(0.01)
    return False


def unfinished(run_dir: Path) -> list[Path]:
    """Checkpoint directories without their COMPLETE marker: a save in progress (or one
    that a kill interrupted)."""
    return [c for c in list_checkpoints(run_dir / "checkpoints") if not is_complete(c)]


def freeze_in_a_save(run_dir: Path, proc: subprocess.Popen[bytes]) -> list[Path]:
    """Wait for a save in progress and stop (SIGSTOP) the whole process tree while it is
    still unfinished; returns the unfinished checkpoints ([] if the launch ended or no save
    was caught within WAIT_S). A save that completed before the tree stopped lets it go on
    (SIGCONT) to the next one."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if unfinished(run_dir):
            tree = process_tree(proc)
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.suspend()
            caught = unfinished(run_dir)  # nothing runs now: this stays true until the kill
            if caught:
                return caught
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.resume()
        time.sleep(0.002)
    return []


def process_tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        parent = psutil.Process(proc.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def ranks_of(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The rank processes: those the launcher started with LOCAL_RANK in their environment
    (torchrun's and the deepspeed launcher's own command lines name the worker module too)."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in tree if "LOCAL_RANK" in _environ(p)]


def _environ(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except psutil.Error:
        return {}


def kill_all(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `ftl train`, its launcher and every rank, and wait until they are gone."""
    killed = kill_tree(proc.pid)
    proc.wait()
    psutil.wait_procs(killed, timeout=30)


def one_round(index: int, output: Path, overrides: list[str], report: Report,
              rng: random.Random, log: Path) -> bool:
    """One launch and one kill; False when the run finished before the kill."""
    before = run_dirs(output, "chaos")
    expected_start = max(complete_steps(output, "chaos"), default=0)
    proc = start(output, "chaos", overrides, log)
    run_dir = new_run_dir(output, "chaos", before, proc)
    if run_dir is None or not checkpointed(run_dir, proc):
        kill_all(proc)
        return _finished(proc, run_dir, report)
    mode = "save" if index % 3 == 1 else "rank" if index % 4 == 0 else "random"
    caught: list[Path] = []
    if mode == "save":
        caught = freeze_in_a_save(run_dir, proc)
    else:
        time.sleep(rng.uniform(*KILL_WINDOW_S))
    if proc.poll() is not None:
        return _finished(proc, run_dir, report)
    ranks = ranks_of(proc)
    if mode == "rank" and ranks:
        rng.choice(ranks).kill()
        try:
            proc.wait(timeout=60)  # the launcher tears the others down
        except subprocess.TimeoutExpired:
            pass
    kill_all(proc)
    # Counted once the kill has landed: the save it interrupted is still unfinished.
    hit_save = bool(caught) and all(c.is_dir() and not is_complete(c) for c in caught)
    report.kills += 1
    report.kills_during_save += hit_save
    report.kills_of_one_rank += mode == "rank" and bool(ranks)
    report.launches.append(_launch_record(run_dir, expected_start, f"kill ({mode})"))
    return True


def _finished(proc: subprocess.Popen[bytes], run_dir: Path | None, report: Report) -> bool:
    report.problems.append(f"launch ended before its kill (exit {proc.returncode}, {run_dir})")
    return False


def _launch_record(run_dir: Path, expected_start: int, how: str) -> dict[str, object]:
    path = run_dir / "launches.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    started = json.loads(lines[0])["start_step"] if lines else None
    return {"run_dir": run_dir.name, "expected_start": expected_start, "start_step": started,
            "how": how}


def finish(output: Path, overrides: list[str], report: Report, log: Path) -> Path | None:
    """Relaunch without kills until the run finishes (a few tries at most)."""
    for _ in range(3):
        before = run_dirs(output, "chaos")
        expected_start = max(complete_steps(output, "chaos"), default=0)
        proc = start(output, "chaos", overrides, log)
        returncode = proc.wait(timeout=3600)
        fresh = [d for d in run_dirs(output, "chaos") if d not in before]
        if fresh:
            report.launches.append(_launch_record(fresh[0], expected_start, f"exit {returncode}"))
        if returncode == 0 and fresh and (fresh[0] / "result.json").is_file():
            return fresh[0]
    report.problems.append("the run did not finish in 3 relaunches without kills")
    return None


def logits(model_dir: Path) -> object:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 32), generator=generator)
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def check(report: Report, final: Path | None, reference: Path, max_steps: int) -> None:
    for launch in report.launches:
        if launch["start_step"] not in (None, launch["expected_start"]):
            report.problems.append(f"a launch did not resume from the newest complete "
                                   f"checkpoint: {launch}")
    if final is None:
        return
    report.final_step = json.loads((final / "result.json").read_text())["global_step"]
    if report.final_step != max_steps:
        report.problems.append(f"final step {report.final_step}, expected {max_steps}")
    diff = (logits(final / "model") - logits(reference / "model")).abs().max()  # type: ignore[operator]
    report.max_abs_logit_diff = float(diff)
    if report.max_abs_logit_diff > report.atol:
        report.problems.append(f"final logits differ from the reference by "
                               f"{report.max_abs_logit_diff:.3g} > atol {report.atol}")


def max_steps_of(overrides: list[str]) -> int:
    values = [o.split("=", 1)[1] for o in [*DEFAULTS, *overrides]
              if o.startswith("train.max_steps=")]
    return int(values[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "chaos")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("overrides", nargs="*", help="extra `ftl train` overrides")
    args = parser.parse_args(argv)
    output = args.work.resolve() / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    output.mkdir(parents=True)
    log, rng = output / "chaos.log", random.Random(args.seed)
    report = Report(rounds=args.rounds, atol=args.atol)
    reference = start(output, "chaos-reference", args.overrides, log)
    if reference.wait(timeout=3600) != 0:
        print(f"the reference run failed; log: {log}", file=sys.stderr)
        return 1
    for index in range(args.rounds):
        if not one_round(index, output, args.overrides, report, rng, log):
            break
    final = finish(output, args.overrides, report, log)
    check(report, final, run_dirs(output, "chaos-reference")[-1], max_steps_of(args.overrides))
    print(json.dumps({**asdict(report), "seed": args.seed, "output": str(output)}, indent=1))
    return 0 if not report.problems and report.kills == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
