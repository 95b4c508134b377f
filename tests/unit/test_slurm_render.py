"""The sbatch script as text: snapshots, quoting of hostile values, secrets, sweeps, rules.

Snapshots live in tests/unit/snapshots/sbatch-<launcher>-<nodes>n.sh. After an intended
change to the script, regenerate them and review the diff:

    FTL_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/test_slurm_render.py

Running the script for real (hostile run name through sbatch, requeue, resume) is in
tests/integration/test_slurm.py against a real local Slurm.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.config.schema import RunConfig
from launcher.errors import ConfigError
from launcher.launchers.command import build_launch
from launcher.run.submit import expand_sweep, submit, with_default_cluster
from launcher.rundir import RunDir
from launcher.schedulers.slurm import parse_scontrol, slurm_problems, time_seconds
from launcher.schedulers.slurm.script import render_sbatch, sbatch_quote
from launcher.validation.validate import validate

SNAPSHOTS = Path(__file__).parent / "snapshots"
RUN_DIR = "/scratch/outputs/llama-7b-zero3/20260101-000000"
HOSTILE = "x'; touch /tmp/owned #"
GPU_JOB = [
    "cluster=slurm", "model=llama-7b", "strategy=zero3", "precision=bf16",
    "cluster.gpu=a100-80g", "cluster.gpus_per_node=8", "cluster.slurm.partition=gpu",
    "cluster.slurm.account=proj-42", "cluster.slurm.qos=high", "cluster.slurm.time=1-00:00:00",
    "cluster.slurm.cpus_per_task=32", "cluster.slurm.mem=500G", "cluster.slurm.signal_grace_s=300",
    "cluster.slurm.max_restarts=5",
    "cluster.slurm.sbatch_extra=[--exclusive,'--constraint=a100&ib']",
    "cluster.setup=['module load cuda/12.4','source /opt/venv/bin/activate']",
]
CPU_JOB = ["cluster=slurm", "cluster.gpu=cpu", "cluster.gpus_per_node=1", "train.max_steps=2"]


def render(cfg: RunConfig, run_dir: str | Path) -> str:
    """The job script, its per-node command built from the config alone."""
    return render_sbatch(cfg, run_dir, build_launch(cfg, str(run_dir)))


def sbatch_arguments(line: str) -> list[str]:
    """How sbatch itself reads an `#SBATCH` line (src/sbatch/opt.c, _get_argument):
    double quotes group, a backslash escapes the next character, an unquoted # ends it."""
    args, current, quoted, escaped, started = [], [], False, False, False
    for char in line.removeprefix("#SBATCH").rstrip("\n"):
        if escaped:
            current.append(char)
            escaped, started = False, True
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted, started = not quoted, True
        elif char == "#" and not quoted:
            break
        elif char.isspace() and not quoted:
            if started:
                args.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
            started = True
    if started:
        args.append("".join(current))
    return args


@pytest.mark.parametrize("nodes", [1, 4])
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_snapshot(launcher: str, nodes: int) -> None:
    cfg = compose_config([*GPU_JOB, f"cluster.nodes={nodes}", f"cluster.launcher={launcher}"])
    text = render(cfg, RUN_DIR)
    snapshot = SNAPSHOTS / f"sbatch-{launcher}-{nodes}n.sh"
    if os.environ.get("FTL_UPDATE_SNAPSHOTS"):
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(text)
    assert text == snapshot.read_text(), f"regenerate: FTL_UPDATE_SNAPSHOTS=1 ({snapshot})"


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_script_parses_and_holds_the_options(launcher: str) -> None:
    cfg = compose_config([*GPU_JOB, "cluster.nodes=4", f"cluster.launcher={launcher}"])
    text = render(cfg, RUN_DIR)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    options = [sbatch_arguments(line) for line in text.splitlines() if line.startswith("#SBATCH")]
    flat = [arg for args in options for arg in args]
    for expected in ("--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--requeue",
                     "--partition=gpu", "--account=proj-42", "--qos=high", "--mem=500G",
                     "--time=1-00:00:00", "--cpus-per-task=32", "--open-mode=append",
                     "--signal=B:USR1@300", "--exclusive", "--constraint=a100&ib",
                     f"--output={RUN_DIR}/logs/slurm-%j.out"):
        assert expected in flat
    assert "module load cuda/12.4\nsource /opt/venv/bin/activate\n" in text
    srun = next(line for line in text.splitlines() if line.startswith("setsid srun "))
    assert "--nodes=4 --ntasks=4 --ntasks-per-node=1" in srun
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
    if launcher == "deepspeed":  # hostfile from the real node list, 8 slots each
        assert 'sed "s/\\$/ slots=8/" > "${FTL_RUN_DIR}"/hostfile' in text


