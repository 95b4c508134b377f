"""Checks beyond the RunConfig (this machine, its files, earlier launches) for the one
validation stage (launcher/validation/validate.py): each returns problems, never raises."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import asdict
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.compose import SOURCES
from launcher.config.hardware import is_gpu_preset
from launcher.config.schema import NO_SCHEDULER, RunConfig
from launcher.data import mixture
from launcher.data.datascan import scan_file
from launcher.data.formats import FORMATS
from launcher.data.hub import Coordinates, is_hub_id, pinned_revision
from launcher.engines.deepspeed.ops import use_own_build_cache
from launcher.errors import DataError
from launcher.estimator.disk import disk_need
from launcher.estimator.memory import GIB
from launcher.rundir import read_complete_marker
from launcher.rundir.checkpoints import is_complete, latest_in_earlier_runs
from launcher.schedulers.base import DEFAULT_SCHEDULER

if TYPE_CHECKING:
    from launcher.estimator.estimate import Estimate


def local_launch_problems(cfg: RunConfig) -> list[str]:
    """`ftl train` starts the ranks on this machine (deepspeed may reach others by ssh)."""
    cluster, problems = cfg.cluster, []
    if cluster.scheduler != NO_SCHEDULER:
        return [
            f"cluster={cluster.name}: `ftl train` runs on this machine, and this cluster "
            f"uses the {cluster.scheduler} scheduler. Fix: `ftl submit cluster={cluster.name} "
            "...` for a batch job, or cluster=local."
        ]
    # deepspeed without a hostfile is a config rule (rules._multi_node): reported once, there.
    if cluster.nodes > 1 and cluster.launcher != "deepspeed":
        problems.append(
            f"cluster.nodes={cluster.nodes} with cluster={cluster.name}: a local run uses this "
            f"machine only. Fix: cluster.nodes=1, `ftl submit cluster={DEFAULT_SCHEDULER} "
            f"cluster.nodes={cluster.nodes}`, or cluster.launcher=deepspeed with "
            "cluster.hostfile=PATH."
        )
    elif cluster.nodes > 1 and cluster.hostfile:
        problems += hostfile_problems(cluster.hostfile, cluster.nodes)
    if cluster.gpu != "cpu" and shutil.which("nvidia-smi") is None:
        problems.append(
            f"cluster.gpu={cluster.gpu}: this machine has no NVIDIA GPU. Fix: "
            f"cluster.gpu=cpu to train here, or `ftl submit cluster={DEFAULT_SCHEDULER} ...` on a "
            "GPU cluster."
        )
    return problems + missing_sources(cfg) + model_dir_problems(cfg) + unreadable_data(cfg)


def model_dir_problems(cfg: RunConfig) -> list[str]:
    """A local model.path every rank would fail to load: no config.json in it (a hub id, or
    a path not here, is missing_sources' to report)."""
    path = Path(cfg.model.path) if cfg.model.path else None
    if path is None or not path.exists() or (path / "config.json").is_file():
        return []
    return [f"model.path={cfg.model.path}: no config.json in it, so no model loads from it. "
            "Fix: the directory save_pretrained wrote (a run's model/ dir, a downloaded "
            "checkpoint), or a checkpoint saved with whole weights "
            "(strategy.gather_weights_on_save=true)."]


VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_devices(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """(CUDA_VISIBLE_DEVICES for the launch, problems) of a local GPU launch: enough GPUs
    listed for cluster.gpus_per_node, as indices where DeepSpeed's launcher must name them
    (launchers/command.py); (None, []) where it is not set or not a local GPU launch."""
    cluster, value = cfg.cluster, environ.get(VISIBLE_DEVICES)
    if value is None or not is_gpu_preset(cluster.gpu) or cluster.nodes > 1:
        return None, []
    ids = [item.strip() for item in value.split(",") if item.strip()]
    if not ids:
        return None, [f"{VISIBLE_DEVICES}={value!r} hides every GPU from the ranks "
                      f"(cluster.gpu={cluster.gpu}). Fix: unset {VISIBLE_DEVICES}, or list "
                      "the GPUs to train on."]
    if len(ids) < cluster.gpus_per_node:
        return None, [
            f"cluster.gpus_per_node={cluster.gpus_per_node} with {VISIBLE_DEVICES}={value}: "
            f"{len(ids)} GPU(s) visible to the ranks. Fix: cluster.gpus_per_node={len(ids)}, "
            f"or list {cluster.gpus_per_node} GPUs in {VISIBLE_DEVICES} (or unset it)."]
    if cluster.launcher == "deepspeed" and not all(item.isdigit() for item in ids):
        return None, [
            f"cluster.launcher=deepspeed with {VISIBLE_DEVICES}={value}: DeepSpeed's "
            "launcher names GPUs by index (--include localhost:0,1), not by UUID or MIG "
            "name. Fix: "
            f"cluster.launcher=torchrun, or indices in {VISIBLE_DEVICES}."]
    return ",".join(ids), []


FUSED_ADAM_PREBUILT = "ops/adam/fused_adam_op*.so"
"""DeepSpeed installed with DS_BUILD_FUSED_ADAM=1 (its package dir)."""
FUSED_ADAM_BUILT = "fused_adam/fused_adam.so"
"""A JIT build of FusedAdam in the ranks' build cache (engines/deepspeed/ops.py)."""


def fused_adam_problems(cfg: RunConfig, environ: Mapping[str, str],
                        torch_cuda: str | None) -> list[str]:
    """DeepSpeed's FusedAdam (train.optimizer=auto under DeepSpeed on a GPU preset, no
    offload_optimizer: ds_config's optimizer block) is compiled with nvcc at the first step;
    with no CUDA toolkit, or one whose version DeepSpeed will not build with for torch's
    CUDA (`torch_cuda`, None for a CPU torch), and no prebuilt op or earlier build here,
    every rank fails there, after the model was built ("CUDA_HOME does not exist", "Installed
    CUDA version 13.0 does not match the version torch was compiled with 12.8")."""
    strategy = cfg.strategy
    if (not is_gpu_preset(cfg.cluster.gpu) or strategy.backend != "deepspeed"
            or cfg.train.optimizer != "auto" or strategy.offload_optimizer
            or fused_adam_built(environ)):
        return []
    key = f"train.optimizer=auto with strategy={strategy.name} on cluster.gpu={cfg.cluster.gpu}"
    fix = ("Fix: train.optimizer=torch (the Trainer's fused torch AdamW: nothing to "
           "compile), or ")
    compiler, home = nvcc(environ), cuda_home(environ)
    if compiler is None:
        looked = (f"CUDA_HOME={home} holds no bin/nvcc" if home
                  else "no nvcc on PATH or in /usr/local/cuda, CUDA_HOME unset")
        return [f"{key}: DeepSpeed's FusedAdam is compiled with nvcc at the first step, and "
                f"this machine has no CUDA toolkit ({looked}) and no built FusedAdam. "
                f"{fix}install the CUDA toolkit that matches torch's CUDA and set CUDA_HOME."]
    toolkit = nvcc_release(compiler)
    if torch_cuda is None or toolkit is None or builds_across(toolkit, torch_cuda, environ):
        return []
    return [f"{key}: DeepSpeed compiles FusedAdam at the first step with {compiler} (CUDA "
            f"{toolkit}) and refuses to for a torch built with CUDA {torch_cuda}. {fix}"
            f"CUDA_HOME set to a CUDA {torch_cuda.split('.')[0]} toolkit."]


def builds_across(toolkit: str, torch_cuda: str, environ: Mapping[str, str]) -> bool:
    """Whether DeepSpeed 0.19.8 builds an op with this toolkit for this torch
    (op_builder/builder.py assert_no_cuda_mismatch): the same major.minor, or the same
    major among 10-12, whose minors it takes as compatible; DS_SKIP_CUDA_CHECK=1 skips it."""
    mine, theirs = toolkit.split(".")[:2], torch_cuda.split(".")[:2]
    return (mine == theirs or (mine[0] == theirs[0] and mine[0] in ("10", "11", "12"))
            or environ.get("DS_SKIP_CUDA_CHECK") == "1")


def nvcc_release(compiler: Path) -> str | None:
    """`nvcc --version`'s "release X.Y"; None where it does not run or say."""
    try:
        out = subprocess.run([str(compiler), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built with (torch.version.cuda), read from its
    version.py without importing torch; None for a CPU build or no torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda\b[^=]*=\s*['\"]([\d.]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def cuda_home(environ: Mapping[str, str]) -> str | None:
    """The CUDA home the user named (torch reads CUDA_HOME, then CUDA_PATH)."""
    return environ.get("CUDA_HOME") or environ.get("CUDA_PATH")


def nvcc(environ: Mapping[str, str]) -> Path | None:
    """The nvcc a JIT build would use, found as torch finds the CUDA home: CUDA_HOME or
    CUDA_PATH, else nvcc on PATH, else /usr/local/cuda; None where that one is missing."""
    home = cuda_home(environ)
    on_path = shutil.which("nvcc", path=environ.get("PATH", ""))
    compiler = (Path(home) / "bin" / "nvcc" if home else
                Path(on_path) if on_path else Path("/usr/local/cuda/bin/nvcc"))
    return compiler if compiler.is_file() else None


def fused_adam_built(environ: Mapping[str, str]) -> bool:
    """A FusedAdam the ranks can load without compiling: DeepSpeed's prebuilt op, or a JIT
    build in the build cache they use (not imported: `ftl plan` stays light)."""
    spec = importlib.util.find_spec("deepspeed")
    package = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
    if package is not None and any(package.glob(FUSED_ADAM_PREBUILT)):
        return True
    return (use_own_build_cache(dict(environ)) / FUSED_ADAM_BUILT).is_file()


def hostfile_problems(path: str, nodes: int) -> list[str]:
    """A DeepSpeed hostfile: `host slots=N` per line, at least `nodes` hosts."""
    key = f"cluster.hostfile={path}"
    try:
        text = Path(path).read_text()
    except OSError as error:
        return [f"{key}: cannot be read ({error.strerror}). Fix: the path of a hostfile "
                "with one `host slots=N` line per node."]
    lines = [(number, line.split("#", 1)[0].strip())
             for number, line in enumerate(text.splitlines(), start=1)]
    hosts = [(number, line) for number, line in lines if line]
    problems = [
        f"{key}: line {number} {line!r} is not `host slots=N`. Fix: one `host slots=N` per line."
        for number, line in hosts if not re.fullmatch(r"\S+\s+slots=\d+", line)
    ]
    if not problems and len(hosts) < nodes:
        problems.append(f"{key}: lists {len(hosts)} host(s), cluster.nodes={nodes}. "
                        f"Fix: list {nodes} hosts or set cluster.nodes={len(hosts)}.")
    return problems


DATA_SOURCES = ("dataset.path", "dataset.eval_path", "model.tokenizer")
"""What preprocessing reads (model.path only as the tokenizer when model.tokenizer is empty)."""


ELSEWHERE = ("`ftl submit` where the hub is reachable; `ftl plan` shows the plan without "
             "running it")
"""missing_sources' other fix, for a verb that launches."""


def missing_sources(cfg: RunConfig, keys: tuple[str, ...] = SOURCES,
                    elsewhere: str = ELSEWHERE) -> list[str]:
    """Paths that are not on this machine while the hub is unreachable (a hub dataset is
    hub_problems' to resolve from the cache); `elsewhere`: the fix besides a local copy."""
    if "model.tokenizer" in keys and not cfg.model.tokenizer:
        keys = (*keys, "model.path")
    named = [(key, attrgetter(key)(cfg)) for key in dict.fromkeys(keys)]
    if "dataset.path" in keys:
        named = [(key, value) for key, value in named if not (
            key == "dataset.path" and (cfg.dataset.sources or is_hub_id(value)))]
        named += [(f"dataset.sources.{index}.path", source.path)
                  for index, source in enumerate(cfg.dataset.sources)
                  if not is_hub_id(source.path)]
    remote = [(key, value) for key, value in named if value and not Path(value).exists()]
    if not remote or hub_reachable():
        return []
    return [
        f"{key}={value}: not found on this machine, and the HF hub is unreachable from here. "
        f"Fix: download it and set {key}=/local/path, or {elsewhere}."
        for key, value in remote
    ]


def unreadable_data(cfg: RunConfig) -> list[str]:
    """Scan local data files row by row here (streaming, nothing kept), so a bad line fails
    with its file and line number before any rank starts: every source of a mixture in
    its own format."""
    data = cfg.dataset
    files = [("dataset.eval_path", data.eval_path, data.format, data.columns)]
    if data.sources:
        files += [(f"dataset.sources.{index}.path", one.dataset.path, one.dataset.format,
                   one.dataset.columns)
                  for index, one in enumerate(mixture.source_configs(cfg))]
    else:
        files.insert(0, ("dataset.path", data.path, data.format, data.columns))
    problems = []
    for key, path, fmt, columns in files:
        # A missing path is missing_sources' to report; a directory is a saved dataset; a
        # format not in FORMATS is the rules' to report (its rows cannot be judged).
        if path and Path(path).is_file() and fmt in FORMATS:
            scan = scan_file(Path(path), fmt, asdict(columns))
            problems += [f"{key}={path}: {problem}" for problem in scan.problems]
    return problems


def hub_problems(cfg: RunConfig) -> list[str]:
    """Pin each hub dataset of the run (dataset.path, or each source's) to the commit its
    revision resolves to, written into `cfg` (the run dir's config.yaml then records it,
    and every rank and resume loads that commit); what cannot be resolved, as problems."""
    data = cfg.dataset
    entries = ([(f"dataset.sources.{index}", source) for index, source in enumerate(data.sources)]
               if data.sources else [("dataset", data)])
    hub = [(key, entry) for key, entry in entries if is_hub_id(entry.path)]
    if not hub:
        return []
    offline, problems = not hub_reachable(), []
    for key, entry in hub:
        where = Coordinates.of(entry)
        try:
            entry.revision = pinned_revision(entry.path, where, offline)
        except DataError as error:
            problems.append(f"{key}.path={entry.path}: {error}")
    return problems


def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError:
        return False
    return True


def find_resume_from(cfg: RunConfig) -> tuple[Path | None, list[str]]:
    """What a new launch resumes from (run.resume=PATH, or with auto the newest complete
    checkpoint of an earlier unfinished launch of the same run name), and why this run
    cannot load it."""
    resume = cfg.run.resume
    if resume == "never":
        return None, []
    if resume == "auto":
        source = latest_in_earlier_runs(Path(cfg.run.output_dir) / cfg.run.name)
    elif Path(resume).is_dir():
        source = Path(resume).resolve()
    else:
        return None, [
            f"run.resume={resume}: no such checkpoint directory. "
            "Fix: run.resume=auto, run.resume=never, or the path of a checkpoint-N directory."
        ]
    if source is None:
        return None, []
    if not is_complete(source):
        return source, [
            f"run.resume={resume}: {source} has no COMPLETE marker, so its save may not "
            "have finished (e.g. a crash mid-save). Fix: pick an earlier checkpoint of the "
            "run, or run.resume=auto to take the latest complete one."
        ]
    return source, _model_parallel_resume(cfg, source)


def _model_parallel_resume(cfg: RunConfig, checkpoint: Path) -> list[str]:
    """A checkpoint of a tensor- or sequence-parallel run resumes only on its own layout:
    DeepSpeed's universal conversion of AutoTP shards is not supported here, and the
    Ulysses loader's position in the data is not converted (not measured)."""
    marker = read_complete_marker(checkpoint)
    if marker is None:
        return []
    written = (marker.tp, marker.sp, marker.world_size)
    if written == (cfg.parallel.tp, cfg.parallel.sp, cfg.world_size):
        return []
    if written[:2] == (1, 1) == (cfg.parallel.tp, cfg.parallel.sp):
        return []  # another world size without model parallelism: the engines convert it
    return [f"run.resume: {checkpoint} was written with {_layout(*written)}; this run has "
            f"{_layout(cfg.parallel.tp, cfg.parallel.sp, cfg.world_size)}. A tensor- or "
            "sequence-parallel checkpoint resumes only on the same layout. Fix: "
            f"{_layout(*written)}, or run.resume=never."]


def _layout(tp: int, sp: int, world: int) -> str:
    return f"parallel.tp={tp} parallel.sp={sp} on {world} ranks"


def output_checks(cfg: RunConfig, estimate: Estimate | None) -> tuple[list[str], list[str]]:
    """(problems, space risks): run.output_dir can be created and written; and, apart (a
    risk the user may take), its filesystem holds the checkpoints the run keeps plus its
    final model (sizes: launcher/estimator/disk.py)."""
    key = f"run.output_dir={cfg.run.output_dir}"
    base = Path(cfg.run.output_dir).absolute()
    while not base.exists() and base != base.parent:  # the directory it would be made in
        base = base.parent
    if not base.is_dir():
        return [f"{key}: {base} is a file, not a directory. Fix: another run.output_dir."], []
    here = []
    if not os.access(base, os.W_OK | os.X_OK):
        here = [f"{key}: {base} is not writable by this user. Fix: another run.output_dir."]
    if estimate is None:
        return here, []

    need = disk_need(cfg, estimate.params, estimate.trainable_params)
    free = shutil.disk_usage(base).free
    if free >= need.total_bytes:
        return here, []
    at_least = "" if need.exact else "at least "
    return here, [
        f"{key}: {free / GIB:.2f} GiB free on its filesystem ({base}); the run needs "
        f"{at_least}{need.total_bytes / GIB:.2f} GiB: "
        f"{need.checkpoints} checkpoint(s) of {need.checkpoint_bytes / GIB:.2f} GiB "
        f"(train.save_total_limit={cfg.train.save_total_limit}) and the final model, "
        f"{need.final_model_bytes / GIB:.2f} GiB. Fix: free space, another run.output_dir"
        + (" or " if cfg.run.force else ", ") + "fewer kept checkpoints (train.save_total_limit=2)"
        + ("." if cfg.run.force else ", or run.force=true to try anyway.")
    ]


def host_memory_problems(cfg: RunConfig, estimate: Estimate | None) -> list[str]:
    """With offload and cluster.host_memory_gib unset, this machine's RAM holds the states."""
    row = estimate.row(cfg.strategy.name) if estimate is not None else None
    if row is None or row.host_bytes <= 0 or cfg.cluster.host_memory_gib > 0:
        return []
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if row.host_bytes <= total:
        return []

    return [
        f"strategy={cfg.strategy.name}: the offloaded states need {row.host_bytes / GIB:.1f} "
        f"GiB of host RAM, this machine has {total / GIB:.1f} GiB. Fix: a strategy without "
        "offload that fits (`ftl estimate`), more nodes, or peft=lora."
    ]
