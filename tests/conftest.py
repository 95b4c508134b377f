"""Suite-wide rule: under CI (CI=true) a skipped test fails the run. A skip there means a
dependency or service that CI must provide is missing, and that is a defect, not a pass."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if os.environ.get("CI") and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {len(skipped)} test(s) skipped; a skip in CI is a failure",
                            red=True)
        session.exitstatus = 1


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """tmpfs(size) -> a real small filesystem (e.g. "1m"), unmounted after the test.
    Mounting needs root: CI runs as root (and fails on the skip elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounts)}"
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                       check=True)
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", str(point)], check=True)


@pytest.fixture
def site_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """site_strategy(yaml) -> a copy of configs/ with one more strategy YAML (named by its
    `name:`), used through FTL_CONFIG_DIR as a site's own config tree would be."""
    from launcher.config.compose import config_dir

    def add(text: str) -> Path:
        site = tmp_path / "configs"
        if not site.exists():
            shutil.copytree(config_dir(), site)
        name = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("name:"))
        (site / "strategy" / f"{name}.yaml").write_text(text)
        monkeypatch.setenv("FTL_CONFIG_DIR", str(site))
        return site

    return add