def test_cpu_preset_asks_for_no_gpus() -> None:
    text = render(compose_config(CPU_JOB), RUN_DIR)
    assert "--gpus-per-node" not in text
    assert "export OMP_NUM_THREADS=1" in text


def test_requeue_only_when_signalled_and_unfinished_and_under_the_limit() -> None:
    text = render(compose_config([*CPU_JOB, "cluster.slurm.max_restarts=2"]), RUN_DIR)
    finished = text.index(
        'if [ -e "$FTL_RUN_DIR"/result.json ] && [ ! -e "$FTL_RUN_DIR"/preempted ]'
    )
    requeue = text.index('scontrol requeue "$SLURM_JOB_ID"')
    assert finished < requeue  # a finished run exits before the requeue branch
    assert 'if [ -e "$FTL_RUN_DIR"/preempt.requested ]' in text
    assert 'if [ "$restarts" -lt 2 ]' in text
    for name in ("USR1", "TERM", "INT"):  # --signal=B:USR1, a preemption, scancel --full
        assert f"trap 'ftl_preempt {name}' {name}" in text
    assert " &\nstep=$!" in text  # `& wait`: the traps run while the step runs


def test_hostile_run_name_stays_one_quoted_value() -> None:
    cfg = compose_config([*GPU_JOB, "cluster.nodes=4", "cluster.launcher=deepspeed",
                          f'run.name="{HOSTILE}"'])
    assert cfg.run.name == HOSTILE
    run_dir = f"/scratch/{HOSTILE}/20260101-000000"
    text = render(cfg, run_dir)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    lines = [line for line in text.splitlines() if "owned" in line]
    assert lines, "the name must appear (job name, run dir)"
    for line in lines:
        if line.startswith("#SBATCH"):
            # sbatch reads exactly one argument, holding the whole value.
            (arg,) = sbatch_arguments(line)
            assert HOSTILE in arg
        else:
            # The shell sees one word: the assignment of the whole run dir.
            assert shlex.split(line) == ["export", f"FTL_RUN_DIR={run_dir}"]


def test_sbatch_quote_round_trips_through_sbatchs_parser() -> None:
    for value in ['a b"c\\d#e', HOSTILE, "plain", "50%", "$(touch /tmp/owned)"]:
        assert sbatch_arguments(f"#SBATCH --job-name={sbatch_quote(value)}") == [
            f"--job-name={value}"
        ]


def test_percent_in_run_dir_is_not_a_slurm_pattern() -> None:
    text = render(compose_config(CPU_JOB), "/scratch/100%/run")
    out = next(line for line in text.splitlines() if line.startswith("#SBATCH --output"))
    assert sbatch_arguments(out) == ["--output=/scratch/100%%/run/logs/slurm-%j.out"]


