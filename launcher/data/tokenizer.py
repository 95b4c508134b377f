"""The tokenizer of cfg.model: the one loader for preprocessing, the ranks and inference
(transformers is imported when called, so importing this module costs nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.errors import ConfigError

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig


def load_tokenizer(cfg: RunConfig) -> Any:
    """cfg's tokenizer; a ConfigError naming the key when transformers loads none from it
    (a weights-only checkpoint dir, a wrong path): its message, not its traceback."""
    from transformers import AutoTokenizer

    key = "model.tokenizer" if cfg.model.tokenizer else "model.path"
    source = cfg.model.tokenizer or cfg.model.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        why = " ".join(str(error).split())[:300]
        raise ConfigError(
            f"{key}={source}: transformers loads no tokenizer from it ({why}). Fix: a "
            "directory with the tokenizer's files (tokenizer.json or tokenizer_config.json, "
            "as save_pretrained writes them) or a hub id, in model.tokenizer if the "
            "weights' directory has none.") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # causal LMs often ship without one
    return tokenizer
