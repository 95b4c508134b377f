"""Data path benchmarks (issue: tokenize once, pack cleanly).

1. `ftl preprocess` on a generated 100k-row chat file: cold (tokenize, write the cache)
   against cached (the same command again), as rows/s and tokens/s, and the wall ratio.
2. Packed against unpacked training: trained (non-masked) tokens per second over the same
   optimizer steps on a variable-length chat set, tiny Llama, 2 CPU ranks (ddp).

Run: `.venv/bin/python bench/preprocess.py` (part of `make bench`); about 10 minutes on 2
cores. Writes bench/results/preprocess.json.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, report

ROWS = 100_000
WORDS = "alpha beta gamma delta sum of the numbers sort these digits reverse word".split()


def chat_file(path: Path, rows: int, seed: int = 0) -> Path:
    """Conversations of 1-3 exchanges, messages of 1-25 words: lengths spread well below
    dataset.max_length=256, so unpacked batches carry padding (most real chat data does)."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(rows):
            turns: list[dict[str, str]] = []
            for _ in range(rng.randint(1, 3)):
                for role in ("user", "assistant"):
                    words = rng.choices(WORDS, k=rng.randint(1, 25))
                    turns.append({"role": role, "content": " ".join(words)})
            handle.write(json.dumps({"messages": turns}) + "\n")
    return path


def ftl(*args: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"ftl {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def preprocess_entry(work: Path, runs: int = 3) -> dict[str, Any]:
    data = chat_file(work / "chats.jsonl", ROWS)
    base = ["preprocess", "--json", "dataset=chat", f"dataset.path={data}", "dataset.eval_path=",
            "dataset.eval_fraction=0", "train.eval_on_start=false", "train.eval_steps=0",
            "train.show_examples=0", "dataset.format=chat",
            "dataset.max_length=256"]
    cold, cached, result = [], [], {}
    for run in range(runs):
        args = [*base, f"dataset.cache_dir={work / f'cache{run}'}"]
        seconds, out = ftl(*args)
        cold.append(seconds)
        result = json.loads(out)
        seconds, out = ftl(*args)
        assert json.loads(out)["cached"] is True
        cached.append(seconds)
    rows = ROWS
    cold_s, cached_s = statistics.median(cold), statistics.median(cached)
    return {
        "name": "ftl preprocess 100k chat rows: cold / cached", "ours": cold_s,
        "baseline": cached_s, "ratio": cold_s / cached_s, "unit": "s", "runs": runs,
        "spread": max(cold) / min(cold),
        "cold_rows_per_s": rows / cold_s, "cold_tokens_per_s": result["tokens"] / cold_s,
        "cached_rows_per_s": rows / cached_s, "tokens": result["tokens"],
    }


def trained_tokens_per_s(work: Path, data: Path, packing: bool, tag: str) -> float:
    out = work / f"train-{tag}"
    ftl("train", "dataset=chat", f"dataset.path={data}", "dataset.eval_path=",
        "dataset.eval_fraction=0", "train.show_examples=0",
        "train.eval_on_start=false", "train.eval_steps=0", "dataset.format=chat",
        "dataset.max_length=256", f"dataset.packing={str(packing).lower()}",
        "train.max_steps=30", "train.micro_batch_size=8", "train.logging_steps=10",
        "train.save_steps=1000", f"run.output_dir={out}", f"dataset.cache_dir={work / 'c'}")
    (run_dir,) = out.glob("*/*/")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    runtime = next(m["train_runtime"] for m in metrics if "train_runtime" in m)
    plan = json.loads((run_dir / "plan.json").read_text())
    prepared = json.loads((Path(plan["data_dir"]) / "meta.json").read_text())["prepared"]
    # Rows are sampled uniformly, so a step trains on average rows x (trained tokens / row).
    per_row = prepared["trained_tokens"] / prepared["rows"]
    return 30 * 8 * 2 * per_row / runtime


def packing_entry(work: Path, runs: int = 3) -> dict[str, Any]:
    data = chat_file(work / "train-chats.jsonl", 4000, seed=1)
    packed, unpacked = [], []
    for run in range(runs):  # interleaved: drift on a shared machine hits both alike
        packed.append(trained_tokens_per_s(work, data, True, f"p{run}"))
        unpacked.append(trained_tokens_per_s(work, data, False, f"u{run}"))
    ours, base = statistics.median(packed), statistics.median(unpacked)
    return {
        "name": "trained tokens/s: packed / unpacked", "ours": ours, "baseline": base,
        "ratio": ours / base, "unit": "trained tokens/s", "runs": runs,
        "spread": max(packed) / min(packed),
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        entries = [preprocess_entry(work), packing_entry(work)]
    report("preprocess", entries)
    first = entries[0]
    print(f"cold: {first['cold_rows_per_s']:.0f} rows/s, {first['cold_tokens_per_s']:.0f} "
          f"tokens/s; cached: {first['cached_rows_per_s']:.0f} rows/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
