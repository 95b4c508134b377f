"""Per-rank peak memory as live tensor bytes, per phase of a run.

GPU: torch.cuda's allocator statistics, the peak reset at each phase boundary. CPU: torch
keeps no CPU allocator statistics, so the worker wraps torch's CPU allocator with
COUNTING_ALLOCATOR_SOURCE (compiled once with the system compiler into the cache, loaded
with ctypes; +0.06-0.09 us per allocation measured alone, but ~9 % of the tiny model's
step time in a real run, where a step makes thousands: bench/train_overhead.py). So only
when asked (train.cpu_live_bytes: the memory tests and the demo's test ask).
Why not the profiler, what it does not count (RSS is recorded beside it) and the phases:
docs/evidence/memory.md. Without a compiler the CPU figure is None and only RSS is recorded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launcher.config.compose import cache_home
from launcher.rundir import PlanRecord, RankMetrics, RunDir

COUNTING_ALLOCATOR_SOURCE = r"""
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {
std::mutex mu;
std::unordered_map<void*, size_t> sizes;
int64_t current = 0, peak = 0;
c10::Allocator* base = nullptr;
c10::DeleterFnPtr base_delete = nullptr;

void counted_delete(void* ptr) {
  {
    std::lock_guard<std::mutex> guard(mu);
    auto it = sizes.find(ptr);
    if (it != sizes.end()) {
      current -= static_cast<int64_t>(it->second);
      sizes.erase(it);
    }
  }
  base_delete(ptr);
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base->allocate(n);
    void* ptr = inner.get();
    if (ptr == nullptr) return inner;
    inner.release_context();  // base's context is ptr itself: counted_delete frees it
    {
      std::lock_guard<std::mutex> guard(mu);
      sizes[ptr] = n;
      current += static_cast<int64_t>(n);
      if (current > peak) peak = current;
    }
    return {ptr, ptr, &counted_delete, inner.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
CountingAllocator counting;
}  // namespace

extern "C" {
int ftl_install(void) {
  if (base != nullptr) return 0;
  c10::Allocator* previous = c10::GetCPUAllocator();
  if (previous->raw_deleter() == nullptr) return -1;  // context != data: cannot wrap
  base = previous;
  base_delete = previous->raw_deleter();
  c10::SetCPUAllocator(&counting, 100);
  return c10::GetCPUAllocator() == &counting ? 0 : -2;
}
int64_t ftl_allocated(void) { std::lock_guard<std::mutex> g(mu); return current; }
int64_t ftl_peak(void) { std::lock_guard<std::mutex> g(mu); return peak; }
void ftl_reset_peak(void) { std::lock_guard<std::mutex> g(mu); peak = current; }
}
"""


class MemtraceUnavailable(RuntimeError):
    """The CPU counter cannot be built or installed here (no compiler, foreign allocator)."""


# ---------------------------------------------------------------- the CPU counter


def library_path(torch_dir: Path, torch_version: str) -> Path:
    """Where the compiled counter for this source and this torch lives."""
    key = hashlib.sha256(
        f"{COUNTING_ALLOCATOR_SOURCE}\0{torch_version}\0{torch_dir}".encode()
    ).hexdigest()[:16]
    return cache_home() / "memtrace" / f"counting-{key}.so"


def build_library() -> Path:
    """The counter's shared library: cached, or compiled now into the cache (written under
    a temporary name and renamed, so ranks building at once never load a partial file)."""
    import torch

    torch_dir = Path(torch.__file__).parent
    lib = torch_dir / "lib"
    out = library_path(torch_dir, torch.__version__)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        source, built = Path(tmp) / "counting.cpp", Path(tmp) / "counting.so"
        source.write_text(COUNTING_ALLOCATOR_SOURCE)
        cmd = [os.environ.get("CXX", "c++"), "-O2", "-shared", "-fPIC", "-std=c++17",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
               f"-I{torch_dir / 'include'}", str(source), f"-L{lib}", "-lc10",
               f"-Wl,-rpath,{lib}", "-o", str(built)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MemtraceUnavailable(f"cannot compile the CPU memory counter: {exc}") from exc
        if done.returncode != 0:
            raise MemtraceUnavailable("cannot compile the CPU memory counter:\n"
                                      + done.stderr[-2000:])
        os.replace(built, out)
    return out


@dataclass(frozen=True)
class CpuTracker:
    """The counting allocator, installed as torch's CPU allocator for this process: live
    tensor bytes and their high-water mark since the last reset (as CudaTracker)."""

    lib: ctypes.CDLL

    @classmethod
    def install(cls) -> CpuTracker:
        lib = ctypes.CDLL(str(build_library()))
        lib.ftl_allocated.restype = ctypes.c_int64
        lib.ftl_peak.restype = ctypes.c_int64
        lib.ftl_reset_peak.restype = None
        code = lib.ftl_install()
        if code != 0:
            raise MemtraceUnavailable(f"cannot install the CPU memory counter (code {code})")
        return cls(lib)

    def allocated(self) -> int:
        return int(self.lib.ftl_allocated())

    def peak(self) -> int:
        return int(self.lib.ftl_peak())

    def reserved_peak(self) -> int | None:
        return None

    def reset_peak(self) -> None:
        self.lib.ftl_reset_peak()


class CudaTracker:
    """torch.cuda's own statistics for this rank's GPU (LOCAL_RANK, named explicitly: the
    worker starts tracking before the process group sets the device, and a bare call would
    open a context on GPU 0 in every rank)."""

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise MemtraceUnavailable("no CUDA device")
        # The reads answer 0 before CUDA starts, but reset_peak_memory_stats raises ("did
        # you call init?", torch 2.13): nothing has started CUDA in the rank yet. init()
        # opens no context on any device.
        torch.cuda.init()
        self.cuda = torch.cuda
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

    def allocated(self) -> int:
        return int(self.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(self.cuda.max_memory_allocated(self.device))

    def reserved_peak(self) -> int | None:
        return int(self.cuda.max_memory_reserved(self.device))

    def reset_peak(self) -> None:
        self.cuda.reset_peak_memory_stats(self.device)


# ---------------------------------------------------------------- phases


def rss_peak_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class PhasePeaks:
    """Peak live bytes per named phase: `phase(name)` closes the current phase (its peak
    is kept, the maximum when a name recurs, e.g. every steady-state step) and opens the
    next one with the high-water mark reset to what is live now. `rename(name)` re-labels
    the open phase (the gap after a step becomes "checkpoint" once a save happened in it).
    Without a tracker (none installed, or `problem` says why not) only RSS is recorded."""

    tracker: CpuTracker | CudaTracker | None = None
    problem: str | None = None
    current: str | None = None
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per phase: peak_bytes, rss_peak_bytes (the process's peak RSS at the phase's end:
    RSS has no reset) and, on GPUs, reserved_peak_bytes."""

    def phase(self, name: str | None) -> None:
        if self.tracker is None:
            return
        self._close()
        self.current = name
        self.tracker.reset_peak()

    def rename(self, name: str, only: str | None = None) -> None:
        """Re-label the open phase (when it is `only`, if given)."""
        if self.current is not None and (only is None or self.current == only):
            self.current = name

    def _close(self) -> None:
        if self.current is None or self.tracker is None:
            return
        record = self.phases.setdefault(self.current, {})
        record["peak_bytes"] = max(record.get("peak_bytes", 0), self.tracker.peak())
        record["rss_peak_bytes"] = rss_peak_bytes()
        reserved = self.tracker.reserved_peak()
        if reserved is not None:
            record["reserved_peak_bytes"] = max(record.get("reserved_peak_bytes", 0), reserved)

    def run_peak(self) -> int | None:
        """The highest live bytes since tracking began: every closed phase's peak and the
        open one's. Not the tracker's own figure, which restarts at each phase (each step)."""
        if self.tracker is None:
            return None
        closed = (record["peak_bytes"] for record in self.phases.values())
        return max([self.tracker.peak(), *closed])

    def summary(self) -> dict[str, Any]:
        """Closes the open phase and returns the record for metrics/rank<R>.json."""
        if self.tracker is None:
            return {"peak_bytes": None, "rss_peak_bytes": rss_peak_bytes(), "phases": {},
                    "problem": self.problem}
        self.phase(None)
        phases = {name: dict(record) for name, record in self.phases.items()}
        record: dict[str, Any] = {
            "peak_bytes": max((p["peak_bytes"] for p in phases.values()), default=0),
            "rss_peak_bytes": rss_peak_bytes(), "phases": phases}
        reserved = [p["reserved_peak_bytes"] for p in phases.values() if "reserved_peak_bytes" in p]
        if reserved:
            record["reserved_peak_bytes"] = max(reserved)
        return record


PHASES = PhasePeaks()
"""This process's phases: nothing is measured until `start` installs its tracker."""


def start(on_cpu: bool, count_cpu: bool) -> None:
    """Install this process's tracker and open phase "startup"; when live bytes cannot be
    measured, or on CPU unless `count_cpu` (train.cpu_live_bytes: the counting allocator
    costs every allocation), the run records RSS only and its summary says why."""
    if on_cpu and not count_cpu:
        PHASES.problem = "not counted on CPU ranks unless train.cpu_live_bytes=true"
        return
    try:
        PHASES.tracker = CpuTracker.install() if on_cpu else CudaTracker()
    except MemtraceUnavailable as exc:
        PHASES.problem = str(exc)
        print(f"[ftl] memory: live tensor bytes not measured ({exc})", file=sys.stderr)
        return
    PHASES.phase("startup")


def peak_memory_mib() -> float:
    """The figure every metrics line carries (to 0.1 MiB): on a GPU this rank's peak live
    tensor bytes so far; on CPU (counted or not) its peak resident memory.
    From the phase record, not torch.cuda.max_memory_allocated(): the tracker resets that at
    every phase boundary (each step), and a bare call reads the current device, GPU 0 before
    the process group picks this rank's."""
    live = PHASES.run_peak()
    if live is not None and isinstance(PHASES.tracker, CudaTracker):
        return round(live / 2**20, 1)
    return round(rss_peak_bytes() / 2**20, 1)


def record_memory(trainer: Any, run_dir: RunDir, plan: PlanRecord) -> dict[str, Any]:
    """Every rank, after the final save: its summary into metrics/rank<R>.json ("memory");
    returns result.json's "memory" with every rank's figures (one all_gather_object)."""
    import torch.distributed as dist

    mine = PHASES.summary()
    rank = trainer.args.process_index
    record = run_dir.read_rank_metrics(rank) or RankMetrics(rank)
    run_dir.write_rank_metrics(replace(record, memory=mine))
    ranks = [mine]
    if dist.is_available() and dist.is_initialized():
        ranks = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(ranks, mine)
    predicted = (plan.estimate or {}).get("peak_bytes")  # live tensor bytes
    return {"predicted_peak_bytes": int(predicted) if predicted else None,
            "measured_peak_bytes": [r.get("peak_bytes") for r in ranks],
            "measured_rss_bytes": [r.get("rss_peak_bytes") for r in ranks]}