def test_secrets_never_reach_the_script_or_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = {"HF_TOKEN": "hf_s3cr3t_token_value", "WANDB_API_KEY": "wandb-s3cr3t-key",
               "MLFLOW_TRACKING_TOKEN": "mlflow-s3cr3t-token",
               "MLFLOW_TRACKING_URI": "https://user:s3cr3t-pass@mlflow.example"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    trackers = "train.report_to=[tensorboard,wandb,mlflow]"  # they read these at run time
    assert submit([*CPU_JOB, trackers, f"run.output_dir={tmp_path}"], dry_run=True) == 0
    printed = capsys.readouterr().out
    (script,) = tmp_path.glob("*/*/job.slurm")
    texts = [printed] + [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    for value in secrets.values():
        assert not any(value in text for text in texts)
    assert script.read_text() in printed
    assert not re.search(r"--export=(?!ALL)", script.read_text())  # env reaches the job


def test_dry_run_prints_and_writes_the_script_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from launcher.run.submit import submit\n"
        f"rc = submit({[*CPU_JOB, f'run.output_dir={tmp_path}']!r}, dry_run=True)\n"
        "print('HEAVY', [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules])\n"
        "raise SystemExit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
    assert "#SBATCH --nodes=1" in done.stdout and "# dry run: not submitted" in done.stdout
    (script,) = tmp_path.glob("*/*/job.slurm")
    assert os.access(script, os.X_OK)


def test_dry_run_shows_the_script_where_this_machine_cannot_hold_the_run(
    tmpfs, capsys: pytest.CaptureFixture[str]
) -> None:
    """Free space is this machine's, not the cluster's: --dry-run warns, submit refuses."""
    small = tmpfs("1m")
    job = ["model=llama-7b", "strategy=zero3", "cluster=slurm", f"run.output_dir={small}"]
    with pytest.raises(ConfigError, match="GiB free on its filesystem"):
        submit(job)
    assert not any(small.iterdir())
    assert submit(job, dry_run=True) == 0
    out, err = capsys.readouterr()
    (script,) = small.glob("*/*/job.slurm")
    assert script.read_text() in out and "# dry run: not submitted" in out
    assert f"ftl: warning: run.output_dir={small}: " in err and "GiB free" in err


def test_dry_run_prints_the_script_where_the_run_dir_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert submit([*CPU_JOB, f"run.output_dir={blocker / 'out'}"], dry_run=True) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/bin/bash\n#SBATCH") and "run dir not written here" in out
    assert "is a file, not a directory" in err


def test_sweep_expands_like_hydra_multirun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = expand_sweep(["train.lr=1e-5,2e-5", "cluster.nodes=1,2", "model=tiny-llama"])
    assert jobs == [
        ["train.lr=1e-05", "cluster.nodes=1", "model=tiny-llama"],
        ["train.lr=1e-05", "cluster.nodes=2", "model=tiny-llama"],
        ["train.lr=2e-05", "cluster.nodes=1", "model=tiny-llama"],
        ["train.lr=2e-05", "cluster.nodes=2", "model=tiny-llama"],
    ]
    overrides = [*CPU_JOB, "train.lr=1e-5,2e-5", f"run.output_dir={tmp_path}"]
    assert submit(overrides, dry_run=True, multirun=True) == 0
    printed = capsys.readouterr().out
    assert "# job 1 of 2" in printed and "# job 2 of 2" in printed
    configs = sorted(p.read_text() for p in tmp_path.glob("*/*/config.yaml"))
    assert len(configs) == 2 and len(list(tmp_path.glob("*/*/job.slurm"))) == 2
    learning_rates = sorted(re.search(r"\n  lr: (\S+)", c).group(1) for c in configs)
    assert learning_rates == ["1.0e-05", "2.0e-05"]


def test_a_bad_combination_submits_nothing(tmp_path: Path) -> None:
    overrides = [*CPU_JOB, "cluster.slurm.time=10,bogus", f"run.output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="cluster.slurm.time=bogus"):
        submit(overrides, dry_run=True, multirun=True)
    assert not list(tmp_path.rglob("job.slurm"))


def test_submit_defaults_to_slurm_and_refuses_local() -> None:
    assert with_default_cluster(["model=llama-7b"]) == ["cluster=slurm", "model=llama-7b"]
    assert with_default_cluster(["cluster=local"]) == ["cluster=local"]
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(["cluster=local"]), "submit")
    assert any("cluster=local" in p and "Fix: cluster=slurm" in p for p in caught.value.problems)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("cluster.slurm.time=4h", "cluster.slurm.time=4h: not a Slurm time limit"),
        ("cluster.slurm.signal_grace_s=600", "cluster.slurm.signal_grace_s=600"),  # > time (5 min)
        ("cluster.slurm.max_restarts=-1", "cluster.slurm.max_restarts=-1"),
        ("cluster.slurm.mem=lots", "cluster.slurm.mem=lots"),
        ("cluster.slurm.sbatch_extra=[exclusive]", "must start with -"),
        ("cluster.slurm.partition='gpu\nrm -rf /'", "cluster.slurm.partition="),
    ],
)
def test_slurm_rules_name_key_and_fix(override: str, needle: str) -> None:
    cfg = compose_config(["cluster=slurm", "cluster.slurm.time=5", override])
    problems = slurm_problems(cfg)
    assert any(needle in p and "Fix:" in p for p in problems), problems


