"""`ftl quantize MODEL_DIR -o OUT_DIR`: INT8 post-training quantization with its cost.

The verb around launcher/inference/int8.py: the request's checks, the perplexity and
size before and after, the tables, `--compare` (docs/guide.md, "After training: quantize and chat").
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config.compose import compose_config
from launcher.data.formats import PREFERENCE
from launcher.data.mixture import formats
from launcher.errors import ConfigError
from launcher.inference.chat import check_causal_lm_dir
from launcher.inference.schemes import GRANULARITIES, SCHEMES
from launcher.validation.validate import validate

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig

EVAL_BATCH = 8


@dataclass
class Request:
    model_dir: Path
    out_dir: Path
    scheme: str
    granularity: str
    clip_percentile: float | None
    compare: bool
    force: bool
    overrides: list[str]


def check_request(req: Request) -> RunConfig:
    """Every problem with the request and its overrides in one ConfigError, before any work;
    the overrides pass the validation stage as `ftl preprocess`'s (the data's rules, sources
    and rows), since the verb reads the same data."""
    problems, cfg = [], None
    try:
        check_causal_lm_dir(req.model_dir)
    except ConfigError as error:
        problems += error.problems
    try:
        cfg = validate(compose_config(req.overrides), "preprocess").cfg
    except ConfigError as error:
        problems += error.problems
    if cfg is not None and PREFERENCE in formats(cfg):
        problems.append(f"dataset.format={PREFERENCE}: the perplexity is measured on "
                        "training examples, and preference pairs are not one example each. "
                        "Fix: a dataset of another format for the measurement, e.g. "
                        "dataset=arith.")
    if cfg is not None and not cfg.dataset.eval_path and cfg.dataset.eval_fraction == 0:
        problems.append("dataset.eval_fraction=0 and no dataset.eval_path: the perplexity "
                        "is measured on the eval split, and there is none. Fix: "
                        "dataset.eval_fraction=0.05 or dataset.eval_path=FILE.")
    if req.clip_percentile is not None and not 50 < req.clip_percentile < 100:
        problems.append(
            f"--clip-percentile {req.clip_percentile:g}: must be in (50, 100), the share of "
            "weights kept unclipped. Fix: e.g. --clip-percentile 99.9, or leave it out to "
            "search the threshold that minimises the error."
        )
    if req.clip_percentile is not None and req.scheme != "clip" and not req.compare:
        problems.append(
            f"--clip-percentile {req.clip_percentile:g} with --scheme {req.scheme}: only the "
            "clip scheme clips. Fix: --scheme clip, or leave --clip-percentile out.")
    if req.out_dir.exists() and not req.force:
        problems.append(
            f"-o {req.out_dir}: already exists. Fix: another directory, or --force to replace it."
        )
    if req.out_dir.resolve() == req.model_dir.resolve():
        problems.append(f"-o {req.out_dir}: is the input model. Fix: another directory.")
    if problems:
        raise ConfigError(problems)
    assert cfg is not None
    return cfg


def eval_batches(cfg: RunConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """The `dataset` group's eval split, tokenized like training data, in batches: of a
    mixture, each source's held-out rows in its own format (or its one eval file)."""
    from launcher.data.loading import collator, encode, encoder_for, eval_records

    rows: list[dict[str, Any]] = []
    # check_request refuses a config without an eval split
    for one, evaluation, source in eval_records(cfg):
        encoder = encoder_for(one, tokenizer, evaluation.column_names)
        rows += list(encode(evaluation, encoder, f"{source} (eval)", None))
    collate = collator(tokenizer)
    return [collate(rows[i:i + EVAL_BATCH]) for i in range(0, len(rows), EVAL_BATCH)]


def perplexity(model: Any, batches: list[dict[str, Any]]) -> float:
    """exp(mean next-token NLL over the trained (unmasked) tokens): the model's own loss,
    a mean per batch, weighted by the batch's trained tokens."""
    import torch

    from launcher.data.encode import IGNORE_INDEX

    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            tokens = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            total += float(model(**batch).loss) * tokens
            count += tokens
    return math.exp(total / max(count, 1))


