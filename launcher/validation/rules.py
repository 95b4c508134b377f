"""Configuration rules: pure functions of a RunConfig, each returning its problems, each
naming the key as typed, its value and the fix (the one stage: launcher/validation/validate.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import asdict
from operator import attrgetter
from pathlib import Path

from launcher.config.architecture import is_moe, kv_width
from launcher.config.hardware import GPU_PRESETS
from launcher.config.objectives import OBJECTIVES
from launcher.config.report_to import name_problems as tracker_names
from launcher.config.schema import NO_SCHEDULER, RunConfig
from launcher.config.strategies import strategy_table
from launcher.data.formats import FIELDS, FORMATS, PREFERENCE, unknown_renames
from launcher.data.mixture import EXHAUSTED
from launcher.engines import backend_problems, engine_of
from launcher.engines.deepspeed.ds_config import OPTIMIZERS, PRECISIONS
from launcher.engines.parallel_rules import engine_support_problems, model_parallel_problems
from launcher.errors import flagged
from launcher.schedulers.base import DEFAULT_SCHEDULER, SCHEDULERS
from launcher.validation.evaluation import eval_rules
from launcher.validation.mixture import mixture_problems
from launcher.validation.moe import architecture_problems
from launcher.validation.objective import objective_problems
from launcher.validation.speed import ATTENTION, speed_problems

CHOICES: dict[str, tuple[str, ...]] = {
    "precision.name": PRECISIONS,
    "cluster.launcher": ("torchrun", "deepspeed"),
    "cluster.gpu": tuple(GPU_PRESETS),
    "model.attn_implementation": ATTENTION,
    "peft.name": ("none", "lora", "qlora"),
    "objective.name": OBJECTIVES,
    "dataset.format": FORMATS,
    "dataset.template": ("auto", "builtin"),
    "dataset.exhausted": tuple(EXHAUSTED),
    "train.optimizer": OPTIMIZERS,
    "train.lr_scheduler": ("cosine", "linear", "constant", "constant_with_warmup", "polynomial"),
}


def choices() -> dict[str, tuple[str, ...]]:
    """Every key checked against a list (read at the call: a scheduler may register after
    import)."""
    return {**CHOICES, "cluster.scheduler": (NO_SCHEDULER, *SCHEDULERS)}


DATA_CHOICES = ("dataset.format", "dataset.template", "dataset.exhausted")


def config_problems(cfg: RunConfig) -> list[str]:
    """Rules on the values as given (strategy=auto not yet resolved): training's, then the
    data's."""
    rules: list[Callable[[RunConfig], list[str]]] = [
        _choices, _positive, _precision, _batch, _model, _eval, _callbacks, _multi_node,
        _plain_names, model_parallel_problems, architecture_problems, _watchdog,
        tracker_names, objective_problems, eval_rules, speed_problems, data_problems,
    ]
    return [problem for rule in rules for problem in rule(cfg)]


def data_problems(cfg: RunConfig) -> list[str]:
    """Rules on what preprocessing reads, all that `ftl preprocess` checks: the dataset's
    keys, the tokenizer source and the sizes of one global batch, which the data must fill
    (train.seed, any int, picks the eval split). Training's rules, not checked there: the
    other counts and steps, the choices of precision, strategy, peft, optimizer and
    scheduler, precision on the GPU, global_batch_size, the model's shape and
    dataset.max_length against its positions (the cache is keyed by the tokenizer, not the
    model), evaluation, callbacks, the multi-node hostfile, model parallelism, the
    watchdog, trackers, the speed switches and run.name."""
    data, model = cfg.dataset, cfg.model
    positive = [f"{key}={attrgetter(key)(cfg)}: {why}"
                for key, wrong, why in _positive_checks(cfg, DATA_POSITIVE) if wrong]
    return _not_one_of(cfg, DATA_CHOICES) + positive + flagged([
        (not model.tokenizer and not model.path,
         f"model.tokenizer: empty, and model.path is empty too (model={model.name}). "
         "Fix: set model.tokenizer to a tokenizer directory or hub id."),
        (not 0 <= data.eval_fraction < 1,
         f"dataset.eval_fraction={data.eval_fraction}: a share of the data in [0, 1). "
         "Fix: e.g. dataset.eval_fraction=0.02, or 0 with no eval set."),
        (data.packing and data.format == PREFERENCE,
         f"dataset.packing=true with dataset.format={PREFERENCE}: a pair is a prompt run "
         "with each of its two answers (TRL's DPOTrainer batches pairs, not packed rows). "
         "Fix: dataset.packing=false."),
    ]) + _columns(cfg) + _plain_names(cfg, ["dataset.name"]) + mixture_problems(cfg)


