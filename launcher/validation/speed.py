"""Rules for the speed switches: model.attn_implementation, train.liger_kernel and
train.compile (docs/guide.md, "Speed switches"). Each needs something of the GPU preset,
the precision, the installed packages or sequence parallelism that it would otherwise
report as an ImportError or a kernel error on every rank, minutes after the launch.

"Installed" is asked with importlib.util.find_spec: nothing here imports torch or a
kernel package (`ftl plan` and `ftl estimate` stay light: tests/unit/test_cli.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from launcher.config.hardware import GPU_PRESETS
from launcher.config.schema import RunConfig
from launcher.errors import flagged

ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
"""model.attn_implementation's values: transformers' names for the attention kernels."""
ULYSSES_CORES = ("sdpa", "flash_attention_2", "flash_attention_3")
"""What Ulysses (parallel.sp > 1) can wrap: accelerate and DeepSpeed refuse eager (it
builds the 4-D mask Ulysses drops) and flex_attention."""


@dataclass(frozen=True)
class Flash:
    """What a FlashAttention version needs: its module, the GPU generation, its install."""

    title: str
    module: str
    capability: tuple[int, int]
    generation: str
    install: str


FLASH: dict[str, Flash] = {
    "flash_attention_2": Flash(
        "FlashAttention-2", "flash_attn", (8, 0), "Ampere (compute capability 8.0) or newer",
        "pip install flash-attn --no-build-isolation"),
    # transformers 5.24 itself accepts 8.0; FlashAttention-3's kernels are Hopper's (its
    # README: H100/H800), so an Ampere preset is sent to FlashAttention-2 instead.
    "flash_attention_3": Flash(
        "FlashAttention-3", "flash_attn_interface", (9, 0), "Hopper (compute capability 9.0)",
        "build it from the flash-attention repository's hopper/ folder "
        "(cd flash-attention/hopper && python setup.py install)"),
}
GPU_EXAMPLE = {"flash_attention_2": "a100-80g", "flash_attention_3": "h100-80g"}


def speed_problems(cfg: RunConfig) -> list[str]:
    """Every refusal of the three switches (an unknown attention name: rules.CHOICES)."""
    if cfg.cluster.gpu not in GPU_PRESETS:
        return []  # rules.CHOICES names it
    return _attention(cfg) + _ulysses_core(cfg) + _liger(cfg)


def _attention(cfg: RunConfig) -> list[str]:
    attn, preset = cfg.model.attn_implementation, GPU_PRESETS[cfg.cluster.gpu]
    key = f"model.attn_implementation={attn}"
    if attn == "flex_attention" and preset.is_cpu:
        return [f"{key} on cluster.gpu=cpu: torch's FlexAttention has no backward on CPU "
                "(torch 2.13: `NotImplementedError: FlexAttention does not support backward "
                "on CPU` at the first training forward). Fix: model.attn_implementation=sdpa "
                "here, or a GPU preset."]
    flash = FLASH.get(attn)
    if flash is None:
        return []
    if preset.is_cpu:
        return [f"{key} on cluster.gpu=cpu: {flash.title} runs on CUDA GPUs only. Fix: "
                "model.attn_implementation=sdpa (torch's fused attention, on CPU too), or "
                f"a GPU preset (cluster.gpu={GPU_EXAMPLE[attn]})."]
    major, minor = preset.compute_capability
    return flagged([
        (preset.compute_capability < flash.capability,
         f"{key} with cluster.gpu={preset.name} (compute capability {major}.{minor}): "
         f"{flash.title} needs {flash.generation}. Fix: model.attn_implementation=sdpa"
         f"{' or flash_attention_2' if attn == 'flash_attention_3' and major >= 8 else ''}"
         f", or cluster.gpu={GPU_EXAMPLE[attn]}."),
        (cfg.precision.name == "fp32",
         f"{key} with precision=fp32: {flash.title} computes in fp16 and bf16 only, and "
         "without mixed precision the fp32 activations reach it as they are. Fix: "
         "precision=bf16, or model.attn_implementation=sdpa."),
        (not installed(flash.module),
         f"{key}: {flash.title} (the {flash.module} module) is not installed in this "
         f"environment, which the ranks run in. Fix: {flash.install}; or "
         "model.attn_implementation=sdpa."),
    ])


def _ulysses_core(cfg: RunConfig) -> list[str]:
    """With parallel.sp > 1 the model's attention is also the core that Ulysses wraps
    (launcher/engines/deepspeed/ulysses.py passes it on): one key, so the two never
    disagree (DeepSpeed raises when they do)."""
    attn, sp = cfg.model.attn_implementation, cfg.parallel.sp
    if sp <= 1 or attn not in ATTENTION or attn in ULYSSES_CORES:
        return []
    return [f"model.attn_implementation={attn} with parallel.sp={sp}: Ulysses sequence "
            f"parallelism wraps the model's attention and takes {', '.join(ULYSSES_CORES)} "
            "only (eager builds the attention mask Ulysses drops; accelerate refuses "
            "flex_attention). Fix: model.attn_implementation=sdpa, or parallel.sp=1."]


def _liger(cfg: RunConfig) -> list[str]:
    """Liger's kernels are Triton's, and Triton has no CPU backend: measured on the cpu
    preset, liger_kernel missing: ImportError; triton missing: ModuleNotFoundError; with
    both: `RuntimeError: 0 active drivers` at the first forward."""
    if not cfg.train.liger_kernel:
        return []
    if GPU_PRESETS[cfg.cluster.gpu].is_cpu:
        return ["train.liger_kernel=true on cluster.gpu=cpu: Liger's kernels are Triton GPU "
                "kernels and fail at the first forward on CPU. Fix: train.liger_kernel=false "
                "here, or a GPU preset (cluster.gpu=a100-80g)."]
    if not installed("liger_kernel"):
        return ["train.liger_kernel=true: liger-kernel (the liger_kernel module) is not "
                "installed in this environment, which the ranks run in. Fix: pip install "
                "liger-kernel, or train.liger_kernel=false."]
    return []


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False