def test_time_limits() -> None:
    assert [time_seconds(t) for t in ("30", "30:15", "04:00:00", "2-0", "1-02:03", "1-0:0:5")] == [
        1800, 1815, 14400, 172800, 93780, 86405,
    ]


def test_parse_scontrol_keeps_spaces_in_values() -> None:
    line = "JobId=7 JobName=a b c UserId=root(0) JobState=RUNNING Reason=None Command=/r/job.slurm"
    info = parse_scontrol(line)
    assert info["JobName"] == "a b c" and info["JobState"] == "RUNNING"
    assert info["Command"] == "/r/job.slurm"


# --- the job script's end: requeue decision ----------------------------------------------
# The real path (sbatch, USR1 from scancel, requeue, resume) runs in
# tests/integration/test_slurm.py. Branches that a real job cannot hit on cue (the signal
# landing after the run finished, the restart limit) run here: the rendered script under
# bash with stand-ins for srun and scontrol. The srun stand-in signals its parent, the batch
# shell, as Slurm's --signal=B:USR1 would, then behaves like the ranks would.
FAKE_SRUN = """#!/bin/bash
[ -n "$FAKE_SIGNAL" ] && kill -"$FAKE_SIGNAL" "$PPID" && sleep 0.5
case "$*" in  # the eval.tasks step: its argv, then its exit code
  *"python -m launcher eval "*) echo "eval step: $*"; exit "${FAKE_EVAL_RC:-0}" ;;
esac
saved() {  # what the ranks leave after a stop at step 3: preempted + a complete checkpoint
    echo '{"step": 3, "time": 1.0, "reason": "preempt.requested"}' > "$FTL_RUN_DIR/preempted"
    mkdir -p "$FTL_RUN_DIR/checkpoints/checkpoint-3"
    touch "$FTL_RUN_DIR/checkpoints/checkpoint-3/COMPLETE"
}
case "$FAKE_RANKS" in
  finish) echo '{}' > "$FTL_RUN_DIR/result.json" ;;
  preempt) [ -e "$FTL_RUN_DIR/preempt.requested" ] && saved ;;
  cancel) echo 1 > "$FTL_RUN_DIR/cancel.requested"; touch "$FTL_RUN_DIR/preempt.requested"
          saved ;;
  cancel_unsaved) echo 1 > "$FTL_RUN_DIR/cancel.requested"
                  touch "$FTL_RUN_DIR/preempt.requested" ;;
  crash) exit 3 ;;
esac
"""
FAKE_SCONTROL = """#!/bin/bash
case "$1" in
  show) echo node1 ;;
  requeue) echo "$2" >> "$FAKE_REQUEUED" ;;
esac
"""


