"""What one rank sees: versions, GPUs, the shared directories, free space.

The shared-directory checks read back a token rank 0 wrote: a path that exists on every
node is not enough (a node-local disk mounted at the same path has its own, different
contents, and checkpoints written there are lost to the other nodes and to resume).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TOKEN_WAIT_S = 3.0
"""A network filesystem may show a new file to the other nodes a moment late."""


@dataclass
class RankFacts:
    rank: int
    node: int
    host: str
    local_rank: int
    torch: str = ""
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None
    gpus: list[str] = field(default_factory=list)
    """Names of the GPUs this rank's process can see."""
    visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES as this rank has it."""
    output_dir: str = ""
    output_shared: bool = False
    free_bytes: int = 0
    cache_root: str = ""
    cache_shared: bool = False
    data_built: bool = False


def versions() -> dict[str, str | None]:
    import torch

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    nccl = None
    if cuda is not None:
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return {"torch": torch.__version__, "cuda": cuda, "nccl": nccl, "driver": driver()}


def driver() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def token_file(directory: Path, token: str) -> Path:
    return directory / f".ftl-doctor-{token}"


def sees_token(directory: Path, token: str) -> bool:
    """Rank 0's token file in `directory`, with its token inside, within TOKEN_WAIT_S."""
    path = token_file(directory, token)
    deadline = time.monotonic() + TOKEN_WAIT_S
    while True:
        try:
            if path.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def write_token(directory: Path, token: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    token_file(directory, token).write_text(token)
    os.sync()  # what a network filesystem flushes on close anyway; cheap here


def free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0
