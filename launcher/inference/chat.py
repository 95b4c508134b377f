"""`ftl chat MODEL_DIR`: try a fine-tuned, merged or `ftl quantize`d model (or, loaded by
the caller, a LoRA adapter).

Replies are greedy, so the same prompt always gives the same answer (what a
before/after-quantization check needs). The template: the tokenizer's own chat template with
the generation prompt (`prompt_ids`), else the built-in one of launcher/data/encode.py, with a
notice.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from launcher.engines.pretrained import NO_HUB_KERNELS
from launcher.errors import ConfigError


def load_for_inference(model_dir: Path) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from a plain HF directory or a quantized one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.inference.int8 import is_quantized_dir, load_quantized

    check_causal_lm_dir(model_dir)
    model = (load_quantized(model_dir) if is_quantized_dir(model_dir)
             else AutoModelForCausalLM.from_pretrained(model_dir, **NO_HUB_KERNELS))
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


def check_causal_lm_dir(model_dir: Path) -> None:
    """A directory with an HF config whose architecture is a causal LM."""
    config = model_dir / "config.json"
    if not config.is_file():
        raise ConfigError(
            f"{model_dir}: no config.json, so not a model directory. Fix: pass the model/ "
            "directory of a run (outputs/<run.name>/<timestamp>/model) or an ftl quantize "
            "output."
        )
    architectures = json.loads(config.read_text()).get("architectures") or []
    if not any(str(name).endswith("ForCausalLM") for name in architectures):
        raise ConfigError(
            f"{model_dir}: architectures {architectures} is not a causal language model. "
            "Fix: pass a *ForCausalLM model directory."
        )


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the conversation plus the assistant's turn opening."""
    from launcher.data.encode import chat_template_for

    template, builtin = chat_template_for(tokenizer, "auto")
    if builtin:
        _builtin_notice()
    text = tokenizer.apply_chat_template(messages, chat_template=template,
                                         add_generation_prompt=True, tokenize=False)
    # The template writes bos itself when it wants one.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@cache
def _builtin_notice() -> None:
    """Once per process, not once per reply."""
    print("ftl chat: the tokenizer has no chat template; using the built-in "
          "'### Human: / ### Assistant:' template", file=sys.stderr)


def answers(model: Any, tokenizer: Any, conversations: Sequence[list[dict[str, str]]],
            max_new_tokens: int) -> list[str]:
    """Greedy answers, in order; prompts of one token length share a batch, unpadded, so
    a batch gives the answers single prompts would."""
    import torch

    ids = [prompt_ids(tokenizer, messages) for messages in conversations]
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(ids):
        by_length.setdefault(len(prompt), []).append(index)
    out = [""] * len(ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for length, indices in by_length.items():
        batch = torch.tensor([ids[i] for i in indices])
        with torch.no_grad():
            generated = model.generate(
                input_ids=batch, attention_mask=torch.ones_like(batch),
                max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
            )
        for index, row in zip(indices, generated, strict=True):
            out[index] = tokenizer.decode(row[length:], skip_special_tokens=True)
    return out


def chat(model_dir: Path, prompt: str | None, system: str | None, max_new_tokens: int,
         load: Callable[[Path], tuple[Any, Any]] = load_for_inference) -> int:
    """One answer for --prompt, else a loop reading prompts from stdin until EOF or /exit.
    `load`: (model, tokenizer) for model_dir (the CLI's also loads LoRA adapters)."""
    if max_new_tokens <= 0:
        raise ConfigError(f"--max-new-tokens {max_new_tokens}: must be positive. Fix: e.g. 128.")
    model, tokenizer = load(model_dir)
    messages = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        print(answers(model, tokenizer, [[*messages, {"role": "user", "content": prompt}]],
                      max_new_tokens)[0])
        return 0
    print("ftl chat: type a message (Ctrl-D or /exit to leave)", file=sys.stderr)
    for line in sys.stdin:
        if line.strip() == "/exit":
            break
        messages.append({"role": "user", "content": line.rstrip("\n")})
        answer = answers(model, tokenizer, [messages], max_new_tokens)[0]
        messages.append({"role": "assistant", "content": answer})
        print(answer, flush=True)
    return 0
