"""launcher/launchers/command.py: exact argv per launcher form, env, hostfile, quoting."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys

import psutil
import pytest

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.launchers.command import Launch, build_launch, render_command, rendezvous_id
from launcher.launchers.supervisor import ENV, Supervisor
from launcher.validation.validate import validate

RUN_DIR = "/runs/ftl/20260101-120000"
GPU8 = ["cluster.gpu=a100-80g", "cluster.gpus_per_node=8"]
WORKER = ["--module", "launcher.rank.worker", RUN_DIR]
TORCHRUN_LOGS = ["--redirects", "3", "--tee", "0:3"]
DS_TAIL = ["--no_local_rank", "--enable_each_rank_log", f"{RUN_DIR}/logs", *WORKER]


def launch_for(*overrides: str, run_dir: str = RUN_DIR) -> Launch:
    return build_launch(compose_config(list(overrides)), run_dir)


def test_torchrun_one_node_eight_gpus() -> None:
    launch = launch_for("cluster.launcher=torchrun", *GPU8)
    assert launch.argv == [
        "torchrun", "--standalone", "--nnodes", "1", "--nproc_per_node", "8",
        "--log_dir", f"{RUN_DIR}/logs", *TORCHRUN_LOGS, *WORKER,
    ]
    assert (launch.per_node, launch.hostfile, launch.shell_vars) == (False, None, ())


def test_torchrun_two_nodes_uses_c10d_and_shell_placeholders() -> None:
    launch = launch_for("cluster=slurm", "cluster.nodes=2", "cluster.master_port=29600", *GPU8)
    assert launch.argv == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "8",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", "${FTL_HEAD_NODE}:29600",
        "--rdzv_id", "ftl-20260101-120000", "--rdzv_conf", "join_timeout=900",
        "--log_dir", f"{RUN_DIR}/logs/node-${{FTL_NODE_RANK}}", *TORCHRUN_LOGS, *WORKER,
    ]
    assert launch.per_node is True
    assert launch.shell_vars == ("FTL_HEAD_NODE", "FTL_NODE_RANK")


def test_deepspeed_one_node_eight_gpus() -> None:
    launch = launch_for("cluster.launcher=deepspeed", "cluster.master_port=29700", *GPU8)
    assert launch.argv == [
        "deepspeed", "--num_gpus", "8", "--master_port", "29700", *DS_TAIL,
    ]
    assert (launch.per_node, launch.hostfile) == (False, None)


def test_deepspeed_on_one_node_names_the_gpus_cuda_visible_devices_lists() -> None:
    """DeepSpeed's runner ignores CUDA_VISIBLE_DEVICES once --num_gpus is given and numbers
    the ranks' GPUs from 0: the launch names the listed ones, as DeepSpeed's parser reads."""
    from deepspeed.launcher.runner import parse_args, parse_inclusion_exclusion

    two = ["cluster.gpu=a100-80g", "cluster.gpus_per_node=2", "cluster.master_port=29700"]
    cfg = compose_config(["cluster.launcher=deepspeed", *two])
    launch = build_launch(cfg, RUN_DIR, visible_devices="5,2,7")
    assert launch.argv == ["deepspeed", "--include", "localhost:5,2", "--master_port", "29700",
                           *DS_TAIL]
    args = parse_args(launch.argv[1:])
    assert dict(parse_inclusion_exclusion({"localhost": 8}, args.include, args.exclude)) == {
        "localhost": [2, 5]}
    # torchrun's ranks see only the listed GPUs already.
    torchrun = compose_config(["cluster.launcher=torchrun", *two])
    assert build_launch(torchrun, RUN_DIR, "5,2,7") == build_launch(torchrun, RUN_DIR)


def test_deepspeed_two_nodes_on_slurm_is_one_no_ssh_launcher_per_node() -> None:
    launch = launch_for("cluster=slurm", "cluster.launcher=deepspeed", "cluster.nodes=2", *GPU8)
    assert launch.argv == [
        "deepspeed", "--hostfile", f"{RUN_DIR}/hostfile", "--no_ssh",
        "--node_rank", "${FTL_NODE_RANK}", "--num_nodes", "2", "--num_gpus", "8",
        "--master_addr", "${FTL_HEAD_NODE}", "--master_port", "29500", *DS_TAIL,
    ]
    assert launch.per_node is True
    # --no_ssh never connects to the names: placeholders, one line per node.
    assert launch.hostfile == "node0 slots=8\nnode1 slots=8\n"


def test_deepspeed_two_nodes_local_uses_the_users_hostfile() -> None:
    launch = launch_for(
        "cluster.launcher=deepspeed", "cluster.nodes=2", "cluster.hostfile=/etc/ds/hosts", *GPU8
    )
    assert launch.argv == [
        "deepspeed", "--hostfile", "/etc/ds/hosts", "--num_nodes", "2", "--num_gpus", "8",
        "--master_port", "29500", *DS_TAIL,
    ]
    assert (launch.per_node, launch.hostfile) == (False, None)


def test_deepspeed_two_nodes_local_without_hosts_is_refused_by_validation() -> None:
    cfg = compose_config(["cluster.launcher=deepspeed", "cluster.nodes=2", *GPU8])
    with pytest.raises(ConfigError) as caught:
        validate(cfg, "plan")
    assert "cluster.hostfile=PATH" in str(caught.value)
    with pytest.raises(ValueError):  # the builder never sees it; if it did, no silent argv
        build_launch(cfg, "/runs/x")


def test_unknown_launcher_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="cluster.launcher=mpirun"):
        validate(compose_config(["cluster.launcher=mpirun"]), "plan")


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_cpu_preset_sets_one_omp_thread_and_the_node_rank_count(launcher: str) -> None:
    # LOCAL_SIZE: DeepSpeed's CPU accelerator's device count (the deepspeed launcher sets it
    # too); the probe of test_train_strategies.py sees it in the ranks.
    launch = launch_for(
        f"cluster.launcher={launcher}", "cluster.gpu=cpu", "cluster.gpus_per_node=3"
    )
    assert launch.env == {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "LOCAL_SIZE": "3"}
    count_flag = "--nproc_per_node" if launcher == "torchrun" else "--num_gpus"
    assert launch.argv[launch.argv.index(count_flag) + 1] == "3"


def test_gpu_preset_leaves_omp_threads_alone() -> None:
    assert launch_for(*GPU8).env == {"PYTHONUNBUFFERED": "1"}


def test_env_never_copies_secrets_or_inherited_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_value")
    for overrides in (["cluster.launcher=torchrun"], ["cluster.launcher=deepspeed"],
                      ["cluster=slurm", "cluster.nodes=2", "cluster.launcher=deepspeed"]):
        launch = launch_for(*overrides)
        assert set(launch.env) <= {"PYTHONUNBUFFERED", "OMP_NUM_THREADS", "LOCAL_SIZE"}
        assert "secret" not in render_command(launch)


def test_rendered_command_quotes_a_run_dir_with_space_and_quote() -> None:
    run_dir = "/runs/my run/it's $HOME"
    launch = launch_for("cluster.launcher=deepspeed", "cluster.gpu=cpu", run_dir=run_dir)
    line = render_command(launch)
    words = shlex.split(line)
    assert words == ["PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1", "LOCAL_SIZE=2", *launch.argv]
    assert words[-1] == run_dir


def test_rendered_per_node_command_expands_only_the_placeholders() -> None:
    run_dir = "/runs/my run/it's $HOME"
    launch = launch_for("cluster=slurm", "cluster.nodes=2", "cluster.gpu=cpu", run_dir=run_dir)
    line = render_command(launch)
    # Replace the tool with printf so bash prints each argument as the launcher would get it.
    echo = line.replace(" torchrun ", " printf '%s\\n' ", 1)
    out = subprocess.run(
        ["bash", "-c", echo], capture_output=True, text=True, check=True,
        env={"FTL_HEAD_NODE": "gpu-a", "FTL_NODE_RANK": "1", "HOME": "/should-not-appear"},
    ).stdout.splitlines()
    assert "gpu-a:29500" in out
    assert f"{run_dir}/logs/node-1" in out
    assert out[-1] == run_dir


def test_rendezvous_id_is_stable_and_shell_safe() -> None:
    assert rendezvous_id("/a/b/my run/2026-01-01_12:00/") == "my_run-2026-01-01_12_00"
    assert rendezvous_id("rel/x") == rendezvous_id("/abs/rel/x")


def test_command_module_imports_no_heavy_library() -> None:
    code = (
        "import sys, launcher.launchers.command; "
        "print(sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_torchrun_rendezvous_waits_the_start_up_bound_rounded_up() -> None:
    launch = launch_for("cluster=slurm", "cluster.nodes=2", "cluster.startup_timeout_s=7.5",
                        *GPU8)
    assert launch.argv[launch.argv.index("--rdzv_conf") + 1] == "join_timeout=8"


def test_with_module_swaps_only_the_program() -> None:
    from launcher.launchers.command import with_module

    launch = launch_for("cluster=slurm", "cluster.nodes=2", *GPU8)
    doctor = with_module(launch, "launcher.doctor.probe")
    assert doctor.argv[:-3] == launch.argv[:-3]
    assert doctor.argv[-3:] == ["--module", "launcher.doctor.probe", RUN_DIR]
    assert (doctor.env, doctor.per_node, doctor.shell_vars) == (
        launch.env, launch.per_node, launch.shell_vars)


def test_only_the_deepspeed_launcher_on_one_node_needs_the_ranks_to_watch_ftl_train() -> None:
    assert not launch_for("cluster.launcher=deepspeed").forwards_stop
    assert launch_for("cluster.launcher=torchrun").forwards_stop
    several = launch_for("cluster=slurm", "cluster.nodes=2", "cluster.launcher=deepspeed")
    assert several.forwards_stop
    # The ranks' env: this process named where no stop is forwarded; an inherited (stale)
    # name dropped where one is, so its end cannot stop this launch's ranks.
    stale = {ENV: Supervisor(socket.gethostname(), 1, 0.0).env()[ENV], "KEEP": "1"}
    assert Supervisor.launch_env(stale, forwards_stop=True) == {"KEEP": "1"}
    named = Supervisor.from_env(Supervisor.launch_env(stale, forwards_stop=False))
    assert named is not None and named.pid == os.getpid() and named.alive()


def test_the_supervisor_named_to_the_ranks_ends_with_its_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        named = Supervisor(socket.gethostname(), child.pid, psutil.Process(child.pid).create_time())
        found = Supervisor.from_env(named.env())
        assert found == named and found.alive()
        # The same pid, started at another time: a recycled pid, not the supervisor.
        assert not Supervisor(named.host, named.pid, named.started - 1.0).alive()
    finally:
        child.kill()
        child.wait()
    assert not named.alive()
    # A rank on another node, or no supervisor named: nothing to watch.
    assert Supervisor.from_env(Supervisor("elsewhere", 1, 0.0).env()) is None
    assert Supervisor.from_env({}) is None and Supervisor.from_env({ENV: "{"}) is None
