"""launcher/engines/deepspeed/ops.py: DeepSpeed's op builds in the environment's own cache, and a
killed build's lock reported instead of waited on."""

from __future__ import annotations

import os

import pytest

from launcher.engines.deepspeed import ops


def test_build_cache_is_the_environments_own_unless_the_user_set_one(tmp_path) -> None:
    import sys
    from pathlib import Path

    env: dict[str, str] = {}
    assert ops.use_own_build_cache(env) == Path(sys.prefix) / "torch_extensions"
    assert env[ops.ENV] == str(Path(sys.prefix) / "torch_extensions")
    assert ops.use_own_build_cache({}, prefix="/venv") == Path("/venv/torch_extensions")
    mine = {ops.ENV: str(tmp_path)}
    assert ops.use_own_build_cache(mine) == tmp_path
    assert mine[ops.ENV] == str(tmp_path)


def lock(root, op: str, age_s: float, now: float):
    path = root / op / "lock"
    path.parent.mkdir(parents=True)
    path.touch()
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_only_old_locks_of_ops_nobody_builds_are_stale(tmp_path) -> None:
    now = 1_000_000.0
    old = lock(tmp_path, "cpu_adam", 3600, now)
    lock(tmp_path, "fused_adam", 10, now)  # a build that just started
    building = lock(tmp_path, "deepspeed_shm_comm", 3600, now)  # slow, but running here
    found = ops.stale_locks(tmp_path, now, building=[building.parent])
    assert found == [old]


def test_a_stale_lock_stops_with_the_file_and_the_fix(tmp_path) -> None:
    path = lock(tmp_path, "deepspeed_shm_comm", 3600, __import__("time").time())
    with pytest.raises(ops.StaleBuildLock, match=f"rm {path}"):
        ops.check_build_locks(tmp_path)
    path.unlink()
    ops.check_build_locks(tmp_path)  # nothing left: no error


def test_builds_run_the_environments_own_ninja(tmp_path) -> None:
    """Two ninja versions take each other's build log for an unknown build and rebuild the
    op from scratch: the environment's ninja comes first on PATH for every build."""
    (tmp_path / "bin").mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin"}
    ops.use_own_build_cache(env, prefix=str(tmp_path))
    assert env["PATH"] == "/usr/local/bin:/usr/bin"  # no ninja of its own: PATH as it was
    (tmp_path / "bin" / "ninja").touch()
    ops.use_own_build_cache(env, prefix=str(tmp_path))
    ops.use_own_build_cache(env, prefix=str(tmp_path))  # once, however often called
    assert env["PATH"] == f"{tmp_path / 'bin'}:/usr/local/bin:/usr/bin"
