"""Suite-wide rule: under CI (CI=true) a skipped test fails the run. A skip there means a
dependency or service that CI must provide is missing, and that is a defect, not a pass."""

from __future__ import annotations

import os

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if os.environ.get("CI") and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {len(skipped)} test(s) skipped; a skip in CI is a failure",
                            red=True)
        session.exitstatus = 1
