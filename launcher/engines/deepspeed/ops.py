"""DeepSpeed's JIT-built ops: one build cache per environment, built by the environment's own
ninja once (`make ops`: `python -m launcher.engines.deepspeed.ops`), and never waited on forever:
a killed build leaves its `<dir>/<op>/lock` (torch's FileBaton: no owner recorded) for
every later build to wait on, so a rank checks first (`check_build_locks`) and stops with
the file and the fix. Why, and the rebuilds measured without this: docs/evidence/stack.md.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, MutableMapping
from pathlib import Path

ENV = "TORCH_EXTENSIONS_DIR"
CPU_OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")
"""The DeepSpeed op builders a CPU machine loads: the shared-memory all-reduce (every
DeepSpeed run) and DeepSpeedCPUAdam (a GPU preset's offload_optimizer file). Not FusedAdam:
on CPU only a GPU-preset file without offload asks for it, and its CPU build is no GPU's."""
STALE_LOCK_S = 300.0
"""A build lock this old with no build running on this host is taken for a killed build's
(building an op takes ~1 min on 2 cores; another node's build cannot be seen from here)."""


def use_own_build_cache(environ: MutableMapping[str, str] | None = None,
                        prefix: str = sys.prefix) -> Path:
    """Point torch's JIT builds at the user's TORCH_EXTENSIONS_DIR, else this environment's
    own build cache, built by its own ninja (before DeepSpeed builds or loads an op). The
    environment is read at the call: datasets' multi-process map replaces os.environ."""
    environ = os.environ if environ is None else environ
    directory = Path(environ.get(ENV) or Path(prefix) / "torch_extensions")
    environ.setdefault(ENV, str(directory))
    # torch runs whichever ninja PATH finds first, and two versions (the environment's, the
    # system's) each rebuild every object of the other's builds (docs/evidence/stack.md)
    bin_dir = Path(prefix) / "bin"
    path = environ.get("PATH", "")
    if (bin_dir / "ninja").is_file() and path.split(os.pathsep)[0] != str(bin_dir):
        environ["PATH"] = os.pathsep.join(filter(None, [str(bin_dir), path]))
    return directory


def stale_locks(root: Path, now: float | None = None,
                building: Iterable[Path] | None = None) -> list[Path]:
    """The `<root>/<op>/lock` files older than STALE_LOCK_S whose op nobody on this host is
    building (a running build's compiler runs with its cwd in the op's directory)."""
    now = time.time() if now is None else now
    old = []
    for lock in sorted(root.glob("*/lock")):
        try:
            if now - lock.stat().st_mtime > STALE_LOCK_S:
                old.append(lock)
        except OSError:
            continue  # the build just finished
    if not old:  # every DeepSpeed rank asks at start-up: processes are read only when it matters
        return []
    if building is None:  # the working directories of this host's processes we may read
        import psutil

        building = [Path(p.info["cwd"]) for p in psutil.process_iter(["cwd"]) if p.info["cwd"]]
    busy = {p.resolve() for p in building}
    return [lock for lock in old if lock.parent.resolve() not in busy]


class StaleBuildLock(RuntimeError):
    """A build lock no build holds any more."""


def check_build_locks(root: Path) -> None:
    """StaleBuildLock naming each stale build lock and the fix, instead of a silent wait."""
    stale = stale_locks(root)
    if not stale:
        return
    names = ", ".join(str(lock) for lock in stale)
    raise StaleBuildLock(
        f"DeepSpeed op build lock(s) left behind by a killed build: {names} (older than "
        f"{STALE_LOCK_S:.0f} s, no build running on this host); every run would wait for "
        f"them forever. Fix: make sure no build of that op runs on another node, then remove "
        f"them (rm {' '.join(str(lock) for lock in stale)}) and launch again"
    )


def prebuild() -> list[str]:
    """Build (or find built) the ops CPU runs load, in this environment's build cache, so no
    run pays the build; nothing on an accelerator other than the CPU."""
    directory = use_own_build_cache()
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return []
    check_build_locks(directory)
    built = []
    for name in CPU_OPS:
        builder = accelerator.create_op_builder(name)
        if builder is not None and builder.is_compatible():
            builder.load(verbose=False)
            built.append(builder.name)
    return built


if __name__ == "__main__":
    started = time.time()
    ops = prebuild()
    print(f"DeepSpeed ops in {os.environ[ENV]}: {', '.join(ops) or 'none (not a CPU build)'} "
          f"({time.time() - started:.0f} s)")
