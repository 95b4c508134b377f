"""`ftl quantize` and `ftl chat` on the tiny model the suite trained (ddp, 8 steps).

- `--compare --json` (its --clip-percentile goes to the clip scheme only): every scheme x
  granularity, each written dir loads back, perplexity within a stated bound of the
  original, size on disk smaller;
- `ftl chat --prompt` prints exactly what greedy `generate` gives for the templated prompt,
  for the trained model and for its quantized copy;
- bad input: one message, exit 2, nothing written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runs import Run, describe_failure, ftl_here
from test_train_strategies import run_name, strategy_overrides

pytestmark = pytest.mark.slow

# INT8 keeps 255 levels per channel (or tensor); the weights' rounding error is then at most
# half a step, about 0.4% of each channel's range, and the tiny model's logits move by a
# few hundredths. Measured on this model: every scheme stays within 1% of the original
# perplexity; 5% leaves room for seeds and library versions while still failing a scheme
# that breaks the weights (a wrong scale or zero point moves the perplexity by far more).
PERPLEXITY_BOUND = 0.05
PROMPT = "12+30"


ftl = ftl_here  # quantize and chat start no process: in this one (tests/integration/runs.py)


@pytest.fixture(scope="module")
def model_dir(trained: Callable[..., Run]) -> Path:
    overrides = strategy_overrides("ddp", "torchrun", "fp32")
    run = trained(run_name("ddp", "torchrun", "fp32"), overrides)
    assert run.returncode == 0, describe_failure(run)
    return run.run_dir / "model"


@pytest.fixture(scope="module")
def compared(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("quantized") / "q8"
    done = ftl("quantize", str(model_dir), "-o", str(out), "--compare", "--json",
               "--clip-percentile", "99.9")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), out


def test_compare_ranks_every_scheme_within_the_perplexity_bound(
    compared: tuple[dict, Path],
) -> None:
    report, out = compared
    baseline = report["baseline"]
    combos = {(s["scheme"], s["granularity"]) for s in report["schemes"]}
    assert combos == {(s, g) for s in ("absmax", "zeropoint", "clip")
                      for g in ("tensor", "channel")}
    perplexities = [s["perplexity"] for s in report["schemes"]]
    assert perplexities == sorted(perplexities)  # ranked, best first
    for scheme in report["schemes"]:
        assert scheme["perplexity"] == pytest.approx(baseline["perplexity"],
                                                     rel=PERPLEXITY_BOUND), scheme
        assert scheme["size_bytes"] < 0.5 * baseline["size_bytes"], scheme
        assert scheme["mse"] > 0 and scheme["max_abs_error"] > 0
        # --clip-percentile is the clip scheme's: the others quantize without one
        assert scheme["clip_percentile"] == (99.9 if scheme["scheme"] == "clip" else None)
    quantization = json.loads((out / "quantization.json").read_text())
    best = report["schemes"][0]
    assert (quantization["scheme"], quantization["granularity"]) == (
        best["scheme"], best["granularity"])


def greedy(model: torch.nn.Module, tokenizer: object, max_new_tokens: int = 16) -> str:
    """What the model answers to PROMPT in the built-in template, by plain generate()."""
    text = f"### Human:\n{PROMPT}\n\n### Assistant:\n"
    ids = [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


def test_chat_prints_the_greedy_reply_before_and_after_quantization(
    model_dir: Path, compared: tuple[dict, Path]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.data.encode import BUILTIN_CHAT_TEMPLATE
    from launcher.inference.int8 import load_quantized

    _, quantized_dir = compared
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    models = {model_dir: AutoModelForCausalLM.from_pretrained(model_dir).eval(),
              quantized_dir: load_quantized(quantized_dir)}
    for path, model in models.items():
        # The tiny tokenizer has no template: training gave the model the built-in one it
        # learned, and the quantized copy keeps it.
        assert AutoTokenizer.from_pretrained(path).chat_template == BUILTIN_CHAT_TEMPLATE
        done = ftl("chat", str(path), "--prompt", PROMPT, "--max-new-tokens", "16")
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout == greedy(model, tokenizer) + "\n"


def test_single_scheme_prints_layers_perplexity_and_size(model_dir: Path, tmp_path: Path) -> None:
    # An override after the options, validated, and the eval split it implies said aloud.
    done = ftl("quantize", str(model_dir), "-o", str(tmp_path / "q"), "--scheme", "clip",
               "--granularity", "tensor", "--clip-percentile", "99.5",
               "dataset.path=data/arith/eval.jsonl")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "evaluating on 5% of eval.jsonl (dataset.eval_fraction=0.05)" in done.stderr
    text = done.stdout
    assert "model.layers.0.self_attn.q_proj.weight" in text and "lm_head.weight" in text
    assert "embed_tokens" not in text.split("baseline")[0]  # embeddings stay full precision
    assert "baseline" in text and "perplexity" in text and "size MiB" in text
    assert "embeddings and norms stay in full precision" in text


def test_bad_input_is_one_message_and_writes_nothing(model_dir: Path, tmp_path: Path) -> None:
    existing = tmp_path / "exists"
    existing.mkdir()
    done = ftl("quantize", str(tmp_path), "-o", str(existing), "--clip-percentile", "30")
    assert done.returncode == 2
    assert "4 configuration errors" in done.stderr
    assert "no config.json" in done.stderr and "--clip-percentile 30" in done.stderr
    assert "only the clip scheme clips. Fix: --scheme clip" in done.stderr
    assert "--force" in done.stderr and list(existing.iterdir()) == []
    unknown = ftl("quantize", str(model_dir), "-o", str(tmp_path / "x"), "--scheme", "fp4")
    assert unknown.returncode == 2 and "invalid choice: 'fp4'" in unknown.stderr
    assert not (tmp_path / "x").exists()
