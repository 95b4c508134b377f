"""Two published model-state accountings, kept as test oracles for launcher/memory.py.

- ZeRO paper: Rajbhandari et al. 2019 (arXiv 1910.02054), 2 + 2 + K bytes per parameter
  (16-bit params, 16-bit grads, K=12 fp32 master + Adam m, v), split over Nd by stage. Its
  table (psi=7.5e9, Nd=64): 120 / 31.4 / 16.6 / 1.9 GB.
- DeepSpeed: its own `estimate_zero2_model_states_mem_needs` and
  `estimate_zero3_model_states_mem_needs`, reproduced to the byte (the tests call them):
  18 bytes per partitioned parameter (they also count fp32 gradients), ZeRO-3 adds
  4 bytes x the largest layer, host figures carry `additional_buffer_factor` 1.5. They
  assume 16-bit training whatever the precision, and under-count ZeRO-3 by one 16-bit
  partition (2*psi/N), which is why production uses the engine accounting instead.
"""

from __future__ import annotations

from launcher.flops import count_params, largest_layer_params
from launcher.memory import DEEPSPEED_BUFFER_FACTOR
from launcher.schema import RunConfig, StrategyConfig
from launcher.strategies import effective_zero_stage


def zero_paper_model_states(psi: float, nd: int, stage: int, k: int = 12) -> float:
    """Bytes per GPU per the ZeRO paper: (2 + 2 + K)*psi, stage 1 splits K, 2 grads, 3 all."""
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / nd
    if stage == 2:
        return 2 * psi + (2 + k) * psi / nd
    return (4 + k) * psi / nd


def zero_paper_offload(
    psi: float, nd: int, gpus_per_node: int, offload_param: bool
) -> tuple[float, float]:
    """(gpu, host per node) bytes with ZeRO-Offload/Infinity: optimizer + 16-bit grads on CPU.

    The paper counts no gathered layer: with parameters offloaded the GPU holds nothing
    persistent, so its model-state figure is 0 (activations and buffers still count).
    """
    gpu = 0.0 if offload_param else 2 * psi
    host_per_rank = (14 + (2 if offload_param else 0)) * psi / nd
    return gpu, host_per_rank * gpus_per_node


def deepspeed_model_states(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int,
    num_nodes: int,
    zero_stage: int,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    additional_buffer_factor: float = DEEPSPEED_BUFFER_FACTOR,
) -> tuple[int, int]:
    """(host bytes per node, GPU bytes per GPU) exactly as DeepSpeed's estimators say.

    Stage 2 mirrors `estimate_zero2_model_states_mem_needs`, stage 3
    `estimate_zero3_model_states_mem_needs` (zero_init=True). Stage 1 uses the stage-2
    function (DeepSpeed has no stage-1 estimator; both stages run DeepSpeedZeroOptimizer
    and held the same bytes when measured). Stage 0 is the ZeRO paper's 16 bytes per
    parameter (no DeepSpeed function).
    """
    psi, factor = total_params, additional_buffer_factor
    total_gpus = num_nodes * num_gpus_per_node
    if zero_stage == 0:
        return int(psi * 4 * num_gpus_per_node * factor), 16 * psi
    if zero_stage in (1, 2):
        if offload_optimizer:
            return int(psi * max(4 * total_gpus, 16) * factor), 2 * psi
        return int(psi * 4 * num_gpus_per_node * factor), 2 * psi + int(18 * psi / total_gpus)
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if offload_optimizer and offload_param:
        return int(psi * 18 * gpus_factor * factor), largest_layer_memory
    if offload_optimizer:
        gpu = largest_layer_memory + int(2 * psi / total_gpus)
        return int(psi * 16 * gpus_factor * factor), gpu
    gpu = largest_layer_memory + int(18 * psi / total_gpus)
    return int(largest_layer_params * 4 * num_gpus_per_node * factor), gpu


def zero_paper_bytes(cfg: RunConfig, strategy: StrategyConfig) -> tuple[float, float]:
    """(GPU bytes per GPU, host bytes per node) of cfg's full fine-tune per the ZeRO paper."""
    psi, n = count_params(cfg.model), cfg.world_size
    if strategy.offload_optimizer:
        return zero_paper_offload(psi, n, cfg.cluster.gpus_per_node, strategy.offload_param)
    return zero_paper_model_states(psi, n, effective_zero_stage(strategy)), 0.0


def deepspeed_bytes(cfg: RunConfig, strategy: StrategyConfig) -> tuple[float, float]:
    """(GPU bytes per GPU, host bytes per node) of cfg's full fine-tune per DeepSpeed."""
    host, gpu = deepspeed_model_states(
        count_params(cfg.model), largest_layer_params(cfg.model), cfg.cluster.gpus_per_node,
        cfg.cluster.nodes, effective_zero_stage(strategy), strategy.offload_optimizer,
        strategy.offload_param,
    )
    return float(gpu), float(host)
