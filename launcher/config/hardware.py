"""GPU presets: the numbers validation, the planner and the estimator share.

Peak figures are dense (no sparsity) tensor-core TFLOP/s from the vendors' data sheets;
`cpu` stands for this launcher's CPU mode, where each "GPU" is one process.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_gib: float
    supports_fp16: bool
    supports_bf16: bool
    peak_tflops_16bit: float
    peak_tflops_fp32: float
    is_cpu: bool = False
    intra_node_busbw_gb_s: float = 0.0
    """All-reduce bus bandwidth (nccl-tests busbw, large messages) across the GPUs of one
    8-GPU NVLink node: typical published nccl-tests figures, not measured here; `ftl
    doctor` fails a node below half of it. 0: no figure (cpu)."""
    compute_capability: tuple[int, int] = (0, 0)
    """CUDA compute capability (major, minor): 7.0 Volta, 8.0 Ampere, 9.0 Hopper; what the
    attention kernels need (launcher/validation/speed.py). (0, 0): no CUDA device (cpu)."""


GPU_PRESETS: dict[str, GpuPreset] = {
    preset.name: preset
    for preset in (
        GpuPreset("cpu", 24.0, False, True, 0.5, 0.5, is_cpu=True),
        GpuPreset("v100-32g", 32.0, True, False, 125.0, 15.7, intra_node_busbw_gb_s=130.0,
                  compute_capability=(7, 0)),
        GpuPreset("a100-40g", 40.0, True, True, 312.0, 19.5, intra_node_busbw_gb_s=230.0,
                  compute_capability=(8, 0)),
        GpuPreset("a100-80g", 80.0, True, True, 312.0, 19.5, intra_node_busbw_gb_s=230.0,
                  compute_capability=(8, 0)),
        GpuPreset("h100-80g", 80.0, True, True, 989.0, 67.0, intra_node_busbw_gb_s=450.0,
                  compute_capability=(9, 0)),
        GpuPreset("h200-141g", 141.0, True, True, 989.0, 67.0, intra_node_busbw_gb_s=450.0,
                  compute_capability=(9, 0)),
    )
}


def gpu_preset(name: str) -> GpuPreset:
    """The preset called `name`; validation has already rejected unknown names."""
    return GPU_PRESETS[name]


def is_gpu_preset(name: str) -> bool:
    """Whether cluster.gpu=`name` is a known GPU preset: False for cpu, and for an unknown
    name, which validation reports on its own (rules.CHOICES)."""
    preset = GPU_PRESETS.get(name)
    return preset is not None and not preset.is_cpu
