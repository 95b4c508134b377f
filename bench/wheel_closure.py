"""What a GPU machine without a package registry needs from this venv, for
bench/gpu_wheelhouse.sh: ftlaunch's run-time requirements with EXTRAS, followed through
every installed dependency, as NAME==VERSION (the versions the tests ran), less the CUDA
stack the machine brings (torch, triton, nvidia-*) and less what HAVE says it holds.

    python bench/wheel_closure.py [--extras eval,qlora] [--have FILE]

HAVE: the target's packages, one per line, `pip list --format=freeze` there (NAME==VERSION)
or bare names where the version is not known. A package it holds is left out when every
requirement met on the way accepts its version there; at a version not known, only a
package ftlaunch does not require itself (its own need pyproject.toml's ranges checked:
transformers older than 5.23 fails every run, so a name alone is not enough). Run with the
venv's python: it reads that environment's metadata.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "ftlaunch"
MACHINE_STACK = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
"""The GPU machine's own: its CUDA torch and what that wheel pins."""


def closure(extras: set[str]) -> tuple[dict[str, str], dict[str, list[Requirement]], set[str]]:
    """name -> installed version of every requirement reachable from the project with
    `extras`; name -> every requirement on it met on the way; the project's own names."""
    found: dict[str, str] = {}
    asked: dict[str, list[Requirement]] = {}
    direct: set[str] = set()
    todo = [(Requirement(text), extras, True)
            for text in distribution(PROJECT).requires or []]
    while todo:
        req, active, is_direct = todo.pop()
        env = [{"extra": extra} for extra in active or {""}]
        if req.marker and not any(req.marker.evaluate(e) for e in env):
            continue
        name = canonicalize_name(req.name)
        asked.setdefault(name, []).append(req)
        if is_direct:
            direct.add(name)
        if name in found or MACHINE_STACK.match(name):
            continue
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            sys.exit(f"wheel_closure: {req.name} ({req}) is not installed in {sys.prefix}")
        found[name] = dist.version
        todo += [(Requirement(text), set(req.extras), False) for text in dist.requires or []]
    return found, asked, direct


def read_have(path: Path) -> dict[str, str | None]:
    have: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            have[canonicalize_name(name)] = version.strip() or None
    return have


def wanted(found: dict[str, str], asked: dict[str, list[Requirement]], direct: set[str],
           have: dict[str, str | None]) -> list[str]:
    """Each package to carry: not on the target, or there at a version some requirement
    on it refuses, or a direct requirement at a version not known."""
    out = []
    for name, version in sorted(found.items()):
        if name in have:
            there = have[name]
            if there is None and name not in direct:
                continue
            if there is not None and all(req.specifier.contains(there, prereleases=True)
                                         for req in asked[name]):
                continue
        out.append(f"{name}=={version}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extras", default="eval")
    parser.add_argument("--have", type=Path)
    args = parser.parse_args()
    extras = {e for e in args.extras.split(",") if e}
    found, asked, direct = closure(extras)
    have = read_have(args.have) if args.have else {}
    print("\n".join(wanted(found, asked, direct, have)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