def run_job_script(
    tmp_path: Path, signal: str, ranks: str, restarts: str = "",
    overrides: tuple[str, ...] = (), eval_rc: int = 0,
) -> subprocess.CompletedProcess[str]:
    """The rendered script under bash, srun and scontrol replaced by the stand-ins above."""
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir(exist_ok=True)
    run_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = render(compose_config([*CPU_JOB, "cluster.slurm.max_restarts=3", *overrides]),
                    run_dir)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node1", "FAKE_SIGNAL": signal, "FAKE_RANKS": ranks,
        "FAKE_REQUEUED": str(tmp_path / "requeued"), "FAKE_EVAL_RC": str(eval_rc),
    }
    if restarts:
        env["SLURM_RESTART_COUNT"] = restarts
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          preexec_fn=default_signals,
                          timeout=60)


@pytest.mark.parametrize(
    ("signal", "ranks", "restarts", "exit_code", "requeued"),
    [
        ("", "finish", "", 0, False),  # plain finish
        ("USR1", "finish", "", 0, False),  # signal came, but the run finished: no requeue
        ("USR1", "preempt", "", 0, True),  # checkpoint + stop -> requeue
        ("TERM", "preempt", "", 0, True),  # a preemption's TERM to the batch shell: the same
        ("INT", "preempt", "", 0, True),
        ("USR1", "preempt", "2", 0, True),  # restart 3 of 3 still allowed
        ("USR1", "preempt", "3", 1, False),  # cluster.slurm.max_restarts=3 reached
        ("", "crash", "", 3, False),  # a failure is reported, not retried
        ("", "stop", "", 1, False),  # ranks exited 0 without finishing: not a success
        ("", "cancel", "", 75, False),  # ftl cancel: checkpoint, stopped for good
        ("USR1", "cancel", "", 75, False),  # ... even when a preemption signal came too
        ("", "cancel_unsaved", "", 1, False),  # cancelled without a complete checkpoint
    ],
)
def test_requeue_decision(
    tmp_path: Path, signal: str, ranks: str, restarts: str, exit_code: int, requeued: bool
) -> None:
    done = run_job_script(tmp_path, signal, ranks, restarts)
    assert done.returncode == exit_code, done.stdout + done.stderr
    assert (tmp_path / "requeued").exists() == requeued, done.stdout
    if requeued:
        assert (tmp_path / "requeued").read_text() == "77\n"
    run_dir = tmp_path / "run"
    assert (run_dir / "preempt.requested").exists() == bool(signal or "cancel" in ranks)
    if exit_code == 75:
        assert "cancelled by `ftl cancel` after a complete checkpoint (step 3)" in done.stdout