def run_scheme(
    model: Any, tokenizer: Any, batches: list[dict[str, Any]], scheme: str, granularity: str,
    clip_percentile: float | None, out_dir: Path, source: Path,
) -> dict[str, Any]:
    """Quantize, write, load back (what a user will load) and measure."""
    from launcher.inference.int8 import (
        dir_size_bytes,
        load_quantized,
        quantize_model,
        save_quantized,
    )

    quantized, rows = quantize_model(model, scheme, granularity, clip_percentile)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    settings = {"scheme": scheme, "granularity": granularity, "clip_percentile": clip_percentile}
    save_quantized(model, tokenizer, quantized, out_dir, {**settings, "source": str(source)})
    loaded = load_quantized(out_dir)
    sizes = [math.prod(r["shape"]) for r in rows]
    return {**settings,
            "mse": sum(r["mse"] * n for r, n in zip(rows, sizes, strict=True)) / sum(sizes),
            "max_abs_error": max(r["max_abs_error"] for r in rows),
            "perplexity": perplexity(loaded, batches), "size_bytes": dir_size_bytes(out_dir),
            "layers": rows}


def quantize(req: Request, as_json: bool) -> int:
    """The verb: check, measure the baseline, quantize (one scheme or all), report."""
    from launcher.inference.chat import load_for_inference
    from launcher.inference.int8 import dir_size_bytes

    cfg = check_request(req)
    model, tokenizer = load_for_inference(req.model_dir)
    batches = eval_batches(cfg, tokenizer)
    baseline = {"perplexity": perplexity(model, batches),
                "size_bytes": dir_size_bytes(req.model_dir)}
    combos = ([(s, g) for s in SCHEMES for g in GRANULARITIES] if req.compare
              else [(req.scheme, req.granularity)])
    staging = req.out_dir.parent / f".tmp-{req.out_dir.name}"
    # --compare: the percentile is the clip scheme's; the others take none.
    results = [run_scheme(model, tokenizer, batches, s, g,
                          req.clip_percentile if s == "clip" else None,
                          staging / f"{s}-{g}", req.model_dir.resolve()) for s, g in combos]
    results.sort(key=lambda r: r["perplexity"])
    best = results[0]
    if req.out_dir.exists():
        shutil.rmtree(req.out_dir)
    (staging / f"{best['scheme']}-{best['granularity']}").rename(req.out_dir)
    shutil.rmtree(staging, ignore_errors=True)
    if as_json:
        schemes = [{k: v for k, v in r.items() if k != "layers"} for r in results]
        print(json.dumps({"schemes": schemes, "baseline": baseline}, indent=2))
        return 0
    if not req.compare:
        print(layer_table(best["layers"]))
    print(summary_table(results, baseline))
    print(f"wrote {req.out_dir} ({best['scheme']}, per {best['granularity']}); "
          "embeddings and norms stay in full precision; loading dequantizes to float32 on "
          f"CPU. Try it: ftl chat {req.out_dir}")
    return 0


def layer_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'layer':<44}{'scale':>10}{'zero pt':>9}{'mse':>11}{'max err':>10}"
             f"{'clipped':>9}"]
    for row in rows:
        lines.append(
            f"{row['layer']:<44}{row['scale']:>10.3g}{row['zero_point']:>9.1f}"
            f"{row['mse']:>11.3e}{row['max_abs_error']:>10.3g}{row['clipped_share']:>9.2%}"
        )
    return "\n".join(lines)


def summary_table(results: list[dict[str, Any]], baseline: dict[str, Any]) -> str:
    """Ranked by perplexity; the baseline (unquantized) first."""
    mib = 1024**2
    lines = ["", f"  {'scheme':<11}{'per':<9}{'mse':>11}{'max err':>10}{'perplexity':>12}"
                 f"{'size MiB':>10}",
             f"  {'baseline':<11}{'-':<9}{'-':>11}{'-':>10}{baseline['perplexity']:>12.4f}"
             f"{baseline['size_bytes'] / mib:>10.2f}"]
    for rank, r in enumerate(results, start=1):
        lines.append(
            f"{rank} {r['scheme']:<11}{r['granularity']:<9}{r['mse']:>11.3e}"
            f"{r['max_abs_error']:>10.3g}{r['perplexity']:>12.4f}{r['size_bytes'] / mib:>10.2f}"
        )
    return "\n".join(lines)
