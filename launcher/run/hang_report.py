"""Where each rank of a hung run was, one line per rank, from RUN_DIR/hang/ (the ranks'
watchdogs, launcher/rank/watchdog.py), for `ftl train` and `ftl status`: e.g. `rank 1 on
node3: in MyCallback.on_step_end (my/callbacks.py:40) at step 3` or `rank 0 on node1:
waiting in all_reduce (called from launcher/rank/preempt.py:150) at step 3` (`where`).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.rundir import HUNG_EXIT, HangRecord, RunDir

MACHINERY = frozenset({"torch", "transformers", "accelerate", "deepspeed", "launcher", "stdlib"})
"""Top-level packages whose frames are the machinery, not where the user's rank is."""
LAUNCHER_DIR = Path(__file__).resolve().parents[1]
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_STDLIB = re.compile(r"/lib/python3\.\d+/")
_C10D = "torch/distributed/distributed_c10d.py"


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str


def parse_threads(text: str) -> dict[int, list[Frame]]:
    """faulthandler's dump -> thread ident -> its frames, innermost first."""
    threads: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            current = threads.setdefault(int(header.group(1), 16), [])
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return threads


def package_of(path: str) -> str | None:
    """The top-level package a file belongs to when it is installed (site-packages) or is
    this launcher; "stdlib" for the standard library; None for the user's own files."""
    if path.startswith("<"):  # <frozen runpy>, <string>
        return "stdlib"
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1:]
            return rest[0].removesuffix(".py") if rest else None
    if _STDLIB.search(path):
        return "stdlib"
    if Path(path).is_relative_to(LAUNCHER_DIR) or ("launcher" in parts and _is_launcher(parts)):
        return "launcher"
    return None


def _is_launcher(parts: tuple[str, ...]) -> bool:
    """A launcher/ package path from another machine (the run dir's host): launcher/<one
    of its own modules or folders>."""
    index = len(parts) - 1 - parts[::-1].index("launcher")
    return index + 1 < len(parts) and (LAUNCHER_DIR / parts[index + 1]).exists()


def where(frames: list[Frame]) -> str:
    """The main thread's frames (innermost first) -> `in Class.method (path:line)` or
    `waiting in all_reduce (called from path:line)`."""
    if not frames:
        return "no stack of its main thread in the dump"
    user = next((f for f in frames if package_of(f.path) not in MACHINERY), None)
    if user is not None:
        return f"in {qualified_name(user)} ({display_path(user.path)}:{user.line})"
    for index, frame in enumerate(frames):
        if frame.path.endswith(_C10D) and not frame.function.startswith("_"):
            caller = next((f for f in frames[index + 1:] if package_of(f.path) != "torch"),
                          None)
            source = f" (called from {display_path(caller.path)}:{caller.line})" if caller else ""
            return f"waiting in {frame.function}{source}"
    inner = frames[0]
    return f"in {inner.function} ({display_path(inner.path)}:{inner.line})"


def display_path(path: str) -> str:
    """Installed files from their package down; files under the working directory
    relative to it; others as they are."""
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


@functools.lru_cache(maxsize=256)
def qualified_name(frame: Frame) -> str:
    """Class.method for a frame whose source is readable here; else the bare name
    faulthandler gives."""
    try:
        scope: ast.AST = ast.parse(Path(frame.path).read_text())
    except (OSError, SyntaxError, ValueError):
        return frame.function
    names: list[str] = []
    best = frame.function
    while True:  # down through the classes and functions whose lines hold the frame's
        inner = [c for c in ast.iter_child_nodes(scope)
                 if isinstance(c, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                 and c.lineno <= frame.line <= (c.end_lineno or c.lineno)]
        if not inner:
            return best
        scope = inner[0]
        names.append(inner[0].name)
        if inner[0].name == frame.function and not isinstance(inner[0], ast.ClassDef):
            best = ".".join(names)


def rank_line(record: HangRecord, stacks: Path) -> str:
    try:
        threads = parse_threads(stacks.read_text(errors="replace"))
    except OSError:
        place = "its stack file is missing"
    else:
        place = where(threads.get(record.main_thread, []))
    return f"rank {record.rank} on {record.host}: {place} at step {record.step}"


def hang_lines(run_dir: RunDir, world_size: int | None = None) -> list[str]:
    """The summary of a hung run: what ran out, then one line per rank (the ranks without
    a record too, when the world size is known). [] when no rank recorded a hang."""
    records = run_dir.read_hangs()
    if not records:
        return []
    first = min(records, key=lambda r: r.time)
    lines = [f"hung: no progress within {first.bound_s:g} s after step {first.step} "
             f"(hang watchdog, exit {HUNG_EXIT}); every thread's stack: {run_dir.hang}"]
    for record in records:
        lines.append("  " + rank_line(record, run_dir.hang_stacks(record.rank)))
    missing = sorted(set(range(world_size or 0)) - {r.rank for r in records})
    for rank in missing:
        lines.append(f"  rank {rank}: no hang record (ended before its watchdog ran out, or "
                     "its node is gone)")
    return lines

