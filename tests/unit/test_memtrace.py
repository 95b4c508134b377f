"""The per-rank memory measurement: the CPU counting allocator and the phase bookkeeping."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from launcher.rank import memtrace
from launcher.rank.memtrace import CpuTracker, MemtraceUnavailable, PhasePeaks

MIB = 2**20


@pytest.fixture(scope="module")
def tracker() -> CpuTracker:
    """One install per test process (the allocator is process-wide, as in a rank)."""
    return CpuTracker.install()


def test_live_bytes_are_exactly_the_tensors_bytes(tracker: CpuTracker) -> None:
    before = tracker.allocated()
    a = torch.empty(1000, dtype=torch.float32)
    b = torch.empty(3, 5, dtype=torch.float64)
    assert tracker.allocated() - before == 4000 + 120
    del a
    assert tracker.allocated() - before == 120
    del b
    assert tracker.allocated() == before


def test_peak_is_the_high_water_mark_since_reset(tracker: CpuTracker) -> None:
    tracker.reset_peak()
    base = tracker.allocated()
    assert tracker.peak() == base
    for _ in range(3):  # 3 x 8 MiB, never more than one alive
        x = torch.ones(2 * MIB, dtype=torch.float32)
        del x
    y = torch.ones(MIB, dtype=torch.float32)
    assert tracker.peak() - base == 8 * MIB
    assert tracker.allocated() - base == 4 * MIB
    tracker.reset_peak()
    assert tracker.peak() == tracker.allocated()
    del y


def test_views_share_and_resize_replaces_the_storage(tracker: CpuTracker) -> None:
    base = tracker.allocated()
    x = torch.empty(256, 256)
    views = [x[1:], x.t(), x.view(-1)]
    assert tracker.allocated() - base == 256 * 256 * 4
    x.resize_(512, 512)
    assert tracker.allocated() - base == 512 * 512 * 4
    del x, views
    assert tracker.allocated() == base


def test_autograd_saved_tensors_and_grads_are_counted(tracker: CpuTracker) -> None:
    """What no walk over Python objects sees: tensors autograd keeps for backward."""
    w = torch.randn(512, 512, requires_grad=True)  # 1 MiB
    base = tracker.allocated()
    hidden = (w @ w).relu()  # the matmul output is freed into relu's, which is saved
    after_forward = tracker.allocated() - base
    assert after_forward == MIB  # relu's output, held by the graph and by `hidden`
    tracker.reset_peak()
    hidden.sum().backward()
    assert w.grad is not None and tracker.allocated() - base >= MIB + MIB  # + w.grad
    # backward's temporaries came and went: relu's grad and matmul's two products for w
    # (1 MiB each) were alive together beside relu's saved output
    assert tracker.peak() - base >= 4 * MIB
    assert tracker.peak() - tracker.allocated() >= 2 * MIB
    del hidden


def test_other_threads_allocations_count(tracker: CpuTracker) -> None:
    base = tracker.allocated()
    kept: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: kept.append(torch.empty(MIB, dtype=torch.uint8)))
    thread.start()
    thread.join()
    assert tracker.allocated() - base == MIB
    kept.clear()
    assert tracker.allocated() == base


def test_install_twice_is_one_counter(tracker: CpuTracker) -> None:
    again = CpuTracker.install()
    base = again.allocated()
    x = torch.empty(100, dtype=torch.uint8)
    assert again.allocated() - base == 100 and tracker.allocated() == again.allocated()
    del x


class FakeTracker:
    def __init__(self) -> None:
        self.now = 0
        self.high = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.high = max(self.high, self.now)

    def allocated(self) -> int:
        return self.now

    def peak(self) -> int:
        return self.high

    def reserved_peak(self) -> int | None:
        return None

    def reset_peak(self) -> None:
        self.high = self.now


def test_phases_keep_each_phases_peak_and_the_max_of_a_recurring_one() -> None:
    fake = FakeTracker()
    phases = PhasePeaks(fake)
    phases.phase("model")
    fake.alloc(100)
    fake.alloc(-40)
    phases.phase("steady")
    fake.alloc(30)
    fake.alloc(-30)
    phases.phase("after_step")
    phases.rename("checkpoint")
    fake.alloc(500)
    fake.alloc(-500)
    phases.phase("steady")
    fake.alloc(10)
    # What each metrics line reports: the run's peak so far, though the tracker's own
    # high-water mark restarted at the last phase (it is 70 now)
    assert fake.peak() == 70 and phases.run_peak() == 560
    record = phases.summary()
    assert {k: v["peak_bytes"] for k, v in record["phases"].items()} == {
        "model": 100, "steady": 90, "checkpoint": 560}
    assert record["peak_bytes"] == 560
    assert record["rss_peak_bytes"] > 0


def test_a_real_tracker_through_phases(tracker: CpuTracker) -> None:
    phases = PhasePeaks(tracker)
    phases.phase("a")
    base = tracker.allocated()
    x = torch.empty(MIB, dtype=torch.uint8)
    del x
    phases.phase("b")
    record = phases.summary()
    assert record["phases"]["a"]["peak_bytes"] - base == MIB
    assert record["phases"]["b"]["peak_bytes"] == base


def test_without_a_compiler_it_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(MemtraceUnavailable, match="cannot compile"):
        memtrace.build_library()
    assert not list((tmp_path / "memtrace").glob("*.so"))


def test_the_library_is_cached_per_source_and_torch(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTL_CACHE_DIR", str(tmp_path))
    one = memtrace.library_path(Path("/t"), "2.13.0")
    assert one == memtrace.library_path(Path("/t"), "2.13.0")
    assert one != memtrace.library_path(Path("/t"), "2.14.0")
    assert one.parent == tmp_path / "memtrace"


def test_cpu_ranks_count_nothing_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """train.cpu_live_bytes=false (the default): no counting allocator (it costs every
    allocation), RSS only, and the summary says why."""
    from launcher.rank import memtrace

    monkeypatch.setattr(memtrace, "PHASES", PhasePeaks())
    monkeypatch.setattr(memtrace.CpuTracker, "install",
                        lambda: pytest.fail("the counting allocator was installed"))
    memtrace.start(on_cpu=True, count_cpu=False)
    summary = memtrace.PHASES.summary()
    assert summary["peak_bytes"] is None and summary["rss_peak_bytes"] > 0
    assert "train.cpu_live_bytes=true" in summary["problem"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_harness_loglikelihood_holds_what_the_inference_line_counts(
        tracker: CpuTracker, dtype: torch.dtype) -> None:
    """lm-eval's loglikelihood forward, `F.log_softmax(model(batch).logits)` in the logits'
    dtype: INFERENCE_LOGITS_BYTES_PER_ELEMENT per logit (the logits and their log-softmax),
    a vocabulary large enough that the model's K/V and activations add under 1 %
    (docs/evidence/memory.md section 14)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from launcher.estimator.memory import INFERENCE_LOGITS_BYTES_PER_ELEMENT

    vocab, shape = 32000, (2, 256)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=vocab)).to(dtype).eval()
    batch = torch.randint(0, vocab, shape)
    with torch.no_grad():
        before = tracker.allocated()
        tracker.reset_peak()
        scores = torch.nn.functional.log_softmax(model(batch).logits, dim=-1)
        per_element = (tracker.peak() - before) / (shape[0] * shape[1] * vocab)
    assert scores.dtype == dtype
    p = 2 if dtype == torch.bfloat16 else 4
    assert per_element == pytest.approx(INFERENCE_LOGITS_BYTES_PER_ELEMENT[p], rel=0.01)
