"""Whether the trained model fits one device for inference (`ftl eval`, `ftl chat`): its
weights in the training precision, the KV cache and logits of one batch of `eval.batch_size`
sequences of `dataset.max_length` tokens (the harness's loglikelihood tasks score every
position, so the logits of the whole batch are live at once), and the framework allowance.
One process: a model over one device's share spreads over the node's GPUs with `ftl eval
--shard`, whose device count is given. Weights only in the precision the run saves (ftl
eval loads `dtype=auto`); not measured here (no GPU), a sum of the sizes above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.config.architecture import count_params, kv_width
from launcher.config.hardware import gpu_preset
from launcher.config.schema import RunConfig
from launcher.estimator.memory import (
    CPU_FRAMEWORK_BUFFER_BYTES,
    FIT_FRACTION,
    FRAMEWORK_BUFFER_BYTES,
    GIB,
    INFERENCE_LOGITS_BYTES_PER_ELEMENT,
    param_bytes,
)


@dataclass
class InferenceEstimate:
    weight_bytes: float
    batch_bytes: float
    """KV cache plus logits of one batch of eval.batch_size x dataset.max_length tokens."""
    buffer_bytes: float
    total_bytes: float
    capacity_bytes: float
    """One device (gpu=cpu: the node's host memory, one process)."""
    fits: bool
    shard_devices: int
    """Devices `--shard` needs (weights split, the batch on each); 0: more than a node has."""


def inference_estimate(cfg: RunConfig) -> InferenceEstimate:
    model, p = cfg.model, param_bytes(cfg.precision.name)
    weights = count_params(model) * p
    tokens = cfg.eval.batch_size * cfg.dataset.max_length
    kv = 2 * model.num_layers * kv_width(model) * tokens * p
    batch = kv + tokens * model.vocab_size * INFERENCE_LOGITS_BYTES_PER_ELEMENT[p]
    preset = gpu_preset(cfg.cluster.gpu)
    buffers = CPU_FRAMEWORK_BUFFER_BYTES if preset.is_cpu else FRAMEWORK_BUFFER_BYTES
    capacity = preset.memory_gib * GIB
    total = weights + batch + buffers
    room = FIT_FRACTION * capacity - batch - buffers  # for weights, on each device
    needed = math.ceil(weights / room) if room > 0 else 0
    devices = needed if 0 < needed <= cfg.cluster.gpus_per_node and not preset.is_cpu else 0
    return InferenceEstimate(weights, batch, buffers, total, capacity,
                             total <= FIT_FRACTION * capacity, devices)