def strategy_problems(cfg: RunConfig) -> list[str]:
    """Rules on the strategy the run will use (after strategy=auto is resolved)."""
    if backend_problems(cfg.strategy):
        return []  # config_problems names it
    return _strategy(cfg) + _peft(cfg)


def _not_one_of(cfg: RunConfig, keys: Iterable[str]) -> list[str]:
    allowed = choices()
    return [f"{key}={value}: not one of {', '.join(allowed[key])}. Fix: pick one."
            for key in keys if (value := attrgetter(key)(cfg)) not in allowed[key]]


def _choices(cfg: RunConfig) -> list[str]:
    problems = _not_one_of(cfg, [key for key in choices() if key not in DATA_CHOICES])
    problems += backend_problems(cfg.strategy)
    table = strategy_table()
    if cfg.strategy.name not in table:
        problems.append(
            f"strategy.name={cfg.strategy.name}: no configs/strategy/{cfg.strategy.name}.yaml. "
            f"Fix: strategy=NAME with one of {', '.join(table)}."
        )
    return problems


POSITIVE = (
    "cluster.nodes", "cluster.gpus_per_node", "train.micro_batch_size", "train.grad_accum",
    "train.lr", "train.save_steps", "train.logging_steps", "dataset.max_length", "train.mfu",
    "cluster.startup_timeout_s",
)
DATA_POSITIVE = ("dataset.max_length", "train.micro_batch_size", "train.grad_accum",
                 "cluster.nodes", "cluster.gpus_per_node")
"""What preprocessing reads of POSITIVE: the length, and one global batch of rows
(launcher/data/loading.py's _check_batch)."""


def _positive(cfg: RunConfig) -> list[str]:
    train, cluster = cfg.train, cfg.cluster
    checks: list[tuple[str, bool, str]] = [  # key, whether its value is wrong, why and fix
        *_positive_checks(cfg, [key for key in POSITIVE if key not in DATA_POSITIVE]),
        ("train.max_steps", train.max_steps == 0 or train.max_steps < -1,
         "must be a positive step count, or -1 to run train.epochs epochs. "
         "Fix: e.g. train.max_steps=1000."),
        ("train.epochs", train.max_steps == -1 and train.epochs <= 0,
         "must be greater than 0 when train.max_steps=-1. "
         "Fix: train.epochs=1 or set train.max_steps."),
        ("train.save_total_limit", train.save_total_limit < 0 or train.save_total_limit == 1,
         "keep 0 (all checkpoints) or at least 2; with 1 the oldest is deleted before the "
         "newest is complete, so a crash then leaves nothing to resume from. "
         "Fix: train.save_total_limit=2."),
        ("train.eval_steps", train.eval_steps < 0, "must be >= 0 (0: at the end)."),
        ("train.warmup_ratio", not 0 <= train.warmup_ratio < 1, "must be in [0, 1)."),
        ("train.mfu", train.mfu > 1, "a utilisation in (0, 1]. Fix: e.g. 0.4."),
        ("cluster.master_port", not 0 < cluster.master_port < 65536, "not a TCP port."),
        ("cluster.network_gb_s", cluster.network_gb_s < 0,
         "a bandwidth >= 0 (0: unknown). Fix: e.g. cluster.network_gb_s=0."),
    ]
    return [f"{key}={attrgetter(key)(cfg)}: {why}" for key, wrong, why in checks if wrong]


