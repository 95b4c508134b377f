"""What `ftl eval` can evaluate and how the harness gets it: a plain HF directory (a run's
model/, a full fine-tune's checkpoint, any causal LM dir) goes to the harness by path, so its
own loading, sharding (parallelize) and data-parallel paths apply; what only ftl can build
goes in as a loaded model: an `ftl quantize` output (ftl's INT8 format), a LoRA adapter on
its base (the base's saved weights, else the run's starting weights rebuilt from its config:
the adapter's base_model_name_or_path names no weights for a model built from config), and
the weights a run starts from (eval.before). A sharded ZeRO/FSDP checkpoint holds no model
the harness can read: refused, with the dir that does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from launcher.config.compose import load_run_config
from launcher.engines.final_model import fused_pattern_warning_silenced
from launcher.engines.pretrained import NO_HUB_KERNELS
from launcher.errors import ConfigError
from launcher.inference.chat import check_causal_lm_dir, load_for_inference
from launcher.rundir import CONFIG, PLAN

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig

Kind = Literal["plain", "quantized", "adapter"]
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class ModelSource:
    path: Path
    kind: Kind
    run_dir: Path | None
    """The run dir the model belongs to (its config.yaml: the base, the trackers)."""

    @property
    def by_path(self) -> bool:
        """The harness loads it itself (sharding and data parallelism are its own)."""
        return self.kind == "plain"


def find_run_dir(model_dir: Path) -> Path | None:
    """RUN_DIR for RUN_DIR/model, RUN_DIR/model/adapter or RUN_DIR/checkpoints/checkpoint-N."""
    for candidate in [model_dir, *model_dir.resolve().parents][:4]:
        if (candidate / CONFIG).is_file() and (candidate / PLAN).is_file():
            return candidate
    return None


def model_source(model_dir: Path) -> ModelSource:
    """The model dir classified, or a ConfigError saying what to pass instead."""
    run_dir = find_run_dir(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such directory. Fix: a run's model/ dir "
                          "(outputs/<run.name>/<timestamp>/model), a checkpoint, a LoRA "
                          "adapter or an ftl quantize output.")
    if (model_dir / ADAPTER_CONFIG).is_file():
        return ModelSource(model_dir, "adapter", run_dir)
    if not (model_dir / "config.json").is_file() and model_dir.name.startswith("checkpoint-"):
        where = f"{run_dir / 'model'}" if run_dir else "the run's model/ dir"
        raise ConfigError(
            f"{model_dir}: a sharded checkpoint (ZeRO or FSDP) with no whole model in it. "
            f"Fix: evaluate {where}, or save whole weights at each checkpoint "
            "(strategy.gather_weights_on_save=true).")
    check_causal_lm_dir(model_dir)
    from launcher.inference.int8 import is_quantized_dir  # torch

    return ModelSource(model_dir, "quantized" if is_quantized_dir(model_dir) else "plain",
                       run_dir)


def saved_chat_template(model_dir: Path) -> bool | None:
    """Whether the tokenizer saved in model_dir has a chat template (transformers 5's
    chat_template.jinja, or the key in tokenizer_config.json); None where no tokenizer is
    saved there (an adapter without one, a hub id): not known here."""
    config = model_dir / "tokenizer_config.json"
    if any((model_dir / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    if not config.is_file():
        return None
    try:
        return bool(json.loads(config.read_text()).get("chat_template"))
    except (OSError, ValueError):
        return None


def load_model_dir(model_dir: Path) -> tuple[Any, Any]:
    """load_model for any dir model_source accepts, outside the harness (`ftl chat`), with
    its run's config for an adapter's base."""
    source = model_source(model_dir)
    return load_model(source, load_run_config(source.run_dir / CONFIG)
                      if source.run_dir else None)


def load_model(source: ModelSource, cfg: RunConfig | None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer): an adapter on its base (`cfg`: its run's, which
    knows the base), the other kinds as they are saved (ftl eval: the kinds the harness
    cannot load itself)."""
    if source.kind != "adapter":
        return load_for_inference(source.path)
    return _adapter_on_base(source, cfg)


def _adapter_on_base(source: ModelSource, cfg: RunConfig | None) -> tuple[Any, Any]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.inference.examples import initial_model

    base_name = json.loads((source.path / ADAPTER_CONFIG).read_text()).get(
        "base_model_name_or_path") or ""
    tokenizer_dir = source.path if (source.path / "tokenizer_config.json").is_file() else None
    if cfg is not None:  # the run knows its base: model.path, else rebuilt with its seed
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or cfg.model.tokenizer
                                                  or cfg.model.path)
        base = initial_model(cfg, tokenizer)
    elif Path(base_name).is_dir():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or base_name)
        base = AutoModelForCausalLM.from_pretrained(base_name, **NO_HUB_KERNELS)
    else:
        raise ConfigError(
            f"{source.path}: a LoRA adapter outside a run dir whose base "
            f"({base_name or 'not named'}) is not a local directory. Fix: evaluate the "
            "run's merged model/ dir, or the adapter inside its run dir.")
    with fused_pattern_warning_silenced():
        return PeftModel.from_pretrained(base, str(source.path)).eval(), tokenizer


def initial_weights(cfg: RunConfig, run_dir: Path) -> tuple[Any, Any]:
    """eval.before: the weights the run started from, with the run's saved tokenizer."""
    from transformers import AutoTokenizer

    from launcher.inference.examples import initial_model

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    return initial_model(cfg, tokenizer), tokenizer
