"""The sbatch job script, as pure text (SlurmScheduler.render). Its layout is render_sbatch's,
top to bottom; what every job script must honour: docs/design.md ("The scheduler seam"); why
each piece, measured: docs/evidence/stack.md. Every stop is RUN_DIR/preempt.requested, which every
rank polls at step ends (launcher/rank/preempt.py) whatever launcher sits between srun and
the ranks; bash runs a trap only when its foreground child exits, hence `& wait`.

Quoting: shell values go through shlex.quote. #SBATCH lines are parsed by sbatch itself,
not by a shell: it honours double quotes and backslash escapes (not single quotes) and
treats an unquoted `#` as a comment, so those values get `sbatch_quote`. Control characters
are refused everywhere (__init__.py: a newline would start a new script line). Secrets reach
the job through the environment (sbatch's default --export=ALL), never the script.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from launcher.config.hardware import is_gpu_preset
from launcher.config.schema import RunConfig
from launcher.launchers.command import (
    DOCTOR_MODULE,
    HEAD_NODE_VAR,
    NODE_RANK_VAR,
    SHELL_VARS,
    Launch,
    quote_arg,
    render_argv,
    with_module,
)
from launcher.rundir import (
    CANCEL_REQUESTED,
    CHECKPOINTS,
    COMPLETE_MARKER,
    HANG,
    HUNG_EXIT,
    LOGS,
    PREEMPT_REQUESTED,
    PREEMPTED,
    RESULT,
    STARTUP,
    STOPPED_EXIT,  # `ftl cancel`ed: stopped, resumable
)

RUN_DIR_VAR = "FTL_RUN_DIR"


def sbatch_quote(value: str) -> str:
    """One value for an #SBATCH line: sbatch strips double quotes and backslash escapes."""
    if re.match(r"^[A-Za-z0-9_./:%@+=,-]+$", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _has_gpus(cfg: RunConfig) -> bool:
    return is_gpu_preset(cfg.cluster.gpu)


def sbatch_options(cfg: RunConfig, run_dir: str) -> list[str]:
    """The #SBATCH lines, every value quoted for sbatch's own parser."""
    cluster, slurm = cfg.cluster, cfg.cluster.slurm
    # sbatch expands %j (the job id), %x, ... in --output: a literal % in the run dir is %%.
    logs = str(Path(run_dir) / LOGS).replace("%", "%%")
    gpus = _has_gpus(cfg)
    pairs: list[tuple[str, str | None]] = [  # an empty value: the option is left out
        ("--job-name", cfg.run.name),
        ("--partition", slurm.partition),
        ("--account", slurm.account),
        ("--qos", slurm.qos),
        ("--time", slurm.time),
        ("--nodes", str(cluster.nodes)),
        ("--ntasks-per-node", "1"),  # one launcher per node; it starts the node's ranks
        ("--gpus-per-node", str(cluster.gpus_per_node) if gpus else ""),
        ("--cpus-per-task", str(slurm.cpus_per_task) if slurm.cpus_per_task else ""),
        ("--mem", slurm.mem),
        ("--output", f"{logs}/slurm-%j.out"),
        ("--error", f"{logs}/slurm-%j.err"),
        ("--open-mode", "append"),  # a requeued job keeps its earlier output
        ("--requeue", None),
        ("--signal", f"B:USR1@{slurm.signal_grace_s}"),
    ]
    lines = [f"#SBATCH {flag}" if value is None else f"#SBATCH {flag}={sbatch_quote(value)}"
             for flag, value in pairs if value != ""]
    for extra in slurm.sbatch_extra:
        lines.append("#SBATCH " + " ".join(sbatch_quote(token) for token in shlex.split(extra)))
    return lines


def render_sbatch(
    cfg: RunConfig, run_dir: str | Path, launch: Launch, tool_dir: str | Path | None = None
) -> str:
    """The whole job script; pure (the snapshot tests rely on it). launch: the per-node
    command (command.build_launch). tool_dir: prepended to PATH (the submitting venv's bin,
    where torchrun and deepspeed live); cluster.setup lines run after it and may replace it."""
    run_dir = str(run_dir)
    q = shlex.quote
    lines = ["#!/bin/bash", *sbatch_options(cfg, run_dir)]
    lines += [
        "",
        "# Written by ftlaunch (`ftl submit`). Not `set -e`: the end decides on the exit code.",
        "set -uo pipefail",
        f"export {RUN_DIR_VAR}={q(run_dir)}",
        *_start_lines(),
    ]
    if tool_dir is not None:
        lines += ["", 'export PATH=' + q(str(tool_dir)) + ':"$PATH"']
    if cfg.cluster.setup:
        lines += ["", "# cluster.setup (run as written)", *cfg.cluster.setup]
    lines += ["", *(f"export {key}={q(value)}" for key, value in launch.env.items())]
    lines += _head_node_lines(cfg, launch, run_dir)
    if cfg.cluster.doctor:
        lines += ["", *_doctor_lines(cfg, launch, run_dir)]
    lines += ["", *_srun_lines(cfg, launch, run_dir), "", *_finish_lines(cfg)]
    return "\n".join(lines) + "\n"


def _start_lines() -> list[str]:
    """Clear the previous start's stop request (a requeued job runs this again); honour an
    `ftl cancel` that came before or while this runs (it writes cancel.requested first);
    then the batch shell's traps."""
    return [
        f'if [ -e "$FTL_RUN_DIR"/{CANCEL_REQUESTED} ]; then',
        '    echo "ftl: cancelled by \\`ftl cancel\\` before this start; not training"',
        f"    exit {STOPPED_EXIT}",
        "fi",
        f'rm -f "$FTL_RUN_DIR"/{PREEMPT_REQUESTED} "$FTL_RUN_DIR"/{PREEMPTED}',
        f'rm -rf "$FTL_RUN_DIR"/{HANG}  # an earlier start\'s hang (a requeue by hand)',
        f'rm -rf "$FTL_RUN_DIR"/{STARTUP}  # who starts is recorded afresh at each start',
        f'[ -e "$FTL_RUN_DIR"/{CANCEL_REQUESTED} ] && touch "$FTL_RUN_DIR"/{PREEMPT_REQUESTED}',
        "",
        "# USR1 (--signal=B:USR1@grace, `scancel -b -s USR1`), TERM (a preemption, `scancel",
        "# --full` or `--batch`) and INT: ask the ranks to save a checkpoint at the next step",
        "# boundary and stop; the end of this script requeues (not after `ftl cancel`).",
        "ftl_preempt() {",
        '    echo "ftl: $1 at $(date +%FT%T): checkpointing at the next step, then stopping"',
        f'    touch "$FTL_RUN_DIR"/{PREEMPT_REQUESTED}',
        "}",
        *(f"trap 'ftl_preempt {name}' {name}" for name in ("USR1", "TERM", "INT")),
    ]


def _head_node_lines(cfg: RunConfig, launch: Launch, run_dir: str) -> list[str]:
    lines = [
        f'{HEAD_NODE_VAR}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        f"export {HEAD_NODE_VAR}",
    ]
    if launch.hostfile is not None and "--hostfile" in launch.argv:
        # deepspeed --no_ssh counts the hostfile's lines; written from the real node list.
        hostfile = launch.argv[launch.argv.index("--hostfile") + 1]
        lines.append(
            f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\\$/ slots='
            f'{cfg.cluster.gpus_per_node}/" '
            f"> {quote_arg(_run_dir_var(hostfile, run_dir), (RUN_DIR_VAR,))}"
        )
    lines.append(
        f'echo "ftl: job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on '
        f'$SLURM_JOB_NODELIST, head node ${HEAD_NODE_VAR}, run dir $FTL_RUN_DIR"'
    )
    return lines


def _srun_lines(cfg: RunConfig, launch: Launch, run_dir: str) -> list[str]:
    nodes = cfg.cluster.nodes
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1"]
    if cfg.cluster.slurm.cpus_per_task:
        # Slurm 22.05 steps do not inherit the job's --cpus-per-task.
        srun.append(f"--cpus-per-task={cfg.cluster.slurm.cpus_per_task}")
    return [
        "# One task per node: it starts this node's ranks (node rank = SLURM_NODEID).",
        "# srun in a session of its own: a TERM to this script's process group (`scancel",
        "# --full`) would make srun kill the step (\"forcing job termination\"), ignored or not.",
        f"setsid {' '.join(srun)} \\",
        f"    bash -c {shlex.quote(_per_node_script(cfg, launch, run_dir))} &",
        "step=$!",
        *_wait_lines("step"),
    ]


def _doctor_lines(cfg: RunConfig, launch: Launch, run_dir: str) -> list[str]:
    """cluster.doctor=true (`ftl submit --doctor`): `ftl doctor`'s ranks on the same nodes
    with the same launcher first (launcher/doctor/); its table goes to the job's output, and
    a failed check ends the job (exit 1, not requeued) before any training starts."""
    return [
        "# cluster.doctor=true: ftl doctor's checks on these nodes first (launcher/doctor/).",
        *_srun_lines(cfg, with_module(launch, DOCTOR_MODULE), run_dir),
        'if ! python -m launcher.doctor "$FTL_RUN_DIR"; then',
        '    echo "ftl: ftl doctor found a problem (above; step exit code $rc); not training"',
        "    exit 1",
        "fi",
        f'rm -rf "$FTL_RUN_DIR"/{STARTUP}  # the doctor\'s ranks are not the training\'s',
    ]


def _per_node_script(cfg: RunConfig, launch: Launch, run_dir: str) -> str:
    """The srun task: this node's launcher in a session of its own (setsid) with TERM/INT
    ignored and torchrun's agent handling neither (PET_SIGNALS_TO_HANDLE), so a step's
    TERM/INT (`scancel -s TERM JOB`) never makes it kill the ranks 30 s into their save;
    this shell turns them into the stop request (docs/evidence/stack.md). Left open: under
    cgroup deepspeed's launch.py installs its own TERM/INT handlers, still 30 s for the ranks."""
    argv = [_run_dir_var(arg, run_dir) for arg in launch.argv]
    command = render_argv(argv, (*SHELL_VARS, RUN_DIR_VAR))  # the node task exports all three
    exports = [f'{NODE_RANK_VAR}="$SLURM_NODEID"']
    if cfg.cluster.launcher == "torchrun":
        exports.append("PET_SIGNALS_TO_HANDLE=SIGHUP,SIGQUIT")
    lines = [
        "",
        f"export {' '.join(exports)}",
        "ftl_stop() {",
        f'    echo "ftl: node ${NODE_RANK_VAR}: $1: checkpointing at the next step, then stopping"',
        f'    touch "${RUN_DIR_VAR}"/{PREEMPT_REQUESTED}',
        "}",
        'trap "ftl_stop TERM" TERM',
        'trap "ftl_stop INT" INT',
        # This node's launcher started (launcher/rank/startup.py diagnose reads it).
        f'mkdir -p "${RUN_DIR_VAR}"/{STARTUP} && printf \'{{"node": %s, "host": "%s", '
        f'"time": %s}}\\n\' "${NODE_RANK_VAR}" "$(hostname)" "$(date +%s)" '
        f'> "${RUN_DIR_VAR}"/{STARTUP}/node-"${NODE_RANK_VAR}".json',
        f'(trap "" TERM INT; exec setsid {command}) &',
        "launcher=$!",
        *_wait_lines("launcher"),
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def _wait_lines(pid_var: str) -> list[str]:
    return [
        "# wait returns early (status > 128) when a trap ran; then keep waiting.",
        "while :; do",
        f'    rc=0; wait "${pid_var}" || rc=$?',
        f'    if [ "$rc" -gt 128 ] && kill -0 "${pid_var}" 2>/dev/null; then continue; fi',
        "    break",
        "done",
    ]


def _run_dir_var(arg: str, run_dir: str) -> str:
    """The run dir as ${FTL_RUN_DIR} in the per-node command: one quoted value in the
    script (the export above) instead of nested quoting inside `bash -c '...'`."""
    if arg == run_dir or arg.startswith(run_dir.rstrip("/") + "/"):
        return "${" + RUN_DIR_VAR + "}" + arg[len(run_dir):]
    return arg


def _finish_lines(cfg: RunConfig) -> list[str]:
    """Finished -> 0; hung -> HUNG_EXIT, even after a stop request, and `ftl cancel`ed ->
    STOPPED_EXIT, neither requeued (why: docs/design.md, "The scheduler seam"); stopped on a
    signal -> requeue; else a failure."""
    max_restarts = cfg.cluster.slurm.max_restarts
    return [
        f'if [ -e "$FTL_RUN_DIR"/{RESULT} ] && [ ! -e "$FTL_RUN_DIR"/{PREEMPTED} ]; then',
        '    echo "ftl: run finished (step exit code $rc)"',
        '    [ "$rc" -eq 0 ] || echo "ftl: the run completed; a non-zero exit at shutdown"',
        *_eval_lines(cfg),
        "    exit 0",
        "fi",
        f'if compgen -G "$FTL_RUN_DIR/{HANG}/rank-*.json" > /dev/null; then',
        '    echo "ftl: hung: a rank made no progress within train.hang_timeout_s; stacks in '
        f'$FTL_RUN_DIR/{HANG} (\\`ftl status $FTL_RUN_DIR\\` says where each rank was). '
        "Not requeued; the same \\`ftl submit\\` command resumes from the latest "
        f'complete checkpoint. Exit status {HUNG_EXIT}"',
        f"    exit {HUNG_EXIT}",
        "fi",
        f'if [ -e "$FTL_RUN_DIR"/{CANCEL_REQUESTED} ]; then',
        f"    stop_step=$(sed -n 's/.*\"step\": *\\([0-9]*\\).*/\\1/p' "
        f'"$FTL_RUN_DIR"/{PREEMPTED} 2>/dev/null)',
        f'    if [ -n "$stop_step" ] && [ -e "$FTL_RUN_DIR"/{CHECKPOINTS}/checkpoint-"$stop_step"'
        f"/{COMPLETE_MARKER} ]; then",
        '        echo "ftl: cancelled by \\`ftl cancel\\` after a complete checkpoint (step '
        f'$stop_step); not requeueing. Exit status {STOPPED_EXIT}: stopped, resumable"',
        f"        exit {STOPPED_EXIT}",
        "    fi",
        '    echo "ftl: cancelled by \\`ftl cancel\\` without a new complete checkpoint; '
        'not requeueing"',
        f'elif [ -e "$FTL_RUN_DIR"/{PREEMPT_REQUESTED} ]; then',
        "    restarts=${SLURM_RESTART_COUNT:-0}",
        f'    if [ "$restarts" -lt {max_restarts} ]; then',
        f'        echo "ftl: requeueing (restart $((restarts + 1)) of {max_restarts}); '
        'the rerun resumes from the latest complete checkpoint (step exit code $rc)"',
        '        scontrol requeue "$SLURM_JOB_ID" && exit 0',
        '        echo "ftl: scontrol requeue failed"',
        "    else",
        f'        echo "ftl: not requeueing: cluster.slurm.max_restarts={max_restarts} reached"',
        "    fi",
        "fi",
        '[ "$rc" -eq 0 ] && rc=1  # the ranks stopped early: the run is not done',
        'python -m launcher.rank.startup "$FTL_RUN_DIR"  # the nodes/ranks that never came',
        'echo "ftl: the run did not finish (exit code $rc); rank logs: $FTL_RUN_DIR/logs"',
        'exit "$rc"',
    ]


def _eval_lines(cfg: RunConfig) -> list[str]:
    """eval.tasks (`ftl submit --eval T1,T2`): `ftl eval RUN_DIR` as the job's last step, on
    its first node and that node's GPUs, once training has finished: the run's eval.* from
    its config.yaml, the results into RUN_DIR/eval/. A failed evaluation fails the job
    (exit 1, not requeued: the model is saved; `ftl eval RUN_DIR` reruns it alone)."""
    if not cfg.eval.tasks:
        return []
    srun = ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1"]
    if _has_gpus(cfg):
        srun.append(f"--gpus-per-node={cfg.cluster.gpus_per_node}")
    if cfg.cluster.slurm.cpus_per_task:
        srun.append(f"--cpus-per-task={cfg.cluster.slurm.cpus_per_task}")
    said = shlex.quote(f"ftl: eval.tasks={','.join(cfg.eval.tasks)}: ftl eval")
    return [
        f'    echo {said} "$FTL_RUN_DIR"',
        f'    if ! {" ".join(srun)} python -m launcher eval "$FTL_RUN_DIR"; then',
        '        echo "ftl: the evaluation failed (above); the model is saved. Rerun it: '
        'ftl eval $FTL_RUN_DIR"',
        "        exit 1",
        "    fi",
    ]
