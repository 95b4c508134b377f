"""The two errors a user can fix (both end the CLI with exit code 2 and no traceback), and
`flagged`, how a rule lists its problems."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(Exception):
    """One or more configuration problems, each naming the key, the value and the fix."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            super().__init__(f"configuration error: {self.problems[0]}")
        else:
            super().__init__("\n".join([f"{len(self.problems)} configuration errors:",
                                        *(f"  - {problem}" for problem in self.problems)]))


def flagged(checks: Iterable[tuple[object, str]]) -> list[str]:
    """The problems of `checks`, (whether it is wrong, the problem) pairs, that are wrong."""
    return [problem for wrong, problem in checks if wrong]


class DataError(Exception):
    """A dataset that cannot be read or does not have the fields its format needs."""
