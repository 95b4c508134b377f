"""Pure launch-command builders: RunConfig + run dir -> (argv, env, hostfile text): which
launcher starts `python -m launcher.rank.worker RUN_DIR` on every rank, with which flags.

Forms (dispatch on cluster.launcher, cluster.nodes and cluster.scheduler):

| launcher  | nodes | form                                                         | per_node |
|-----------|-------|--------------------------------------------------------------|----------|
| torchrun  | 1     | `--standalone` (rendezvous on a free local port)             | no       |
| torchrun  | >1    | c10d rendezvous at HEAD:cluster.master_port                  | yes      |
| deepspeed | 1     | `--num_gpus N` on localhost, or `--include` (see below)      | no       |
| deepspeed | >1    | a scheduler: `--no_ssh --node_rank R`                        | yes      |
| deepspeed | >1    | no scheduler: `--hostfile` + pdsh/ssh from this machine      | no       |

A local GPU launch under CUDA_VISIBLE_DEVICES (`visible_devices`): torchrun's ranks see only
those GPUs; DeepSpeed's runner ignores the variable once `--num_gpus` is given and its
launch.py numbers the ranks' GPUs from 0 (deepspeed 0.19.8), so the deepspeed form names
the first N listed ids with `--include localhost:IDS` instead.

Per-node forms are started once on every node; the head node and node rank (a Slurm job
learns them at run time) are `${FTL_HEAD_NODE}` / `${FTL_NODE_RANK}` placeholders that the
per-node shell must export (`Launch.shell_vars`, kept unquoted by `render_command`).

Per-rank logs land in RUN_DIR/logs (layouts measured with torch 2.13 / deepspeed 0.19.8):
- torchrun: `logs/<rdzv id>_<random>/attempt_<restart>/<local rank>/{stdout,stderr}.log`,
  and local rank 0 is also teed to the console with a `[default0]:` prefix. Multi-node runs
  use `logs/node-<node rank>/...` so nodes sharing a file system do not mix local ranks.
- deepspeed: `logs/<YYYYmmddHHMMSS>_rank<global rank>.log` (stdout+stderr together); the
  console shows only the launcher's own lines.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from launcher.config.hardware import GPU_PRESETS
from launcher.config.schema import NO_SCHEDULER, RunConfig
from launcher.rundir import HOSTFILE, LOGS

WORKER_MODULE = "launcher.rank.worker"
DOCTOR_MODULE = "launcher.doctor.probe"
"""What `ftl doctor` (and `ftl submit --doctor` before the job trains) runs on every rank
instead of the worker."""
HEAD_NODE_VAR = "FTL_HEAD_NODE"
NODE_RANK_VAR = "FTL_NODE_RANK"
HEAD_NODE, NODE_RANK = "${" + HEAD_NODE_VAR + "}", "${" + NODE_RANK_VAR + "}"
SHELL_VARS = (HEAD_NODE_VAR, NODE_RANK_VAR)
"""A per-node form's head node and node rank: placeholders the node's shell exports (a Slurm
job learns them at run time)."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    """argv[0] is the bare tool name (torchrun | deepspeed); the caller resolves its path."""
    env: dict[str, str] = field(default_factory=dict)
    """Only what the launcher adds; the caller merges it over its own environment."""
    hostfile: str | None = None
    """Text of a DeepSpeed hostfile the caller must write at the path given by --hostfile."""
    per_node: bool = False
    """True: start this same command once on every node (not once in total)."""
    forwards_stop: bool = True
    """Whether the launcher passes a SIGTERM on to the ranks. The deepspeed launcher on one
    node does not; `ftl train` then names itself to the ranks (launchers/supervisor.py)."""

    @property
    def shell_vars(self) -> tuple[str, ...]:
        """Variables the argv expects from the per-node shell (`${NAME}` in an element)."""
        return SHELL_VARS if self.per_node else ()


def build_launch(cfg: RunConfig, run_dir: str, visible_devices: str | None = None) -> Launch:
    """The command that starts `python -m launcher.rank.worker RUN_DIR` on every rank;
    `visible_devices`: this machine's CUDA_VISIBLE_DEVICES for a local GPU launch (integer
    ids, at least cluster.gpus_per_node of them: preflight.visible_devices checked)."""
    if cfg.cluster.launcher == "torchrun":
        return _torchrun(cfg, run_dir)
    if cfg.cluster.launcher == "deepspeed":
        return _deepspeed(cfg, run_dir, visible_devices)
    raise ValueError(f"cluster.launcher={cfg.cluster.launcher}: rules.py admits no such launcher")


def _torchrun(cfg: RunConfig, run_dir: str) -> Launch:
    cluster = cfg.cluster
    count = ["--nproc_per_node", str(cluster.gpus_per_node)]
    if cluster.nodes == 1:
        # --standalone picks a free port itself, so two local runs never collide on master_port.
        argv = ["torchrun", "--standalone", "--nnodes", "1", *count,
                *_torchrun_logs(posixpath.join(run_dir, LOGS)), *_program(run_dir)]
        return Launch(argv=argv, env=launch_env(cfg))
    argv = [
        "torchrun", "--nnodes", str(cluster.nodes), *count,
        "--rdzv_backend", "c10d",
        "--rdzv_endpoint", f"{HEAD_NODE}:{cluster.master_port}",
        # Same run dir -> same id, so a requeued job's nodes meet in the same rendezvous.
        "--rdzv_id", rendezvous_id(run_dir),
        # A node that never joins ends the rendezvous after the start-up bound (torch's
        # default: 600 s), the same bound the ranks' own join has (rank/startup.py).
        "--rdzv_conf", f"join_timeout={int(math.ceil(cluster.startup_timeout_s))}",
        *_torchrun_logs(posixpath.join(run_dir, LOGS, f"node-{NODE_RANK}")),
        *_program(run_dir),
    ]
    return Launch(argv=argv, env=launch_env(cfg), per_node=True)


def _torchrun_logs(log_dir: str) -> list[str]:
    # Every local rank's stdout+stderr to files (-r 3); local rank 0 also to the console.
    return ["--log_dir", log_dir, "--redirects", "3", "--tee", "0:3"]


def _deepspeed(cfg: RunConfig, run_dir: str, visible_devices: str | None) -> Launch:
    """One node: `--num_gpus` (always: on gpu=cpu the CPU accelerator reports one device),
    or `--include localhost:IDS` for the GPUs CUDA_VISIBLE_DEVICES names.
    Several: one `deepspeed --no_ssh` per node under a scheduler (Slurm starts one task
    per node), else one here that starts every node over pdsh/ssh."""
    cluster = cfg.cluster
    hostfile: str | None = None
    nodes: list[str] = []
    # Without --master_addr a multi-node deepspeed asks the first host for `hostname -I` over
    # ssh.
    master_addr: list[str] = []
    if cluster.nodes > 1 and cluster.scheduler != NO_SCHEDULER:
        # With --no_ssh deepspeed only counts the hostfile's `host slots=N` lines (node_rank
        # picks one) and never connects to the names, so placeholders are enough.
        hostfile = "".join(f"node{index} slots={cluster.gpus_per_node}\n"
                           for index in range(cluster.nodes))
        nodes = ["--hostfile", posixpath.join(run_dir, HOSTFILE), "--no_ssh",
                 "--node_rank", NODE_RANK]
        master_addr = ["--master_addr", HEAD_NODE]
    elif cluster.nodes > 1:
        if not cluster.hostfile:
            raise ValueError("deepspeed multi-node without a scheduler needs cluster.hostfile "
                             "(rules.py checks it)")
        nodes = ["--hostfile", cluster.hostfile]  # the user's own file: referenced, not rewritten
    if nodes:
        nodes += ["--num_nodes", str(cluster.nodes)]
    # --no_local_rank: the worker's only argument is the run dir (LOCAL_RANK is in the env).
    devices = ["--num_gpus", str(cluster.gpus_per_node)]
    if visible_devices and cluster.nodes == 1:
        ids = [i.strip() for i in visible_devices.split(",")][:cluster.gpus_per_node]
        devices = ["--include", "localhost:" + ",".join(ids)]
    argv = ["deepspeed", *nodes, *devices, *master_addr,
            "--master_port", str(cluster.master_port), "--no_local_rank",
            "--enable_each_rank_log", posixpath.join(run_dir, LOGS), *_program(run_dir)]
    return Launch(argv=argv, env=launch_env(cfg), hostfile=hostfile,
                  per_node=hostfile is not None, forwards_stop=cluster.nodes > 1)


def with_module(launch: Launch, module: str) -> Launch:
    """The same launch starting `python -m MODULE RUN_DIR` on every rank instead of the
    worker (`ftl doctor`'s ranks: launcher/doctor/probe.py)."""
    argv = [module if arg == WORKER_MODULE else arg for arg in launch.argv]
    return replace(launch, argv=argv)


def _program(run_dir: str) -> list[str]:
    return ["--module", WORKER_MODULE, run_dir]


def launch_env(cfg: RunConfig) -> dict[str, str]:
    """Variables the launcher adds; never a copy of the caller's environment (no secrets)."""
    env = {
        # Rank output goes to log files (a pipe/file makes Python block-buffer); unbuffered,
        # the logs are live and keep the last lines when a rank dies or aborts at exit.
        "PYTHONUNBUFFERED": "1",
    }
    preset = GPU_PRESETS.get(cfg.cluster.gpu)
    if preset is not None and preset.is_cpu:
        # CPU ranks share the cores: one OpenMP thread each avoids oversubscription.
        # torchrun sets this itself; the deepspeed launcher does not.
        env["OMP_NUM_THREADS"] = "1"
        # DeepSpeed's CPU accelerator counts a node's devices from LOCAL_SIZE, which only the
        # deepspeed launcher sets; without it every count runs `numactl --hardware` in a
        # subprocess (ZeRO-3 counts once per gradient bucket, ~9 times a demo step, and
        # each spawn re-arms torch's deprecation warnings: ~17 log lines a step) and says 1.
        env["LOCAL_SIZE"] = str(cfg.cluster.gpus_per_node)
    return env


def rendezvous_id(run_dir: str) -> str:
    """Stable id from the run dir's last two parts (`<run name>/<time>`)."""
    parts = [part for part in run_dir.split("/") if part][-2:]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(parts)) or "ftl"


def quote_arg(arg: str, shell_vars: Sequence[str] = ()) -> str:
    """shlex.quote, except `${NAME}` for NAME in shell_vars stays expandable ("${NAME}")."""
    if not shell_vars:
        return shlex.quote(arg)
    names = "|".join(re.escape(name) for name in shell_vars)
    pieces = re.split(r"(\$\{(?:" + names + r")\})", arg)
    # re.split keeps the captured placeholders at odd indexes; the rest is literal text.
    quoted = [
        f'"{piece}"' if index % 2 else shlex.quote(piece)
        for index, piece in enumerate(pieces)
        if piece or len(pieces) == 1
    ]
    return "".join(quoted)


def render_argv(argv: Sequence[str], shell_vars: Sequence[str] = ()) -> str:
    return " ".join(quote_arg(arg, shell_vars) for arg in argv)


def render_command(launch: Launch) -> str:
    """One shell line: `KEY=VALUE ... tool args`, every element quoted for POSIX shells."""
    env = [f"{key}={shlex.quote(value)}" for key, value in launch.env.items()]
    return " ".join([*env, render_argv(launch.argv, launch.shell_vars)])
