"""Where each strategy's per-rank peak memory goes: live tensor bytes, measured, beside the
estimator's terms.

Per strategy, one `ftl train` run on 2 CPU ranks (the ~102M Llama built from config: hidden
1024, 8 layers, intermediate 2752; fp32; micro batch 2 x 64 tokens of synthetic text, every
row longer than max_length; STEPS steps; a checkpoint at the last step) records:
- per phase, every rank's peak live tensor bytes (launcher/rank/memtrace.py: the counting CPU
  allocator, installed with train.cpu_live_bytes=true; metrics/rank<R>.json "memory") and
  peak RSS;
- inside step AT_STEP (a steady-state step), with `Breakdown` injected through
  `train.callbacks`: live bytes when the step begins, when the model's forward returns,
  when the wrapped torch optimizer's step() begins and ends, and the high-water mark since
  the step began at each of those moments; at step begin and optimizer pre-step, the live
  bytes split into model parameters (with ZeRO-3's partitions and FSDP's local shards),
  their .grad, the torch optimizer's states, the optimizer's own parameters that are not the model's
  (DeepSpeed's fp32 partitions, with their .grad), other tensors reachable from Python
  (engine buffers) and the rest, held only by C++ (autograd's saved tensors, DDP's reducer
  buckets).
The table puts those beside launcher/estimator/memory.py's figures for the same run.

Run: `.venv/bin/python bench/memory_breakdown.py [--strategies ddp zero1 ...] [--keep DIR]`
(one run at a time, ~1.5-3 min each on 2 cores). Writes bench/results/memory_breakdown.json
and prints the table (docs/evidence/memory.md holds a copy and what it means). LoRA runs:
`--extra peft=lora --out bench/results/memory_breakdown_lora.json` (section 12 there; the
est_params/grads/optimizer parts stay full fine-tuning's accounting, est_moments is peak.py's).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
STEPS = 4
AT_STEP = 3
MODEL = ["model.hidden_size=1024", "model.num_layers=8", "model.intermediate_size=2752"]
OVERRIDES = [*MODEL, "train.micro_batch_size=2", "dataset.max_length=64",
             f"train.max_steps={STEPS}", "train.eval_steps=0",
             "train.eval_on_start=false", f"train.save_steps={STEPS}", "train.logging_steps=1",
             "dataset.format=text", "dataset.eval_path=", "dataset.eval_fraction=0.02",
             "cluster.gpus_per_node=2", "train.show_examples=0", "train.cpu_live_bytes=true"]
"""Every row of the synthetic data is longer than max_length, so every micro batch is
exactly micro_batch_size x max_length tokens (the bundled arith rows average 31 tokens)."""
GIB = 2**30


# ---------------------------------------------------------------- in the ranks


def storage_of(tensor: Any) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage; DTensors by their local shard."""
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        tensor = local
    try:
        if tensor.device.type == "meta":
            return None
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
    except Exception:  # noqa: BLE001 - freed or wrapper storages
        return None
    return (pointer, storage.nbytes()) if pointer else None


def innermost_optimizer(optimizer: Any) -> Any:
    while getattr(optimizer, "optimizer", None) is not None:  # accelerate / ZeRO wrappers
        optimizer = optimizer.optimizer
    return optimizer


def categories(model: Any, optimizer: Any) -> dict[str, int]:
    """Live tensor bytes reachable from Python, by what holds them (first match wins)."""
    import torch

    owners: dict[int, str] = {}

    def claim(tensor: Any, kind: str) -> None:
        found = storage_of(tensor) if tensor is not None else None
        if found is not None:
            owners.setdefault(found[0], kind)

    params = list(model.parameters())
    for p in params:
        claim(getattr(p, "ds_tensor", None), "params")
        claim(p, "params")
    for p in params:
        claim(p.grad, "grads")
    inner = innermost_optimizer(optimizer) if optimizer is not None else None
    if inner is not None:
        for state in inner.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    claim(value, "optimizer_states")
        for group in inner.param_groups:
            for p in group["params"]:
                claim(p, "master_params")
                claim(p.grad, "master_grads")
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor):
            continue
        found = storage_of(obj)
        if found is None or found[0] in seen:
            continue
        seen.add(found[0])
        kind = owners.get(found[0], "other_visible")
        sizes[kind] = sizes.get(kind, 0) + found[1]
    return sizes