def _positive_checks(cfg: RunConfig, keys: Iterable[str]) -> list[tuple[str, bool, str]]:
    return [(key, attrgetter(key)(cfg) <= 0,
             f"must be greater than 0. Fix: set {key} to a positive value.") for key in keys]


def _precision(cfg: RunConfig) -> list[str]:
    name, gpu = cfg.precision.name, cfg.cluster.gpu
    preset = GPU_PRESETS.get(gpu)
    if preset is None:
        return []
    where = "CPU training (cluster.gpu=cpu)" if preset.is_cpu else f"cluster.gpu={gpu}"
    return flagged([
        (name == "fp16" and not preset.supports_fp16,
         f"precision=fp16: {where} cannot run fp16 mixed precision. "
         "Fix: precision=bf16 or precision=fp32 here, or a GPU preset (cluster.gpu=a100-80g)."),
        (name == "bf16" and not preset.supports_bf16,
         f"precision=bf16: cluster.gpu={gpu} has no bf16 support. "
         "Fix: precision=fp16 (AMP with loss scaling) or a newer preset (cluster.gpu=a100-80g)."),
    ])


def _strategy(cfg: RunConfig) -> list[str]:
    strategy, engine = cfg.strategy, engine_of(cfg.strategy)
    problems = engine.problems(cfg)
    if cfg.cluster.launcher not in engine.launchers:
        problems.append(
            f"strategy={strategy.name} with cluster.launcher={cfg.cluster.launcher}: the "
            f"{engine.name} engine is started by {' or '.join(engine.launchers)} only. "
            f"Fix: cluster.launcher={engine.launchers[0]}."
        )
    return problems + engine_support_problems(cfg)


def _batch(cfg: RunConfig) -> list[str]:
    train, requested = cfg.train, cfg.train.global_batch_size
    if requested is None or min(train.micro_batch_size, train.grad_accum, cfg.dp_size) <= 0:
        return []
    actual = train.micro_batch_size * train.grad_accum * cfg.dp_size
    if requested == actual:
        return []
    per_step = train.micro_batch_size * cfg.dp_size
    fix = (
        f"train.grad_accum={requested // per_step}"
        if requested % per_step == 0
        else "a train.global_batch_size divisible by train.micro_batch_size x data-parallel "
        f"size ({per_step})"
    )
    return [
        f"train.global_batch_size={requested}: train.micro_batch_size x train.grad_accum x "
        "data-parallel size (cluster.nodes x cluster.gpus_per_node / (parallel.tp x "
        f"parallel.sp)) = "
        f"{train.micro_batch_size} x {train.grad_accum} x {cfg.dp_size} = {actual}. Fix: {fix}."
    ]


def _model(cfg: RunConfig) -> list[str]:
    model = cfg.model
    return flagged([
        (model.num_heads <= 0 or (not model.head_dim and model.hidden_size % model.num_heads),
         f"model.num_heads={model.num_heads}: must divide model.hidden_size="
         f"{model.hidden_size} (model.head_dim=0: each head is hidden_size / num_heads "
         "wide). Fix: correct the model's architecture numbers, or set model.head_dim."),
        (model.num_kv_heads <= 0 or model.num_heads % max(model.num_kv_heads, 1),
         f"model.num_kv_heads={model.num_kv_heads}: must divide model.num_heads="
         f"{model.num_heads}. Fix: correct the model's architecture numbers."),
        (cfg.dataset.max_length > model.max_position_embeddings,
         f"dataset.max_length={cfg.dataset.max_length}: longer than the model's "
         f"model.max_position_embeddings={model.max_position_embeddings}. "
         f"Fix: dataset.max_length={model.max_position_embeddings} or less."),
    ])


