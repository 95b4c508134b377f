"""The tokenizer of cfg.model: the one loader for preprocessing, the ranks and inference
(transformers is imported when called, so importing this module costs nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig


def load_tokenizer(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # causal LMs often ship without one
    return tokenizer