def allocation_events(prof: Any) -> list[tuple[int, int, int, str]]:
    """(time ns, pointer, +-bytes, "root op / allocating op") of every CPU allocation and
    free the profiler saw, in time order."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int, str]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] != _EventType.Allocation:
            continue
        chain, parent = [], node.parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.parent
        label = f"{chain[-1][:60]} / {chain[0][:40]}" if chain else "?"
        fields = node.extra_fields
        events.append((node.start_time_ns, fields.ptr, fields.alloc_size, label))
    return sorted(events)


def live_at_peak(events: list[tuple[int, int, int, str]]) -> dict[str, Any]:
    """Replay the window: its own allocations alive at the window's high-water mark, by
    what allocated them (tensors from before the window are not in the profile)."""
    live: dict[int, tuple[int, str]] = {}
    now = peak = peak_index = 0
    for index, (_, pointer, size, label) in enumerate(events):
        if size > 0:
            live[pointer] = (size, label)
            now += size
        elif pointer in live:
            now -= live.pop(pointer)[0]
        if now > peak:
            peak, peak_index = now, index
    live.clear()
    for _, pointer, size, label in events[:peak_index + 1]:
        if size > 0:
            live[pointer] = (size, label)
        else:
            live.pop(pointer, None)
    groups: dict[str, int] = {}
    for size, label in live.values():
        groups[label] = groups.get(label, 0) + size
    top = sorted(groups.items(), key=lambda kv: -kv[1])[:12]
    return {"window_peak": peak, "live_at_peak": dict(top)}


class Breakdown(TrainerCallback):
    """Live bytes and high-water marks at the moments of step `at_step` (see the module
    doc); writes OUT/breakdown-rank<R>.json. Bench-only: it walks the heap twice."""

    def __init__(self, out: str, at_step: int = AT_STEP, profile: bool = False) -> None:
        self.out = Path(out)
        self.profile = profile
        self.profiler: Any = None
        self.attribution: dict[str, Any] = {}
        self.save_attribution: dict[str, Any] = {}
        self.at_step = at_step
        self.step = 0
        self.moments: dict[str, Any] = {}
        self.model: Any = None
        self.optimizer: Any = None

    def _tracker(self) -> Any:
        from launcher.rank import memtrace

        return memtrace.PHASES.tracker

    def _moment(self, name: str, split: bool = False) -> None:
        tracker = self._tracker()
        if tracker is None or self.step != self.at_step:
            return
        record: dict[str, Any] = {"allocated": tracker.allocated(), "peak": tracker.peak()}
        if split:
            parts = categories(self.model, self.optimizer)
            parts["cpp_only"] = record["allocated"] - sum(parts.values())
            record["parts"] = parts
        self.moments[name] = record

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: Any = None, optimizer: Any = None,
                       **kw: Any) -> None:
        self.model, self.optimizer = model, optimizer
        model.register_forward_hook(self._forward_end, with_kwargs=True)
        inner = innermost_optimizer(optimizer)
        inner.register_step_pre_hook(lambda *a: self._moment("optimizer_begin", split=True))
        inner.register_step_post_hook(lambda *a: self._moment("optimizer_end"))

    def _forward_end(self, module: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        if not module.training:
            return
        self._moment("forward_end")
        ids = kwargs.get("input_ids")
        if ids is not None and "forward_end" in self.moments:
            self.moments["forward_end"]["input_shape"] = list(ids.shape)

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.profiler.__enter__()

    def _stop_profiler(self) -> Any:
        """Close the open profile; what was alive at its high-water mark."""
        self.profiler.__exit__(None, None, None)
        attribution = live_at_peak(allocation_events(self.profiler))
        self.profiler = None
        return attribution

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kw: Any) -> None:
        self.step = state.global_step + 1
        self._moment("step_begin", split=True)
        if self.profile and self.step == self.at_step:
            self._start_profiler()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kw: Any) -> None:
        if self.profiler is not None:
            self.attribution = self._stop_profiler()
        if self.profile and state.global_step == state.max_steps:  # through the last save
            self._start_profiler()

    def on_save(self, args: TrainingArguments, state: TrainerState,
                control: TrainerControl, **kw: Any) -> None:
        if self.profiler is not None:
            self.save_attribution = self._stop_profiler()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kw: Any) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"breakdown-rank{args.process_index}.json"
        path.write_text(json.dumps({"rank": args.process_index, "at_step": self.at_step,
                                    "moments": self.moments,
                                    "attribution": self.attribution,
                                    "save_attribution": self.save_attribution}, indent=1))


# ---------------------------------------------------------------- measurement overhead

OVERHEAD_MODES = ("off", "counter", "profiler")


def overhead_child(mode: str, steps: int) -> float:
    """Steps per CPU second of a plain training loop on the tiny Llama (hidden 64, 2 layers, batch
    16 x 64; the shape where a per-op or per-allocation cost shows most) with no
    measurement, the counting allocator, or torch.profiler recording memory events."""
    import contextlib
    import time

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    from launcher.rank import memtrace

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if mode == "counter":
        memtrace.CpuTracker.install()
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=172, vocab_size=512)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (16, 64))
    context: Any = contextlib.nullcontext()
    if mode == "profiler":
        from torch.profiler import ProfilerActivity, profile

        context = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    with context:
        start = time.process_time()  # CPU time of this 1-thread process: other load on a
        for _ in range(steps):       # shared machine takes wall time, not CPU time
            step()
        seconds = time.process_time() - start
    return steps / seconds


def overhead(rounds: int, steps: int) -> dict[str, list[float]]:
    """Each mode in a fresh process, interleaved `rounds` times."""
    import subprocess

    rates: dict[str, list[float]] = {m: [] for m in OVERHEAD_MODES}
    for _ in range(rounds):
        for mode in OVERHEAD_MODES:
            done = subprocess.run([sys.executable, __file__, "--overhead-child", mode,
                                   "--steps", str(steps)], capture_output=True, text=True,
                                  check=True)
            rates[mode].append(float(done.stdout.strip().splitlines()[-1]))
    return rates


# ---------------------------------------------------------------- the driver


def predicted(strategy: str, extra: list[str]) -> dict[str, Any]:
    """launcher/estimator/memory.py's per-rank terms and launcher/estimator/peak.py's
    moments for the same run."""
    sys.path.insert(0, str(ROOT))
    from launcher.config.architecture import count_params, largest_layer_params
    from launcher.config.compose import compose_config
    from launcher.engines import engine_of
    from launcher.estimator.estimate import strategy_estimate
    from launcher.estimator.memory import engine_model_state_parts, param_bytes

    cfg = compose_config([*OVERRIDES, *extra, f"strategy={strategy}"])
    s = cfg.strategy
    parts = engine_model_state_parts(
        count_params(cfg.model), largest_layer_params(cfg.model), cfg.world_size,
        engine_of(s).memory_stage(s), s.offload_optimizer, s.offload_param,
        param_bytes(cfg.precision.name))
    row = strategy_estimate(cfg, s, None)
    return {**{f"est_{k}": float(v) for k, v in parts.items()},
            "est_states": row.model_state_gpu_bytes, "est_activations": row.activation_bytes,
            "est_buffers": float(row.buffer_bytes), "est_total": row.gpu_bytes,
            "est_peak": row.peak_bytes, "est_steady": row.steady_bytes,
            "est_moments": row.moments, "params": count_params(cfg.model)}


def synthetic_data(work: Path, rows: int = 400, words: int = 400) -> Path:
    """JSONL rows {"text": ...} of `words` random words each (far beyond 128 tokens)."""
    import random

    path = work / "long.jsonl"
    if not path.is_file():
        rng = random.Random(0)
        vocab = ["alpha", "beta", "gamma", "delta", "seven", "plus", "minus", "equals",
                 "reverse", "string", "number", "forty", "two"]
        path.write_text("".join(
            json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(words))}) + "\n"
            for _ in range(rows)))
    return path


def one_run(strategy: str, work: Path, extra: list[str], profile: bool) -> dict[str, Any]:
    import subprocess

    out, probe = work / f"out-{strategy}", work / f"probe-{strategy}"
    callbacks = ("train.callbacks=[{_target_:bench.memory_breakdown.Breakdown,"
                 f"out:{probe},profile:{str(profile).lower()}}}]")
    argv = [sys.executable, "-m", "launcher", "train", *OVERRIDES, *extra,
            f"strategy={strategy}", f"run.output_dir={out}",
            f"dataset.path={synthetic_data(work)}",
            f"dataset.cache_dir={work / 'data'}", callbacks]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{strategy} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (run_dir,) = out.glob("*/*/")
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "metrics").glob("rank*.json"))]
    probes = [json.loads(p.read_text()) for p in sorted(probe.glob("breakdown-rank*.json"))]
    return {"strategy": strategy, "run_dir": str(run_dir),
            "memory": [r.get("memory") for r in ranks], "breakdown": probes,
            **predicted(strategy, extra)}


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.3f}"


def table(results: list[dict[str, Any]]) -> str:
    """Rank 0's figures (GiB); the ranks differ by a few KiB."""
    phases = ("model", "engine", "first_step", "steady", "checkpoint", "final")
    lines = ["| strategy | " + " | ".join(phases) + " | RSS | est states | est acts |"
             " est steady | est peak |", "|---" * (len(phases) + 6) + "|"]
    for r in results:
        mem = r["memory"][0]["phases"]
        cells = [gib(mem.get(p, {}).get("peak_bytes")) for p in phases]
        lines.append(f"| {r['strategy']} | " + " | ".join(cells)
                     + f" | {gib(r['memory'][0]['rss_peak_bytes'])} | {gib(r['est_states'])}"
                     f" | {gib(r['est_activations'])} | {gib(r.get('est_steady'))}"
                     f" | {gib(r.get('est_peak'))} |")
    lines += ["", f"step {AT_STEP} of rank 0 (GiB): live at step begin, forward end, optimizer"
              " begin/end; high-water mark of the step; parts at optimizer begin", ""]
    for r in results:
        moments = r["breakdown"][0]["moments"] if r["breakdown"] else {}
        live = {k: v["allocated"] for k, v in moments.items()}
        parts = moments.get("optimizer_begin", {}).get("parts", {})
        begin_parts = moments.get("step_begin", {}).get("parts", {})
        lines.append(
            f"- {r['strategy']}: begin {gib(live.get('step_begin'))}, fwd end "
            f"{gib(live.get('forward_end'))}, opt begin {gib(live.get('optimizer_begin'))}, "
            f"opt end {gib(live.get('optimizer_end'))}; step peak "
            f"{gib(moments.get('optimizer_end', {}).get('peak'))}; at opt begin "
            + ", ".join(f"{k} {gib(v)}" for k, v in sorted(parts.items()))
            + "; at step begin " + ", ".join(f"{k} {gib(v)}"
                                             for k, v in sorted(begin_parts.items())))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    parser.add_argument("--extra", nargs="*", default=[],
                        help="more overrides, e.g. train.micro_batch_size=4")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" /
                                             "memory_breakdown.json"))
    parser.add_argument("--profile", action="store_true",
                        help="also attribute step AT_STEP's peak and the last checkpoint "
                             "save's to the allocating ops (torch.profiler over those)")
    parser.add_argument("--overhead", action="store_true",
                        help="only the measurement's cost: tiny-model steps/s per mode")
    parser.add_argument("--overhead-child", choices=OVERHEAD_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    if options.overhead_child:
        print(overhead_child(options.overhead_child, options.steps))
        return 0
    if options.overhead:
        import statistics

        rates = overhead(options.rounds, options.steps)
        base = statistics.median(rates["off"])
        for mode, values in rates.items():
            median = statistics.median(values)
            print(f"{mode:9s} {median:7.2f} steps/CPU-s  ({median / base:.3f} of off; runs "
                  + ", ".join(f"{v:.2f}" for v in values) + ")")
        return 0
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(options.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for strategy in options.strategies:
            results.append(one_run(strategy, work, options.extra, options.profile))
            print(f"  {strategy}: done", file=sys.stderr, flush=True)
            Path(options.out).parent.mkdir(parents=True, exist_ok=True)
            Path(options.out).write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
