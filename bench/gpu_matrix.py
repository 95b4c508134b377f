"""The GPU check (`make test-gpu`, `bash bench/gpu.sh`; issue 34, item 5): a matrix of short
`ftl train` runs on one GPU, each row one switch against the ddp bf16 row, within one time
budget (8 minutes with the installation; bench/gpu.sh installs, then calls this).

    python bench/gpu_matrix.py --plan           # the rows, overrides, budget: no GPU, no install
    python bench/gpu_matrix.py --plan --check   # and `ftl plan` of every row here (GPU preset)
    python bench/gpu_matrix.py                  # on a GPU, in the GPU environment: run them
    python bench/gpu_matrix.py --dry            # every row on CPU at toy sizes (~3 min)

Every row trains a model built from config on synthetic text rows of exactly
dataset.max_length=2048 tokens (no hub, no padding; the packing rows pack synthetic
documents of 30-600 words into such rows instead), $STEPS steps of micro batch
$MICRO, the Trainer's torch AdamW (train.optimizer=torch: nothing for DeepSpeed to compile),
and records: tokens/s over steps WARM..STEPS (bench.callbacks.StepClock), TFLOP/s and MFU
(plan.json's FLOPs per token and the preset's dense 16-bit peak), the predicted peak
(plan.json's estimate, launcher/estimator/peak.py) against the measured one (the run's own
CUDA statistics, torch.cuda.max_memory_allocated per phase: result.json "memory" and
metrics/rank0.json), the run's start-up phases, and passed or not; a failed row keeps its
error's tail and the next row runs. A row whose package does not import (flash_attn,
liger_kernel, bitsandbytes) is skipped with the reason, and so is one that no longer fits the
budget (run it on its own: ROWS=name). Results: $RESULTS/gpu_matrix.json (bench/results/),
written only by a run on a GPU.

Environment: STEPS (12), MICRO (4), ROWS (names, default all), STRATEGIES (instead of the
rows: "zero2 zero3:strategy.bucket_size=50000000", one bf16 row each, as bench/gpu.sh ran
before the matrix; GPUS=2 for tp/sp rows), BUDGET_S (480, counted from GPU_CHECK_START, the
epoch second bench/gpu.sh began), FTL_GPU_PRESET, WORK, KEEP=1, RESULTS, INSTALL_NOTES (a
file of "module: why it is missing" lines from bench/gpu.sh).
Only the standard library is imported here: --plan runs under any python3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 480
RESERVE_S = 10  # the report, after the last row
WARM = 4  # steps before this one are not timed (compiles, allocator warm-up)

LLAMA_1B = ("model=tiny-llama", "model.name=llama-1b", "model.hidden_size=2048",
            "model.num_layers=16", "model.num_heads=32", "model.num_kv_heads=8",
            "model.intermediate_size=8192", "model.vocab_size=32000",
            "model.max_position_embeddings=2048")
"""~1.1B parameters: the Llama bench/gpu.sh measured on an H200 on 2026-11-30."""
MOE = ("model=tiny-moe", "model.name=moe-0.4b", "model.hidden_size=1024", "model.num_layers=12",
       "model.num_heads=16", "model.num_kv_heads=8", "model.intermediate_size=512",
       "model.num_experts=16", "model.experts_per_token=2", "model.vocab_size=32000",
       "model.max_position_embeddings=2048")
"""configs/model/tiny-moe.yaml (Qwen3-MoE) scaled up: 405M parameters, 16 experts of width
512 per layer, 2 per token; under ZeRO-3 DeepSpeed makes the experts leaf modules."""
MODELS = {"llama-1b": LLAMA_1B, "moe-0.4b": MOE}
DRY_MODELS = {"llama-1b": ("model=tiny-llama", "model.intermediate_size=192"),
              "moe-0.4b": ("model=tiny-moe",)}
"""--dry: the presets built from config (intermediate 192: bitsandbytes' CPU 4-bit kernel
packs output features in blocks of 32, so QLoRA's row runs too)."""
QLORA_BASE = "ddp-bf16"
"""The row whose saved model (RUN_DIR/model, the 1.1B Llama in bf16) QLoRA quantizes and
the eval row scores."""
USES_BASE = ("qlora", "eval")
EVAL_TASK = ("--tasks", "arith")
"""The bundled task: offline, 200 sums, 8 new tokens each (issue 33's GPU check)."""


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    overrides: tuple[str, ...]
    seconds: int
    """Planned wall time, start-up included (the budget's unit; a guess until a run)."""
    timeout: int
    needs: tuple[str, ...] = ()
    """Modules that must import in the GPU environment, else the row is skipped."""
    model: str = "llama-1b"
    kind: str = "train"
    """train: an `ftl train`; eval: `ftl eval` of the ddp-bf16 row's model (run_eval)."""


def _ddp(*extra: str) -> tuple[str, ...]:
    return ("strategy=ddp", "precision=bf16", *extra)


WORK_DIR = "<WORK>"
"""The scratch folder in a row's overrides (Settings.work; the plan prints it as is)."""
PACKED = (f"dataset.path={WORK_DIR}/docs.jsonl", "dataset.packing=true")
"""Short documents (write_doc_rows) packed: the packing rows' data in place of text.jsonl."""


# The order is what a short budget keeps: the base row, then issue 33's eval row, then the
# switches no GPU has run yet; the strategy rows last (ddp/zero2/zero3/fsdp ran on an H200
# on 2026-11-30: 28-61 s each, their planned seconds below).
ROWS = (
    Row("ddp-bf16", "the baseline of the switch rows (sdpa, no Liger, eager PyTorch); its "
        "saved model is QLoRA's base (and it tokenizes the data, once)", _ddp(), 40, 120),
    Row("eval", "ftl eval (lm-evaluation-harness) of the ddp-bf16 row's model on the "
        "bundled arith task on this GPU, then the same split: --processes N (accelerate "
        "launch, one worker per GPU) with 2+ GPUs, else --shard; same answers and scores",
        EVAL_TASK, 40, 150, needs=("lm_eval",), kind="eval"),
    Row("compile", "torch.compile (inductor) on", _ddp("train.compile=true"), 90, 240),
    Row("attn-flex", "FlexAttention (compiles its kernels at the first step)",
        _ddp("model.attn_implementation=flex_attention"), 50, 150),
    Row("liger", "Liger's Triton kernels on", _ddp("train.liger_kernel=true"), 35, 150,
        needs=("liger_kernel",)),
    Row("moe-zero3", "tiny-moe scaled up under ZeRO-3 (experts as leaf modules)",
        ("strategy=zero3", "precision=bf16"), 40, 150, model="moe-0.4b"),
    Row("ddp-fp16", "fp16 AMP (fp32 masters, dynamic loss scale)",
        ("strategy=ddp", "precision=fp16"), 25, 120),
    Row("packed", "packing: documents of 30-600 words packed into 2048-token rows (TRL's "
        "best fit), each document attending to itself only (sdpa: transformers' mask from "
        "position_ids)", _ddp(*PACKED), 30, 120),
    Row("zero3-bf16", "DeepSpeed ZeRO-3", ("strategy=zero3", "precision=bf16"), 45, 120),
    Row("fsdp-bf16", "FSDP", ("strategy=fsdp", "precision=bf16"), 40, 120),
    Row("qlora", "QLoRA: the ddp-bf16 row's model in 4-bit NF4 + LoRA (bitsandbytes)",
        _ddp("peft=qlora", f"model.path=<{QLORA_BASE} RUN_DIR>/model"), 35, 150,
        needs=("bitsandbytes",)),
    Row("attn-eager", "eager attention (keeps the s x s scores, about 3 GiB a layer at micro "
        "4 over an H100's 80 GiB: micro 2)",
        _ddp("model.attn_implementation=eager", "train.micro_batch_size=2"), 28, 120),
    Row("attn-fa2", "FlashAttention-2", _ddp("model.attn_implementation=flash_attention_2"),
        25, 120, needs=("flash_attn",)),
    Row("packed-fa2", "packing on FlashAttention-2's varlen kernel (cu_seqlens from "
        "position_ids: no mask)", _ddp(*PACKED, "model.attn_implementation=flash_attention_2"),
        30, 120, needs=("flash_attn",)),
    Row("attn-fa3", "FlashAttention-3 (Hopper)",
        _ddp("model.attn_implementation=flash_attention_3"), 25, 120,
        needs=("flash_attn_interface",)),
    Row("zero2-bf16", "DeepSpeed ZeRO-2", ("strategy=zero2", "precision=bf16"), 60, 120),
)


@dataclass
class Settings:
    steps: int = 12
    micro: int = 4
    gpus: int = 1
    preset: str = "h100-80g"
    work: Path | None = None
    """Scratch (data, run dirs, logs): WORK, else a new temporary folder when rows run."""
    budget_s: int = BUDGET_S
    start: float = field(default_factory=time.time)
    dry: bool = False
    """--dry: every row on this machine's CPU (cpu preset, 2 ranks, the tiny models, 64
    tokens): the glue (runs, measures, records, the eval row's comparison) checked before
    a GPU's minutes go into it; results under WORK, never bench/results."""

    @classmethod
    def from_env(cls, problems: list[str]) -> Settings:
        """From the knobs; each bad one added to `problems` (its default used)."""
        env = os.environ

        def number(name: str, default: int, least: int, what: str) -> int:
            text = env.get(name) or str(default)
            if not text.isdigit() or int(text) < least:
                problems.append(f"{name}={text}: {what} (at least {least}; unset: {default})")
                return default
            return int(text)

        return cls(steps=number("STEPS", cls.steps, WARM + 1,
                                f"steps per row; the first {WARM} are not timed"),
                   micro=number("MICRO", cls.micro, 1, "the micro batch"),
                   gpus=number("GPUS", cls.gpus, 1, "GPUs per row"),
                   preset=env.get("FTL_GPU_PRESET") or cls.preset,
                   work=Path(env["WORK"]) if env.get("WORK") else None,
                   budget_s=number("BUDGET_S", cls.budget_s, 1, "seconds for the whole check"),
                   start=float(env.get("GPU_CHECK_START") or time.time()))

    def shape(self) -> tuple[int, int, int]:
        """(tokens per row, ranks, micro batch) the rows train with: --dry's toy sizes."""
        return (64, 2, 2) if self.dry else (2048, self.gpus, self.micro)

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        """Seconds of the budget still free for rows (RESERVE_S kept for the report)."""
        return self.budget_s - RESERVE_S - self.elapsed()

    def say(self, text: str) -> None:
        print(f"[gpu +{self.elapsed():.0f}s] {text}", flush=True)


def selected_rows(problems: list[str]) -> tuple[Row, ...]:
    """ROWS (names) from the matrix, or STRATEGIES' bf16 rows in place of it; unknown
    names added to `problems`."""
    if os.environ.get("STRATEGIES"):
        return tuple(Row(item, "a strategy row (STRATEGIES)",
                         (f"strategy={item.split(':')[0]}", "precision=bf16",
                          *item.split(":")[1:]), 35, 420)
                     for item in os.environ["STRATEGIES"].split())
    names = os.environ.get("ROWS", "").split()
    unknown = sorted(set(names) - {row.name for row in ROWS})
    if unknown:
        problems.append(f"ROWS: unknown {unknown} (the rows: "
                        f"{' '.join(row.name for row in ROWS)})")
    return tuple(row for row in ROWS if not names or row.name in names)


WORDS = "alpha beta gamma delta epsilon sum of the numbers sort these digits reverse".split()


def write_word_rows(path: Path, rows: int, seed: int,
                    words_in: Callable[[random.Random], int]) -> None:
    """`rows` JSONL rows {"text": ...} of random WORDS, `words_in(rng)` words each."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for _ in range(rows):
            out.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=words_in(rng)))})
                      + "\n")


def write_text_rows(path: Path, rows: int) -> None:
    """Synthetic text: every row longer than max_length, so each is exactly 2048 tokens."""
    write_word_rows(path, rows, 0, lambda rng: 3000)


def write_doc_rows(path: Path, rows: int, most_words: int = 600) -> None:
    """Synthetic documents of most_words / 20 to most_words words: several to a packed row
    (600: about 30-600 tokens against 2048; --dry's 64-token rows get 2-40 words)."""
    write_word_rows(path, rows, 1, lambda rng: rng.randint(most_words // 20, most_words))


def common_overrides(s: Settings) -> list[str]:
    work = s.work or Path("WORK")  # the plan prints the placeholder
    length, ranks, micro = s.shape()
    return [f"dataset.path={work / 'text.jsonl'}", "dataset.format=text", "dataset.eval_path=",
            "dataset.eval_fraction=0", f"dataset.max_length={length}", "dataset.packing=false",
            f"dataset.cache_dir={work / 'data'}", f"cluster.gpu={s.preset}",
            f"cluster.gpus_per_node={ranks}", f"train.max_steps={s.steps}",
            f"train.micro_batch_size={micro}", "train.grad_accum=1", "train.lr=1e-4",
            "train.warmup_ratio=0.1", "train.logging_steps=4", "train.eval_steps=0",
            "train.save_steps=100000", "train.eval_on_start=false", "train.optimizer=torch",
            "train.show_examples=0"]


def row_argv(row: Row, s: Settings, verb: str, out: Path, base_model: Path | None) -> list[str]:
    clock = out / "clock"
    callbacks = (f"train.callbacks=[{{_target_:bench.callbacks.StepClock,out:{clock}}},"
                 "{_target_:bench.callbacks.NoFinalCheckpoint}]")
    overrides = [o.replace(f"<{QLORA_BASE} RUN_DIR>/model", str(base_model))
                 if base_model is not None else o for o in row.overrides]
    if s.work is not None:
        overrides = [o.replace(WORK_DIR, str(s.work)) for o in overrides]
    model = (DRY_MODELS if s.dry else MODELS)[row.model]
    return [sys.executable, "-m", "launcher", verb, *model, *common_overrides(s),
            *overrides, f"run.output_dir={out / 'runs'}", callbacks]


# ---------------------------------------------------------------- the plan


def print_plan(rows: tuple[Row, ...], s: Settings, check: bool) -> None:
    planned = sum(row.seconds for row in rows)
    results = ROOT / "bench" / "results" / "gpu_matrix.json"
    print(f"GPU check (make test-gpu = bash bench/gpu.sh): {len(rows)} rows, each an `ftl "
          f"train` on {s.gpus} GPU(s) of {s.steps} steps, micro batch {s.micro} x 2048 tokens, "
          f"timed from step {WARM}; budget {s.budget_s} s in all, installation included.")
    print("install (bench/gpu.sh, timed): a venv .venv-gpu with torch==2.13.0 (the CUDA "
          "wheel) and the project with [qlora,eval] (bitsandbytes, lm-eval), liger-kernel; "
          "flash-attn from a prebuilt wheel only (FLASH_ATTN_WHEEL, else PyPI's, 60 s cap), "
          "else its rows are skipped; or offline: WHEELS=DIR (bench/gpu_wheelhouse.sh) "
          "beside the machine's own CUDA torch.")
    for name, overrides in MODELS.items():
        print(f"model {name}: {' '.join(overrides)}")
    print(f"every row: {' '.join(common_overrides(s))} run.output_dir=WORK/<row>/runs "
          "train.callbacks=[bench.callbacks.StepClock, NoFinalCheckpoint]  (on a GPU, "
          "cluster.gpu is the device's preset)")
    verdicts = check_rows(rows, s) if check else {}
    print(f"\n{'#':>2} {'row':<11}{'plan s':>7}{'cap s':>6}  {'model':<9} overrides")
    for index, row in enumerate(rows, 1):
        needs = f"  (needs {', '.join(row.needs)})" if row.needs else ""
        print(f"{index:>2} {row.name:<11}{row.seconds:>7}{row.timeout:>6}  {row.model:<9} "
              f"{' '.join(row.overrides)}{needs}")
        print(f"{'':>14}{row.what}")
        if row.name in verdicts:
            print(f"{'':>14}ftl plan here: {verdicts[row.name]}")
    flash = sum(row.seconds for row in rows if any(m.startswith("flash") for m in row.needs))
    print(f"\nrows planned: {planned} s ({planned - flash} s where flash-attn is not "
          f"installed); with the install (guessed: ~30 s offline, ~120 s from PyPI) "
          f"{planned - flash + 30}-{planned + 120} s against the {s.budget_s} s budget. The "
          "plan's seconds are guesses until a run measures them. A row that no longer fits is "
          "skipped and recorded as such (ROWS=<names> runs it alone); each row's cap is "
          "min(cap, what the budget has left).")
    print("per row: passed, tokens/s (and against ddp-bf16), TFLOP/s, MFU, predicted vs "
          "measured peak GiB (torch.cuda.max_memory_allocated), reserved peak, start-up "
          "phases, the run's own logged tokens/s and MFU; a failed row: its error's tail.")
    if results.exists():
        meta = json.loads(results.read_text()).get("meta", {})
        print(f"last run: {meta.get('date')} on {meta.get('gpu')} ({results})")
    else:
        print(f"status: not run on a GPU yet ({results.relative_to(ROOT)} does not exist; "
              "it is written by a run on a GPU only).")


def check_rows(rows: tuple[Row, ...], s: Settings) -> dict[str, str]:
    """`ftl plan` of every row here (validation, estimate, run dir; nothing runs), with the
    preset the GPU would get. The QLoRA base is a placeholder path (plan reads no weights)."""
    verdicts = {}
    with tempfile.TemporaryDirectory(prefix="ftl-gpu-plan.") as tmp:
        s = replace(s, work=Path(tmp))
        write_text_rows(s.work / "text.jsonl", 8)
        write_doc_rows(s.work / "docs.jsonl", 64)
        for row in rows:
            if row.kind == "eval":
                verdicts[row.name] = ("nothing to plan: ftl eval of the ddp-bf16 row's model "
                                      f"(lm_eval {'' if module_here('lm_eval') else 'not '}"
                                      "installed here)")
                continue
            out = s.work / row.name
            done = subprocess.run(row_argv(row, s, "plan", out, s.work / "base-model"),
                                  cwd=ROOT, capture_output=True, text=True)
            if done.returncode == 0:
                plans = list((out / "runs").glob("*/*/plan.json"))
                peak = json.loads(plans[0].read_text())["estimate"].get("peak_bytes") \
                    if plans else None
                verdicts[row.name] = "ok" + (f" (predicted peak {peak / 2**30:.1f} GiB)"
                                             if peak else "")
            else:
                lines = [line for line in done.stderr.splitlines() if line.strip()]
                missing = [m for m in row.needs if not module_here(m)]
                why = (f" (expected: {', '.join(missing)} not installed here; the GPU "
                       "environment installs it or skips the row)") if missing else ""
                verdicts[row.name] = f"refused{why}: {' '.join(lines[-3:])[:400]}"
    return verdicts


def module_here(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------- the run


def probe(modules: set[str]) -> dict[str, Any]:
    """torch, its CUDA and each needed module, imported in a child (a broken extension
    fails there, not here); the driver itself imports no torch."""
    code = ("import json, sys, importlib\nimport torch\n"
            "out = {'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "       'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,\n"
            "       'gib': torch.cuda.get_device_properties(0).total_memory / 2**30\n"
            "              if torch.cuda.is_available() else 0, 'missing': {}}\n"
            "for m in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except Exception as exc:\n"
            "        out['missing'][m] = f'{type(exc).__name__}: {exc}'[:300]\n"
            "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", code, *sorted(modules)], capture_output=True,
                          text=True, timeout=180)
    if done.returncode != 0:
        sys.exit(f"gpu_matrix: importing torch failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def preset_for(device: str, memory_gib: float) -> str:
    if os.environ.get("FTL_GPU_PRESET"):
        return os.environ["FTL_GPU_PRESET"]
    for key, preset in (("H200", "h200-141g"), ("H100", "h100-80g"), ("V100", "v100-32g")):
        if key in device:
            return preset
    if "A100" in device:
        return "a100-80g" if memory_gib > 60 else "a100-40g"
    sys.exit(f"gpu_matrix: no preset for {device!r} ({memory_gib:.0f} GiB); set "
             "FTL_GPU_PRESET to the closest of launcher/config/hardware.py's presets")


def install_notes() -> dict[str, str]:
    path = os.environ.get("INSTALL_NOTES")
    notes = {}
    if path and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            module, _, why = line.partition(":")
            notes[module.strip()] = why.strip()
    return notes


def stop(proc: subprocess.Popen) -> None:
    """ftl train's second Ctrl-C ends the launcher and every rank (a kill would orphan
    them); the kill is the last resort, for this child only."""
    for _ in range(2):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            time.sleep(2)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def measure(row: Row, s: Settings, out: Path) -> dict[str, Any]:
    """A finished row's figures from its run dir and StepClock's record."""
    (run_dir,) = (out / "runs").glob("*/*/")
    plan = json.loads((run_dir / "plan.json").read_text())
    result = json.loads((run_dir / "result.json").read_text())
    clock = json.loads((out / "clock" / "clock-rank0.json").read_text())
    points = [(step, t, tokens) for step, t, tokens, *_ in clock["steps"] if step >= WARM]
    tokens_per_s = ((points[-1][2] - points[0][2]) / (points[-1][1] - points[0][1])
                    if len(points) > 1 else None)
    achieved = plan["flops_per_token"] * tokens_per_s if tokens_per_s else None
    peak_flops = plan.get("peak_flops_per_device")
    memory = result.get("memory") or {}
    predicted = memory.get("predicted_peak_bytes") or (plan.get("estimate") or {}).get(
        "peak_bytes")
    measured = max((b for b in memory.get("measured_peak_bytes") or [] if b), default=None)
    rank0 = run_dir / "metrics" / "rank0.json"
    phases = {}
    reserved = None
    if rank0.exists():
        mem = json.loads(rank0.read_text()).get("memory") or {}
        reserved = mem.get("reserved_peak_bytes")
        phases = {name: {key.removesuffix("_bytes"): round(value / 2**20)
                         for key, value in peaks.items() if key.endswith("_bytes")}
                  for name, peaks in (mem.get("phases") or {}).items()}
    startup, logged = {}, {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") in ("startup", "finish"):
            startup.update(event[event["event"]])
        elif "tokens_per_s" in event or "mfu" in event:
            logged = {key: event.get(key) for key in ("step", "tokens_per_s", "tflops", "mfu")}
    ratio = measured / predicted if measured and predicted else None
    steps_ok = result.get("global_step") == s.steps
    loss = result.get("final_train_loss")
    return {
        "passed": steps_ok and loss is not None and math.isfinite(loss),
        "global_step": result.get("global_step"), "final_train_loss": loss,
        "tokens_per_s": tokens_per_s, "tflops": achieved / 1e12 if achieved else None,
        "mfu": achieved / peak_flops if achieved and peak_flops else None,
        "flops_per_token": plan["flops_per_token"], "peak_flops_per_device": peak_flops,
        "predicted_peak_gib": predicted / 2**30 if predicted else None,
        "measured_peak_gib": measured / 2**30 if measured else None,
        "measured_over_predicted": ratio,
        "reserved_peak_gib": reserved / 2**30 if reserved else None,
        "memory_phases_mib": phases, "startup_s": startup, "run_logged": logged,
        "strategy": plan.get("strategy"), "precision": plan.get("precision"),
    }


def run_logged(argv: list[str], log: Path, cap: int) -> int | None:
    """One child, its output appended to `log`; its exit code, None when stopped at `cap`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as sink:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            stop(proc)
            return None


def cap_of(row: Row, s: Settings) -> int:
    return int(min(row.timeout, s.left()))


def stopped(record: dict[str, Any], row: Row, cap: int, log: Path) -> dict[str, Any]:
    """A row stopped at its cap: timed out (a failure) at its own timeout; skipped where
    the budget's end set the cap lower (the budget's planned seconds were too few)."""
    if cap < row.timeout:
        return {**record, "status": "skipped", "error_tail": tail(log),
                "reason": f"budget: stopped after {cap} s, when the budget ran out "
                          f"(run it alone: ROWS={row.name})"}
    return {**record, "status": "timed out", "error_tail": tail(log)}


def run_row(row: Row, s: Settings, base_model: Path | None) -> dict[str, Any]:
    out = s.work / row.name
    log = s.work / "logs" / f"{row.name}.log"
    cap = cap_of(row, s)
    record: dict[str, Any] = {"cap_s": cap, "log": str(log)}
    began = time.time()
    code = run_logged(row_argv(row, s, "train", out, base_model), log, cap)
    record["wall_s"] = round(time.time() - began, 1)
    if code is None:
        return stopped(record, row, cap, log)
    if code == 2 and s.dry:  # a GPU-only switch refused before launch: what CPU says
        refusal = tail(log).strip().splitlines()[-1:]
        return {**record, "status": "skipped", "reason": f"refused on CPU: {' '.join(refusal)}"}
    if code != 0:
        errors = "".join(tail(p, 1500) for p in (out / "runs").glob("*/*/logs/rank*.error"))
        return {**record, "status": "failed", "exit": code,
                "error_tail": (errors + "\n" + tail(log)).strip()}
    try:
        figures = measure(row, s, out)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        return {**record, "status": "failed", "exit": 0,
                "error_tail": f"reading the run: {type(exc).__name__}: {exc}\n{tail(log)}"}
    status = "passed" if figures.pop("passed") else "failed"
    return {**record, "status": status, **figures}


def run_eval(row: Row, s: Settings, model: Path) -> dict[str, Any]:
    """`ftl eval` of `model` (a run's model/) in one process on the GPU, then split over the
    GPUs (--processes N with 2+, else --shard), each into its own RUN_DIR/eval/<stamp>/.
    Passed when both scored every example into results.json and per-sample logs and at
    least 95 % of the answers agree (the split batches differently: bf16 sums may differ)."""
    # --dry: CPU splits nothing (--shard and --processes are refused there); another batch
    # size still runs the comparison
    split = ("--batch-size", "7") if s.dry else eval_split(s.gpus)
    log = s.work / "logs" / f"{row.name}.log"
    record: dict[str, Any] = {"log": str(log), "split": " ".join(split)}
    began = time.time()
    runs = []
    for extra in ((), split):
        before = set(model.parent.glob("eval/*/"))
        argv = [sys.executable, "-m", "launcher", "eval", str(model), *row.overrides, *extra]
        cap = cap_of(row, s)
        code = run_logged(argv, log, cap)
        record["wall_s"] = round(time.time() - began, 1)
        if code is None:
            return stopped(record, row, cap, log)
        if code != 0:
            return {**record, "status": "failed", "exit": code, "error_tail": tail(log)}
        runs.append(read_eval(set(model.parent.glob("eval/*/")) - before))
    one, other = runs
    agree = sum(one["answers"].get(doc) == answer for doc, answer in other["answers"].items())
    agreement = agree / max(len(one["answers"]), 1)
    full = all(r["samples"] == len(r["answers"]) > 0 and r["results"] for r in runs)
    return {**record, "status": "passed" if full and agreement >= 0.95 else "failed",
            "answers_agree": agreement, "error_tail": "" if full else tail(log),
            **{f"{name}_{key}": r[key] for name, r in zip(("one", "split"), runs, strict=True)
               for key in ("scores", "samples", "seconds")}}


def eval_split(gpus: int) -> tuple[str, ...]:
    return ("--processes", str(gpus)) if gpus > 1 else ("--shard",)


def read_eval(new_dirs: set[Path]) -> dict[str, Any]:
    """One `ftl eval`'s dir: its summary, whether results.json exists, each answer by doc."""
    (eval_dir,) = new_dirs
    summary = json.loads((eval_dir / "summary.json").read_text())
    answers = {}
    for line in (eval_dir / "samples_arith.jsonl").read_text().splitlines():
        sample = json.loads(line)
        answers[sample["doc_id"]] = sample.get("filtered_resps")
    return {"scores": summary["scores"], "samples": summary["samples"],
            "seconds": summary["seconds"], "answers": answers,
            "results": (eval_dir / "results.json").is_file()}


def line_of(row: Row, r: dict[str, Any]) -> str:
    if r["status"] != "passed":
        last = (r.get("error_tail") or "").strip().splitlines()[-1:]
        return f"{row.name}: {r['status'].upper()}: {r.get('reason') or ' '.join(last)}"
    parts = [f"passed in {r['wall_s']:.0f} s"]
    if r.get("split"):
        parts.append(f"{r['one_samples']} examples, one process {r['one_seconds']:.0f} s, "
                     f"{r['split']} {r['split_seconds']:.0f} s, answers agree "
                     f"{r['answers_agree']:.0%}, scores {r['one_scores']}")
    if r.get("tokens_per_s"):
        parts.append(f"{r['tokens_per_s']:,.0f} tok/s")
    if r.get("mfu"):
        parts.append(f"{r['tflops']:.0f} TFLOP/s, MFU {r['mfu']:.1%}")
    if r.get("measured_peak_gib") and r.get("predicted_peak_gib"):
        parts.append(f"peak {r['measured_peak_gib']:.1f} GiB measured / "
                     f"{r['predicted_peak_gib']:.1f} predicted "
                     f"({r['measured_over_predicted']:.2f})")
    return f"{row.name}: {', '.join(parts)}"


def run(rows: tuple[Row, ...], s: Settings) -> int:
    s.work = s.work or Path(tempfile.mkdtemp(prefix="ftl-gpu-check."))
    needed = {m for row in rows for m in row.needs}
    found = probe(needed)
    if s.dry:
        found.update(gpu=f"none: --dry on {os.cpu_count()} CPU cores", gib=0)
    elif not found["gpu"]:
        sys.exit(f"gpu_matrix: torch {found['torch']} (CUDA {found['cuda']}) sees no GPU: "
                 "is the driver new enough for this CUDA build?")
    s.preset = "cpu" if s.dry else preset_for(found["gpu"], found["gib"])
    s.say(f"GPU {found['gpu']} ({found['gib']:.0f} GiB, preset {s.preset}); torch "
          f"{found['torch']} CUDA {found['cuda']}; not importable: {found['missing'] or 'none'}")
    write_text_rows(s.work / "text.jsonl", max(64, s.steps * s.micro))
    write_doc_rows(s.work / "docs.jsonl", 8 * max(64, s.steps * s.micro * s.gpus),
                   40 if s.dry else 600)
    notes = install_notes()
    results: dict[str, dict[str, Any]] = {}
    for row in rows:
        blocked = [f"{m} does not import: {notes.get(m) or found['missing'][m]}"
                   for m in row.needs if m in found["missing"]]
        base = (results.get(QLORA_BASE) or {}).get("model_dir")
        if row.name in USES_BASE and base is None:
            blocked.append(f"needs the {QLORA_BASE} row's saved model (that row did not pass "
                           "or was not selected)")
        left = s.left()
        if blocked:
            record = {"status": "skipped", "reason": "; ".join(blocked)}
        elif left < row.seconds:
            record = {"status": "skipped",
                      "reason": f"budget: {left:.0f} s left, the row plans {row.seconds} s "
                                f"(run it alone: ROWS={row.name})"}
        else:
            s.say(f"{row.name}: {' '.join(row.overrides)}")
            if row.kind == "eval":
                record = run_eval(row, s, Path(base))
            else:
                record = run_row(row, s, Path(base) if row.name == "qlora" and base else None)
            keep = row.name == QLORA_BASE and any(r.name in USES_BASE for r in rows)
            if keep and record["status"] == "passed":
                model = next((s.work / row.name / "runs").glob("*/*/model"), None)
                record["model_dir"] = str(model) if model else None
            elif os.environ.get("KEEP") != "1":
                shutil.rmtree(s.work / row.name, ignore_errors=True)
        results[row.name] = {"row": row.name, "what": row.what,
                             "overrides": list(row.overrides), "model": row.model,
                             "planned_s": row.seconds, **record}
        s.say(line_of(row, record))
        # after every row: a device command stopped at its own limit keeps what ran
        write_results(results, s, found, complete=False)
    if os.environ.get("KEEP") != "1":
        shutil.rmtree(s.work / QLORA_BASE, ignore_errors=True)
    path, meta = write_results(results, s, found, complete=True)
    print_table(results, meta)
    s.say(f"written: {path}")
    return 1 if any(r["status"] in ("failed", "timed out") for r in results.values()) else 0


def write_results(results: dict[str, dict[str, Any]], s: Settings, found: dict[str, Any],
                  complete: bool) -> tuple[Path, dict[str, Any]]:
    """$RESULTS/gpu_matrix.json (gpu_matrix-partial.json for ROWS/STRATEGIES; under WORK
    for --dry): the rows so far, `complete` once every selected row has its record."""
    base_speed = (results.get("ddp-bf16") or {}).get("tokens_per_s")
    for r in results.values():
        if base_speed and r.get("tokens_per_s") and r["model"] == "llama-1b":
            r["tokens_per_s_vs_ddp_bf16"] = r["tokens_per_s"] / base_speed
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": found["gpu"],
            "gpu_gib": found["gib"], "preset": s.preset, "torch": found["torch"],
            "cuda": found["cuda"], "steps": s.steps, "timed_from_step": WARM,
            "micro_batch": s.shape()[2], "seq_len": s.shape()[0], "gpus": s.gpus,
            "budget_s": s.budget_s, "dry": s.dry, "complete": complete,
            "install_s": float(os.environ.get("INSTALLED") or 0),
            "total_s": round(s.elapsed(), 1), "versions": versions(),
            "models": {name: list(o) for name, o in MODELS.items()}}
    name = "gpu_matrix" if not (os.environ.get("ROWS") or os.environ.get("STRATEGIES")) \
        else "gpu_matrix-partial"
    assert s.work is not None
    folder = (s.work / "results" if s.dry
              else Path(os.environ.get("RESULTS") or ROOT / "bench" / "results"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, "rows": list(results.values())}, indent=2) + "\n")
    return path, meta


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in ("transformers", "deepspeed", "accelerate", "peft", "bitsandbytes",
                 "liger-kernel", "flash-attn", "triton"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def print_table(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> None:
    def num(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    print(f"\n{meta['gpu']} ({meta['preset']}), torch {meta['torch']}, {meta['steps']} steps "
          f"(timed from {meta['timed_from_step']}), micro {meta['micro_batch']} x "
          f"{meta['seq_len']}")
    print(f"{'row':<11}{'status':<10}{'tok/s':>9}{'vs ddp':>7}{'TFLOP/s':>8}{'MFU':>7}"
          f"{'peak':>7}{'pred':>7}{'m/p':>6}{'run s':>7}")
    for r in results.values():
        print(f"{r['row']:<11}{r['status']:<10}{num(r.get('tokens_per_s'), ',.0f'):>9}"
              f"{num(r.get('tokens_per_s_vs_ddp_bf16'), '.2f'):>7}"
              f"{num(r.get('tflops'), '.0f'):>8}{num(r.get('mfu'), '.1%'):>7}"
              f"{num(r.get('measured_peak_gib'), '.1f'):>7}"
              f"{num(r.get('predicted_peak_gib'), '.1f'):>7}"
              f"{num(r.get('measured_over_predicted'), '.2f'):>6}"
              f"{num(r.get('wall_s'), '.0f'):>7}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true",
                        help="print the rows, their overrides and the budget; run nothing")
    parser.add_argument("--check", action="store_true",
                        help="with --plan: `ftl plan` every row here (needs the project's "
                             "dependencies in this python)")
    parser.add_argument("--validate", action="store_true",
                        help="check ROWS, STEPS, MICRO, GPUS and BUDGET_S only (exit 2 when bad)")
    parser.add_argument("--dry", action="store_true",
                        help="run the rows on this machine's CPU at toy sizes, to check the "
                             "glue before a GPU run (results under WORK)")
    args = parser.parse_args()
    problems: list[str] = []
    settings = Settings.from_env(problems)
    rows = selected_rows(problems)
    if problems:  # all of them at once, before gpu.sh installs anything (--validate)
        print("gpu_matrix: " + "; ".join(problems) + ". Fix: a value in range, or unset "
              "the knob for its default.", file=sys.stderr)
        return 2
    if args.dry:
        settings = replace(settings, dry=True, steps=min(settings.steps, 8),
                           budget_s=max(settings.budget_s, 900))
    if args.validate:
        return 0
    if args.plan:
        print_plan(rows, settings, args.check)
        return 0
    return run(rows, settings)


if __name__ == "__main__":
    sys.exit(main())
