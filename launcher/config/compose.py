"""Hydra compose: configs/ + command-line overrides -> a typed RunConfig.

Hydra stops at the first bad override; we retry each override alone to report every
bad one in a single ConfigError, phrased as the user typed it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import fields, is_dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from launcher.config.architecture import adapts_experts
from launcher.config.schema import GROUPS, RunConfig
from launcher.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("model.path", "model.tokenizer", "dataset.path", "dataset.eval_path")
"""The keys naming a local path or a hub id."""


def cache_home() -> Path:
    """The project's per-user cache (FTL_CACHE_DIR, else ~/.cache/ftlaunch): what is built
    once and reused by every run of this user (tokenized data, the memtrace counter)."""
    return Path(os.environ.get("FTL_CACHE_DIR") or Path.home() / ".cache" / "ftlaunch")


def config_dir() -> Path:
    """configs/ of this checkout, or FTL_CONFIG_DIR for a site-specific tree."""
    return Path(os.environ.get("FTL_CONFIG_DIR", PROJECT_ROOT / "configs")).resolve()


def compose_dict(overrides: list[str]) -> DictConfig:
    """Compose configs/ with `overrides`; raises ConfigError naming every bad override."""
    try:
        return _compose(overrides)
    except Exception as first:  # noqa: BLE001 - Hydra raises several unrelated types
        problems = [_explain(o, e) for o in overrides if (e := _failure([o])) is not None]
        raise ConfigError(problems or [_explain(" ".join(overrides), first)]) from None


def compose_config(overrides: list[str]) -> RunConfig:
    """The typed RunConfig for `overrides`, relative file paths made absolute."""
    run_config = to_run_config(compose_dict(overrides))
    for notice in (own_eval_set(run_config, overrides),
                   stream_held_out_off(run_config, overrides),
                   preset_evaluation_off(run_config, overrides),
                   expert_lora_dropout_off(run_config, overrides)):
        if notice:
            print(f"ftl: {notice}", file=sys.stderr)
    if "train.gradient_checkpointing" in {override_key(o) for o in overrides}:
        run_config.strategy.auto_checkpointing = False  # strategy=auto keeps what was typed
    return resolve_paths(run_config, Path.cwd())


def own_eval_set(cfg: RunConfig, overrides: list[str]) -> str | None:
    """`dataset.path=FILE` (or `dataset.sources=[...]`) without `dataset.eval_path`: drop the
    group's eval file and hold out `dataset.eval_fraction` of FILE, or of each source (as
    LLaMA-Factory's val_size and axolotl's val_set_size do). The notice saying what the
    run now evaluates on; None: no change."""
    given = {override_key(override) for override in overrides}
    data = cfg.dataset
    typed = next((key for key in ("dataset.sources", "dataset.path") if key in given), None)
    if typed is None or "dataset.eval_path" in given or not data.eval_path:
        return None
    dropped, data.eval_path = data.eval_path, ""
    # a stream holds nothing out (stream_held_out_off says so next)
    held_out = data.eval_fraction > 0 and not data.streaming
    none = "no eval set" + ("" if data.streaming else " (dataset.eval_fraction=0)")
    if typed == "dataset.sources":  # a mixture holds out its share of every source
        what = (f"evaluating on {data.eval_fraction * 100:g}% of each source "
                f"(dataset.eval_fraction={data.eval_fraction:g})" if held_out else none)
        return (f"dataset.sources: {what}; the dataset group's eval file {dropped} belongs to "
                "its own data. Set dataset.eval_path=FILE to evaluate on another file.")
    name = Path(data.path).name or data.path
    what = (f"evaluating on {data.eval_fraction * 100:g}% of {name} "
            f"(dataset.eval_fraction={data.eval_fraction:g})" if held_out else none)
    return (f"dataset.path={data.path}: {what}; the dataset group's eval file {dropped} "
            "belongs to its own data. Set dataset.eval_path=FILE to evaluate on another file.")


def stream_held_out_off(cfg: RunConfig, overrides: list[str]) -> str | None:
    """dataset.streaming without dataset.eval_path: a preset's eval_fraction cannot hold out
    a share of a stream before it is read, so it turns off (one the user typed stays, for
    validation to refuse with its fix). The notice; None: nothing changed."""
    data = cfg.dataset
    given = {override_key(override) for override in overrides}
    if (not data.streaming or data.eval_path or data.eval_fraction == 0
            or "dataset.eval_fraction" in given):
        return None
    was, data.eval_fraction = data.eval_fraction, 0.0
    return (f"dataset.streaming: the preset's dataset.eval_fraction={was:g} turned off (a "
            "stream's share cannot be held out before it is read); set "
            "dataset.eval_path=FILE to evaluate.")


def expert_lora_dropout_off(cfg: RunConfig, overrides: list[str]) -> str | None:
    """LoRA with all-linear on a mixture of experts: peft adapts the experts' 3-D weights
    and the router as parameters, which take no dropout, so the peft preset's dropout
    turns off (one the user typed stays, for validation/moe.py to refuse with its fix).
    The notice; None: nothing changed."""
    peft = cfg.peft
    given = {override_key(override) for override in overrides}
    if not adapts_experts(cfg) or peft.dropout == 0 or "peft.dropout" in given:
        return None
    was, peft.dropout = peft.dropout, 0.0
    return (f"peft.target_modules=[all-linear] on model={cfg.model.name} adapts its experts "
            f"and router, which take no dropout: the preset's peft.dropout={was:g} turned off.")


EVALUATION = {"train.eval_steps": 0, "train.eval_on_start": False, "train.show_examples": 0}
"""The settings that read the eval set, each with its value for off."""


def preset_evaluation_off(cfg: RunConfig, overrides: list[str]) -> str | None:
    """No eval set (dataset.eval_path empty, dataset.eval_fraction=0): the evaluation settings
    a preset chose (tiny-llama's demo evaluates every 50 steps, on start, and shows 200
    examples) do not fit this data, so they turn off. A value the user typed stays on, for
    rules._eval to refuse with its fix. The notice saying what turned off; None: nothing."""
    data = cfg.dataset
    if data.eval_path or data.eval_fraction != 0:
        return None
    given = {override_key(override) for override in overrides}
    chosen = [key for key in EVALUATION if key not in given and attrgetter(key)(cfg) > 0]
    if not chosen:
        return None
    was = ", ".join(f"{key}={_shown(attrgetter(key)(cfg))}" for key in chosen)
    for key in chosen:
        setattr(cfg.train, key.removeprefix("train."), EVALUATION[key])
    return (f"no eval set (dataset.eval_fraction=0 and no dataset.eval_path): the preset's "
            f"{was} turned off, with nothing to evaluate on. To evaluate, set "
            "dataset.eval_fraction (e.g. 0.05) or dataset.eval_path=FILE.")


def _shown(value: object) -> str:
    """A value as typed on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def to_run_config(cfg: DictConfig) -> RunConfig:
    """DictConfig -> RunConfig dataclasses."""
    typed = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
    run_config = OmegaConf.to_object(typed)
    assert isinstance(run_config, RunConfig)
    return run_config