def _peft(cfg: RunConfig) -> list[str]:
    peft, qlora = cfg.peft, cfg.peft.name == "qlora"
    return flagged([
        (peft.name != "none" and (peft.r <= 0 or peft.alpha <= 0),
         f"peft.r={peft.r}, peft.alpha={peft.alpha}: both must be positive."),
        (peft.name == "lora" and peft.bits != 16,
         f"peft.bits={peft.bits} with peft=lora: LoRA trains on a 16-bit (unquantized) base. "
         "Fix: peft.bits=16, or peft=qlora for a 4-bit base."),
        (qlora and peft.bits != 4,
         f"peft.bits={peft.bits} with peft=qlora: only 4-bit NF4 bases are supported "
         "(8-bit LLM.int8 bases are not). Fix: peft.bits=4, or peft=lora for a 16-bit base."),
        (qlora and not cfg.model.path,
         f"peft=qlora with model={cfg.model.name}: 4-bit loading quantizes existing weights, "
         "and model.path is empty. Fix: set model.path to a saved model, or use peft=lora."),
    ]) + _qlora_on_cpu(cfg) + _qlora_installed(cfg)


QLORA_CPU_BLOCK = 32
"""bitsandbytes 0.50's CPU 4-bit kernel (functional._convert_weight_packed_for_cpu, taken for
no-grad forwards such as evaluation on CPUs with AVX512-BF16) packs each quantized layer's
output features in blocks of 32 and asserts on any other size."""


def _qlora_on_cpu(cfg: RunConfig) -> list[str]:
    preset = GPU_PRESETS.get(cfg.cluster.gpu)
    if cfg.peft.name != "qlora" or preset is None or not preset.is_cpu:
        return []
    model = cfg.model
    sizes = {"model.hidden_size": model.hidden_size,
             "model.num_kv_heads x head size": kv_width(model)}
    if not is_moe(model):  # an MoE layer's experts are 3-D weights, not quantized linears
        sizes["model.intermediate_size"] = model.intermediate_size
    return [
        f"{key}={value} with peft=qlora on cluster.gpu=cpu: bitsandbytes' CPU 4-bit kernel "
        f"packs output features in blocks of {QLORA_CPU_BLOCK}. Fix: a model whose layer "
        f"sizes are multiples of {QLORA_CPU_BLOCK}, peft=lora, or a GPU preset."
        for key, value in sizes.items()
        if value % QLORA_CPU_BLOCK
    ]


def _qlora_installed(cfg: RunConfig) -> list[str]:
    """Refused here, not as an ImportError on every rank after the launch. bitsandbytes is
    an extra (pyproject.toml): heavy, and only QLoRA uses it."""
    if cfg.peft.name != "qlora" or _module_exists("bitsandbytes"):
        return []
    return [
        "peft=qlora: bitsandbytes (QLoRA's 4-bit kernels) is not installed in this "
        "environment. Fix: pip install 'ftlaunch[qlora]' (from a checkout: pip install -e "
        "'.[qlora]'), or peft=lora."
    ]


def _multi_node(cfg: RunConfig) -> list[str]:
    cluster = cfg.cluster
    if cluster.scheduler != NO_SCHEDULER or cluster.nodes == 1 or \
            cluster.launcher != "deepspeed" or cluster.hostfile:
        return []
    return [
        f"cluster.nodes={cluster.nodes} with cluster.launcher=deepspeed on "
        f"cluster={cluster.name}: deepspeed needs a hostfile naming the nodes. "
        "Fix: cluster.hostfile=PATH (lines like `worker-1 slots=8`), or "
        f"cluster={DEFAULT_SCHEDULER}."
    ]


def _eval(cfg: RunConfig) -> list[str]:
    """With no eval set, compose.preset_evaluation_off has turned a preset's evaluation
    settings off: what is still on here, the user typed."""
    data, train = cfg.dataset, cfg.train
    no_eval_set = not data.eval_path and data.eval_fraction == 0
    # the prompts launcher/inference/examples.py answers are the eval set's
    asked = {key: off for key, value, off in (
        (f"train.eval_steps={train.eval_steps}", train.eval_steps > 0, "train.eval_steps=0"),
        ("train.eval_on_start=true", train.eval_on_start, "train.eval_on_start=false"),
        (f"train.show_examples={train.show_examples}", train.show_examples > 0,
         "train.show_examples=0"),
    ) if value}
    return flagged([
        (no_eval_set and asked,
         f"{' and '.join(asked)}: there is no eval set (dataset.eval_path is empty and "
         "dataset.eval_fraction=0). Fix: set dataset.eval_path or dataset.eval_fraction, "
         f"or {' '.join(asked.values())} to train without evaluation."),
        (train.show_examples < 0,
         f"train.show_examples={train.show_examples}: a number of held-out "
         "prompts, >= 0. Fix: e.g. train.show_examples=20, or 0 for none."),
    ])