def test_a_cancel_before_the_start_ends_the_job_without_training(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cancel.requested").write_text("1\n")
    done = run_job_script(tmp_path, "", "finish")
    assert done.returncode == 75, done.stdout + done.stderr
    assert "before this start; not training" in done.stdout
    assert not (tmp_path / "run" / "result.json").exists()  # srun never ran


# --- the per-node task: a step's TERM/INT reaches neither the launcher nor srun ----------
# What a job step's signal does under Slurm (proctrack/pgid: the task's process group) is
# measured on a real Slurm in tests/integration/test_slurm.py; here the per-node script runs
# under bash as its own process group, with a stand-in launcher that records how it was
# started and exits once the stop was requested.
FAKE_LAUNCHER = """#!{python}
import json, os, signal, sys, time
run_dir = os.environ["FTL_RUN_DIR"]
record = {{
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
    "term_ignored": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN,
    "int_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    "signals_to_handle": os.environ.get("PET_SIGNALS_TO_HANDLE"),
}}
with open(os.path.join(run_dir, "launcher.json"), "w") as out:
    json.dump(record, out)
while not os.path.exists(os.path.join(run_dir, "preempt.requested")):
    time.sleep(0.05)
"""


def default_signals() -> None:
    """As slurmstepd starts a task: bash cannot trap a signal ignored when it starts, and a
    job started in the background of a non-interactive shell (`cmd &`) ignores SIGINT and
    SIGQUIT, which every child would inherit."""
    import signal

    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_step_signal_becomes_a_stop_request_and_spares_the_launcher(
    tmp_path: Path, launcher: str, signal_name: str
) -> None:
    import json
    import signal
    import time

    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    run_dir.mkdir()
    (bin_dir / launcher).write_text(FAKE_LAUNCHER.format(python=sys.executable))
    (bin_dir / launcher).chmod(0o755)
    cfg = compose_config([*CPU_JOB, "cluster.gpus_per_node=2", f"cluster.launcher={launcher}",
                          *(["strategy=zero2"] if launcher == "deepspeed" else [])])
    script = render(cfg, run_dir)
    srun = script[script.index("setsid srun "):]
    (per_node,) = shlex.split(srun[:srun.index("\nstep=$!")])[-2:-1]  # bash -c <this> &
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FTL_RUN_DIR": str(run_dir),
           "SLURM_NODEID": "0", "FTL_HEAD_NODE": "localhost"}
    task = subprocess.Popen(["bash", "-c", per_node], env=env, start_new_session=True,
                            preexec_fn=default_signals,
                            stdout=subprocess.PIPE, text=True)
    record_file = run_dir / "launcher.json"
    deadline = time.monotonic() + 30
    while not record_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the record is written whole before this test reads it
    os.killpg(task.pid, getattr(signal, signal_name))  # as slurmstepd signals a task
    out, _ = task.communicate(timeout=30)
    assert task.returncode == 0, out  # the launcher's own exit status, not a signal's
    assert f"ftl: node 0: {signal_name.removeprefix('SIG')}: checkpointing" in out
    assert (run_dir / "preempt.requested").exists()
    record = json.loads(record_file.read_text())
    assert record["sid"] == record["pid"] != task.pid  # setsid: out of the task's group
    assert record["term_ignored"] and record["int_ignored"]
    expected = "SIGHUP,SIGQUIT" if launcher == "torchrun" else None
    assert record["signals_to_handle"] == expected


def test_srun_runs_in_a_session_of_its_own() -> None:
    text = render(compose_config(CPU_JOB), RUN_DIR)
    assert "\nsetsid srun --nodes=1 " in text


# --- the ranks' side: PreemptCallback ----------------------------------------------------