def load_run_config(path: Path) -> RunConfig:
    """A run dir's resolved config.yaml, typed (the ranks, the doctor, `ftl report`)."""
    return to_run_config(OmegaConf.load(path))


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    # the typed root, which configs/config.yaml's defaults list names
    ConfigStore.instance().store(name="base_config", node=RunConfig)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    _reject_added_keys(cfg, RunConfig())
    return cfg


def _failure(overrides: list[str]) -> Exception | None:
    try:
        _compose(overrides)
    except Exception as error:  # noqa: BLE001
        return error
    return None


def _reject_added_keys(cfg: DictConfig, section: Any) -> None:
    """`+train.x=1` (or `+cluster.slurm.x=1`, at any depth) slips past Hydra's struct check
    on dataclass nodes; refuse it here."""
    known = {f.name for f in fields(section)}
    for key in cfg:
        if key not in known:
            raise KeyError(f"Key '{key}' not in '{type(section).__name__}'")
        child = getattr(section, str(key))
        if is_dataclass(child) and isinstance(cfg[key], DictConfig):
            _reject_added_keys(cfg[key], child)


def _explain(override: str, error: Exception) -> str:
    """One line: the override as typed, what is wrong, and how to fix it."""
    text = f"{error} {error.__cause__ or ''}"
    missing = re.search(r"Could not find '(\w+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        available = re.findall(r"^\t(\S+)$", text.split("Available options")[-1], re.M)
        return (
            f"{group}={option}: no such {group}. Available: {', '.join(available)}. "
            f"Fix: pick one of these, or add configs/{group}/{option}.yaml."
        )
    unknown = re.search(r"Key '([^']+)' not in '(\w+)'", text)
    if unknown:
        return _unknown_key(override, unknown.group(1))
    typed = re.search(r"Value '([^']*)' of type '\w+' could not be converted to (\w+)", text)
    if typed:
        return (
            f"{override}: '{typed.group(1)}' is not a valid {typed.group(2).lower()}. "
            f"Fix: give {override_key(override)} a {typed.group(2).lower()} value."
        )
    if "is not a ListConfig, list or tuple" in text:
        value = override.split("=", 1)[-1]
        return (f"{override}: {override_key(override)} is a list. "
                f"Fix: {override_key(override)}=[{value}] (several: [a,b]).")
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    return f"{override}: {first_line}. Fix: see `ftl plan --help` for the override syntax."


def _unknown_key(override: str, name: str) -> str:
    key = override_key(override)
    node: Any = RunConfig()
    walked: list[str] = []  # the deepest known section on the key's path
    for part in key.split(".")[:-1]:
        if not is_dataclass(child := getattr(node, part, None)):
            break
        node = child
        walked.append(part)
    if walked:
        section, known = ".".join(walked), [f.name for f in fields(node)]
        return (
            f"{override}: unknown key '{name}' in {section}. "
            f"Known keys: {', '.join(known)}. Fix: check the spelling."
        )
    return (
        f"{override}: unknown key '{key}'. Top-level keys are "
        f"{', '.join(f.name for f in fields(RunConfig))}; groups are {', '.join(GROUPS)}."
    )


def override_key(override: str) -> str:
    """The key an override sets, as typed: `+train.x=1` -> train.x."""
    return override.split("=", 1)[0].lstrip("+~")


def resolve_paths(run_config: RunConfig, cwd: Path) -> RunConfig:
    """Make local file paths absolute (ranks may start elsewhere); hub ids stay as given."""
    for section, key in (source.split(".") for source in SOURCES):
        part = getattr(run_config, section)
        setattr(part, key, local_or_as_is(getattr(part, key), cwd))
    dataset = run_config.dataset
    for source in dataset.sources:
        source.path = local_or_as_is(source.path, cwd)
    run_config.run.output_dir = str((cwd / run_config.run.output_dir).resolve())
    if dataset.cache_dir:
        dataset.cache_dir = str((cwd / os.path.expanduser(dataset.cache_dir)).resolve())
    return run_config


def local_or_as_is(path: str, cwd: Path | None = None) -> str:
    """An existing local path, looked up in `cwd` (default: the working directory) and then
    the project root (where the bundled data/ and assets/ live), made absolute; anything
    else (a hub id, a missing file) as given."""
    path = os.path.expanduser(path)
    if not path or os.path.isabs(path):
        return path
    for base in (cwd or Path.cwd(), PROJECT_ROOT):
        if (base / path).exists():
            return str((base / path).resolve())
    return path
