"""The hang watchdog: a rank without progress within its bound writes where it is
(RUN_DIR/hang/) and ends with HUNG_EXIT instead of waiting in a collective until torch's
own timeout (docs/design.md, "The ranks"). The main thread may be blocked in a
C++ collective, so the watchdog's thread exits the process itself. Per step a rank pays
one `beat`: storing a float.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.rundir import HANG, HUNG_EXIT, HangRecord, RunDir

PEER_GRACE_S = 10.0
"""How long a rank whose watchdog ran out waits for the other ranks' records."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800
"""The Trainer's own ddp_timeout (TrainingArguments), the collectives' timeout."""


def collective_timeout_s(hang_timeout_s: float, first_step_timeout_s: float) -> int:
    """The process group's timeout (TrainingArguments.ddp_timeout): 300 s after the
    watchdog's bounds, so a rank waiting in a collective for a hung peer is still there
    (its stack says so) when the watchdog runs out; the Trainer's default without one."""
    if hang_timeout_s <= 0:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    bound = max(hang_timeout_s, first_step_timeout_s)
    return int(max(DEFAULT_COLLECTIVE_TIMEOUT_S, bound + 300))


class Watchdog:
    """One rank's watchdog thread. `beat(step)` after an optimizer step, `beat()` after
    other progress; `stop()` at train end."""

    def __init__(self, run_dir: RunDir, rank: int, world_size: int, step_bound_s: float,
                 first_bound_s: float, *, clock: Callable[[], float] = time.monotonic,
                 cleanup: Callable[[], None] | None = None) -> None:
        self.run_dir = run_dir
        self.rank, self.world_size = rank, world_size
        self.step_bound_s, self.first_bound_s = step_bound_s, first_bound_s
        self.clock = clock
        self.cleanup = cleanup
        self.step = 0
        self.stepped = False
        self.last = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ftl-hang-watchdog",
                                        daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self, step: int | None = None) -> None:
        self.last = self.clock()
        if step is not None:
            self.step, self.stepped = step, True

    def bound_s(self) -> float:
        return self.step_bound_s if self.stepped else self.first_bound_s

    def _run(self) -> None:
        poll_s = min(5.0, max(0.1, self.step_bound_s / 20))  # how late a firing may come
        while not self._stop.wait(poll_s):
            waited = self.clock() - self.last
            if waited >= self.bound_s() and not self._stop.is_set():
                self.fire(waited)
                return

    def fire(self, waited: float) -> None:
        """Stacks, flight recorder, record; the peers' records (bounded); exit. A run dir
        that cannot be written (a full disk) gets the stacks on stderr instead: the rank
        still ends."""
        try:
            where = self.write(waited)
        except OSError as err:
            where = f"stderr (RUN_DIR/{HANG}: {err})"
            faulthandler.dump_traceback(sys.stderr, all_threads=True)
        print(f"[ftl] rank {self.rank}: no progress for {waited:.0f} s (bound "
              f"{self.bound_s():g} s) after step {self.step}: hang watchdog; stacks in "
              f"{where}; exiting {HUNG_EXIT}", file=sys.stderr, flush=True)
        deadline = self.clock() + PEER_GRACE_S  # the first rank to exit ends the others
        while len(self.run_dir.read_hangs()) < self.world_size and self.clock() < deadline:
            time.sleep(0.05)
        if self.cleanup is not None:
            self.cleanup()
        exit_now(HUNG_EXIT)

    def write(self, waited: float) -> str:
        """hang/rank-<R>.txt, the flight recorder, then rank-<R>.json (last: its presence
        tells the peers and `ftl train` that the rest is there); returns the stacks' path."""
        files = self.run_dir
        files.hang.mkdir(parents=True, exist_ok=True)
        with files.hang_stacks(self.rank).open("w") as out:
            faulthandler.dump_traceback(out, all_threads=True)
        recorder = dump_flight_recorder(files.flight_recorder_file(self.rank))
        files.write_hang(HangRecord(self.rank, socket.gethostname(), os.getpid(), self.step,
                                    round(waited, 3), self.bound_s(), time.time(),
                                    threading.main_thread().ident or 0, recorder))
        return str(files.hang_stacks(self.rank))


def dump_flight_recorder(path: Path) -> str | None:
    """torch's NCCL flight recorder (the collectives each rank entered, in flight or done)
    as JSON, when this rank has an NCCL process group that recorded; else None. Guarded:
    a private torch API. NCCL records into a recorder of its own, which only
    _dump_nccl_trace_json reads (CUDA builds of torch 2.13; _dump_fr_trace_json reads the
    one gloo writes), and FSDP's group is "cuda:nccl,cpu:gloo"."""
    if "torch" not in sys.modules:
        return None  # no torch, no process group
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) \
                or "nccl" not in str(dist.get_backend()):
            return None
        from torch._C import _distributed_c10d

        path.write_bytes(_distributed_c10d._dump_nccl_trace_json(True, False))
    except Exception as err:  # noqa: BLE001 - the stacks matter more than this extra
        print(f"[ftl] flight recorder not dumped: {err!r}", file=sys.stderr, flush=True)
        return None
    return path.name


def start_watchdog(run_dir: RunDir, hang_timeout_s: float, first_step_timeout_s: float,
                   on_gpu: bool, cleanup: Callable[[], None] | None = None) -> Watchdog | None:
    """The rank's watchdog, running from now on (None when train.hang_timeout_s <= 0); on
    GPUs it turns on the NCCL flight recorder, read when the process group is created.
    `cleanup` runs just before the exit (os._exit skips the worker's finally)."""
    if hang_timeout_s <= 0:
        return None
    if on_gpu and not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & set(os.environ):
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"  # the ring's entries
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Watchdog(run_dir, rank, world_size, hang_timeout_s, first_step_timeout_s,
                    cleanup=cleanup).start()


def exit_now(code: int) -> None:
    """Leave without interpreter teardown, from any thread (not logging.shutdown: from
    the watchdog's thread a lock the main thread holds would hang it too)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