def test_preempt_callback_saves_and_stops_once_requested(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState

    from launcher.rank.preempt import PreemptCallback

    callback, state = PreemptCallback(RunDir(tmp_path)), TrainerState(global_step=3, max_steps=10)
    control = TrainerControl()
    callback.on_step_end(None, state, control)  # type: ignore[arg-type]
    assert not (control.should_save or control.should_training_stop or callback.preempted)
    (tmp_path / "preempt.requested").touch()
    callback.on_step_end(None, state, control)  # type: ignore[arg-type]
    assert control.should_save and control.should_training_stop and callback.preempted
    # recorded once the save is over (the Trainer's train end), not while it may be cut short
    assert not (tmp_path / "preempted").exists()
    callback.on_train_end(None, state, control)  # type: ignore[arg-type]
    assert '"step": 3' in (tmp_path / "preempted").read_text()


def test_preempt_callback_lets_the_last_step_finish(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState

    from launcher.rank.preempt import PreemptCallback

    (tmp_path / "preempt.requested").touch()
    callback, control = PreemptCallback(RunDir(tmp_path)), TrainerControl()
    callback.on_step_end(None, TrainerState(global_step=10, max_steps=10), control)  # type: ignore[arg-type]
    assert not (control.should_training_stop or callback.preempted)
    assert not (tmp_path / "preempted").exists()  # finished runs must not requeue


AGREE_CODE = """
import os, sys, torch.distributed as dist
from launcher.rank.preempt import vote
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank}: {vote(rank == 1, 4 + rank)} {vote(False, 3)}")
dist.destroy_process_group()
"""


def test_ranks_agree_when_only_one_sees_the_request(tmp_path: Path) -> None:
    """2 gloo ranks: rank 1 alone sees the file; both must decide to stop at that step."""
    script = tmp_path / "agree.py"
    script.write_text(AGREE_CODE)
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", "--tee", "3", str(script)],
        capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # stop if any rank saw it; the smallest proposed interval
    for rank in (0, 1):
        assert f"rank {rank}: (True, 4) (False, 3)" in done.stdout


def test_status_of_a_dry_run_dir_and_of_nonsense(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.run.submit import status

    assert submit([*CPU_JOB, f"run.output_dir={tmp_path}"], dry_run=True) == 0
    (run_dir,) = tmp_path.glob("*/*")
    capsys.readouterr()
    assert status(str(run_dir)) == 0
    printed = capsys.readouterr().out
    assert "job: none recorded" in printed and f"run dir: {run_dir}" in printed
    assert "latest complete checkpoint: none yet" in printed
    with pytest.raises(ConfigError, match="neither a run directory nor a job id"):
        status(str(tmp_path / "missing"))


def test_doctor_step_comes_first_and_a_failed_check_ends_the_job() -> None:
    cfg = compose_config([*GPU_JOB, "cluster.nodes=2", "cluster.doctor=true"])
    text = render(cfg, RUN_DIR)
    doctor = text.index("--module launcher.doctor.probe")
    training = text.index("--module launcher.rank.worker")
    verdict = text.index('if ! python -m launcher.doctor "$FTL_RUN_DIR"; then')
    assert doctor < verdict < training
    assert text[verdict:training].count("    exit 1\n") == 1
    # same launcher, nodes and rendezvous bound for both steps
    assert text.count("torchrun --nnodes 2 --nproc_per_node 8") == 2
    assert text.count("--rdzv_conf join_timeout=900") == 2
    assert "launcher.doctor" not in render(compose_config([*GPU_JOB, "cluster.nodes=2"]), RUN_DIR)


def test_eval_tasks_run_as_the_last_step_of_a_finished_job_only(tmp_path: Path) -> None:
    """eval.tasks: `ftl eval RUN_DIR` on the first node with its GPUs once training has
    finished; not after a stop (the requeued start evaluates), and a failed evaluation
    fails the job without a requeue. The step on a real Slurm: tests/integration/test_slurm.py."""
    text = render(compose_config([*GPU_JOB, "cluster.nodes=2", "eval.tasks=[arith]"]), RUN_DIR)
    step = text.index("srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 --gpus-per-node=8 "
                      '--cpus-per-task=32 python -m launcher eval "$FTL_RUN_DIR"')
    assert text.index("--module launcher.rank.worker") < text.index("run finished") < step
    assert "launcher eval" not in render(compose_config(GPU_JOB), RUN_DIR)
    # cluster.gpu=cpu below: no GPUs asked for; a stop requeues (exit 0) without evaluating
    for ranks, rc, exit_code in (("finish", 0, 0), ("finish", 3, 1), ("preempt", 0, 0)):
        (job := tmp_path / f"{ranks}{rc}").mkdir()
        done = run_job_script(job, "USR1" if ranks == "preempt" else "", ranks,
                              overrides=("eval.tasks=[arith]",), eval_rc=rc)
        assert done.returncode == exit_code, done.stdout + done.stderr
        ran = "eval step: --nodes=1 --ntasks=1 --kill-on-bad-exit=1 python -m launcher eval"
        assert (ran in done.stdout) == (ranks == "finish"), done.stdout
        assert ("the evaluation failed" in done.stdout) == (rc != 0), done.stdout