def _columns(cfg: RunConfig) -> list[str]:
    data = cfg.dataset
    if data.format not in FIELDS:
        return []  # data_problems reports the format
    renames = asdict(data.columns)
    return [
        f"dataset.columns.{name}={renames[name]}: dataset.format={data.format} has no "
        f"field {name!r}. Fix: rename one of its fields ({', '.join(FIELDS[data.format])})."
        for name in unknown_renames(data.format, renames)
    ]


def _callbacks(cfg: RunConfig) -> list[str]:
    problems = []
    for index, spec in enumerate(cfg.train.callbacks):
        target = spec.get("_target_") if isinstance(spec, dict) else None
        key = f"train.callbacks[{index}]"
        if not isinstance(target, str) or "." not in target:
            problems.append(
                f"{key}={spec}: needs _target_: module.Class. "
                "Fix: e.g. {_target_: mypkg.callbacks.MyCallback, some_arg: 1}."
            )
        elif not _module_exists(module := target.rsplit(".", 1)[0]):
            problems.append(
                f"{key}._target_={target}: module {module} is not importable "
                "here (the ranks start in this directory). Fix: check the dotted path."
            )
    return problems


def _watchdog(cfg: RunConfig) -> list[str]:
    """The hang watchdog's bounds (launcher/rank/watchdog.py)."""
    train = cfg.train
    if train.hang_timeout_s <= 0:
        return []
    if train.first_step_timeout_s <= 0:
        return [f"train.first_step_timeout_s={train.first_step_timeout_s}: must be greater "
                "than 0 while the watchdog is on (train.hang_timeout_s="
                f"{train.hang_timeout_s}). Fix: e.g. train.first_step_timeout_s=3600, or "
                "train.hang_timeout_s=0 to turn the watchdog off."]
    if train.first_step_timeout_s < train.hang_timeout_s:
        return [f"train.first_step_timeout_s={train.first_step_timeout_s}: shorter than "
                f"train.hang_timeout_s={train.hang_timeout_s}, but the first step also loads "
                "and compiles. Fix: train.first_step_timeout_s="
                f"{train.hang_timeout_s:g} or more."]
    return []


def _module_exists(module: str) -> bool:
    """Importable from the installed packages, or as a file under the working directory
    (the ranks run `python -m launcher.rank.worker` from it, which puts it on sys.path)."""
    local = Path.cwd().joinpath(*module.split("."))
    if local.with_suffix(".py").is_file() or (local / "__init__.py").is_file():
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


WRITTEN_NAMES = {  # key: its root, where it goes, a plain name (the roots are the user's)
    "run.name": ("run.output_dir", "the run dir is run.output_dir/run.name/<time>", "my-run"),
    "dataset.name": ("the data cache", "dataset.cache_dir/dataset.name-<key>", "my-data"),
}


def _plain_names(cfg: RunConfig, keys: Iterable[str] = ("run.name",)) -> list[str]:
    """A config value that becomes a folder of a written path stays one plain folder name: a
    slash, `..` or an absolute path would write outside its root (dataset.name:
    data_problems')."""
    problems = []
    for key in keys:
        root, layout, example = WRITTEN_NAMES[key]
        value = str(attrgetter(key)(cfg))
        parts = value.split("/")
        if value.startswith("/") or ".." in parts:
            reason = "leaves"
        elif len(parts) > 1 or value in ("", "."):
            reason = "is not one folder in"
        else:
            continue
        plain = "-".join(part for part in parts if part not in ("", ".", "..")) or example
        problems.append(f"{key}={value!r} {reason} {root} ({layout}). "
                        f"Fix: a plain name such as {key}={plain}.")
    return problems
