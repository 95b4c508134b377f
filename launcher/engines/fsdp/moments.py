"""FSDP2 peak-memory moments (launcher/estimator/peak_terms.py terms)."""

from __future__ import annotations

from launcher.estimator.peak_terms import (
    LoraInputs,
    PeakInputs,
    Split,
    larger,
    per_param_temporaries,
    placed,
)


def fsdp_moments(x: PeakInputs, offload: bool) -> dict[str, Split]:
    """FSDP2: fp32 shards 4psi/N + Adam 8psi/N; the forward unshards a layer at a time (p
    bytes under a 16-bit MixedPrecisionPolicy: derived), the backward holds one unsharded
    layer's params and two layers' unsharded grads before reduce-scatter, plus the sharded
    grads 4psi/N. CPUOffloadPolicy keeps shards, grads and Adam on the host (measured on
    the cpu preset: byte-identical to fsdp there; the GPU/host split is derived)."""
    psi, p, part = x.psi, x.p, x.psi / x.n
    layer = p * x.layer_psi
    kept = p * psi if not x.reshard_after_forward else 2.0 * layer  # unsharded params
    forward = x.acts + x.recompute + kept
    backward = 3.0 * layer + (kept - 2.0 * layer)
    states = 12.0 * part
    grads = 4.0 * part
    fwd_bwd = larger(placed(offload, forward, states),
                     placed(offload, backward, states + grads))
    temps = per_param_temporaries(x, x.largest_tensor / x.n)
    # FULL_STATE_DICT: rank 0 gathers the full fp32 Adam state (8psi), offloaded to its host
    # tensor by tensor (accelerate's StateDictOptions(cpu_offload=True))
    save = 8.0 * psi if x.gather_on_save else 0.0
    rank0 = placed(offload, 0.0, states)
    # the full fp32 model: built on rank 0's host, allocated but never written on the other
    # ranks' (launcher/model.unfilled_model: the allocator counts it, RSS does not), then
    # sharded onto the device
    return {"construction": (4.0 * part, 4.0 * psi), "between_steps": rank0,
            "forward_backward": fwd_bwd,
            "optimizer_step": placed(offload, 0.0, states + grads + temps),
            "checkpoint": (rank0[0], rank0[1] + save), "checkpoint_other_ranks": rank0}


def lora_fsdp_moments(x: PeakInputs, lo: LoraInputs, offload: bool) -> dict[str, Split]:
    """FSDP2 shards base and adapters alike (the model's bytes / N) + Adam 8a/N. Measured
    peak at the backward's start: three unsharded layers (p bytes per parameter under a
    16-bit MixedPrecisionPolicy: derived) while every activation still lives. The
    Trainer's checkpoint gathers the full model state dict on rank 0 (FULL_STATE_DICT)
    while each rank gathers tensor by tensor (3 x the largest: 33.8M on rank 1, to the
    byte); the final save gathers it again and merges; the final eval unshards layers."""
    n, part = x.n, lo.adapters / x.n
    layer = x.p * (x.layer_psi + lo.layer_adapters)
    states = lo.model(x.psi) / n + 8.0 * part
    grads = lo.adapter_bytes * part
    full_tensor = lo.base_bytes * x.largest_tensor  # one parameter gathered whole
    d, h = between = placed(offload, 0.0, states)
    # the gathered state dict goes to rank 0's host (cpu_offload=True), the merge runs there
    return {"construction": (lo.model(x.psi) / n, lo.model(x.psi)),
            "between_steps": between,
            "forward_backward": placed(offload, 3.0 * layer + x.acts + x.recompute,
                                       states + grads),
            "optimizer_step": placed(offload, 0.0, states + grads + per_param_temporaries(
                x, lo.largest_adapter / n)),
            "checkpoint": (d + full_tensor, h + lo.model(x.psi)),
            "checkpoint_other_ranks": (d + 3.0 * full_tensor, h),
            "final": (d + full_tensor, h + lo.model(x.psi) + lo.merge_temporaries),
            "final_other_ranks": (d + 3.0 * layer, h)}
