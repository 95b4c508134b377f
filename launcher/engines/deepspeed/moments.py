"""DeepSpeed ZeRO stage 1/2/3 peak-memory moments (launcher/engines/peak_terms.py terms)."""

from __future__ import annotations

from launcher.engines.deepspeed.ds_config import SUB_GROUP_SIZE
from launcher.engines.peak_terms import (
    LoraInputs,
    PeakInputs,
    Split,
    adam_temporaries,
    larger,
    shifted,
    trainable_view,
)


def zero12_moments(x: PeakInputs, stage: int, offload: bool) -> dict[str, Split]:
    """DeepSpeed stage 1/2: flat working params p*psi on every rank; fp32 master 4psi/N (a
    clone even in fp32) and Adam 8psi/N, on the host under offload_optimizer. No gradient is
    held between steps (offload: the host's fp32 grad partition stays allocated)."""
    psi, p, part = x.psi, x.p, x.psi / x.n
    if offload:  # measured (fp32): master, fp32 grads, one more 4psi/N buffer, 2 x 4E staging
        device, host, grads = p * psi, 8.0 * part + 12.0 * part + 8.0 * x.largest_tensor, 0.0
    else:
        device, host, grads = p * psi + 12.0 * part, 0.0, p * part
    # Stage 1 reduces only at the accumulation boundary: the micro batches before it keep
    # the full 16-bit grads (the same as stage 2 when grad_accum is 1)
    held = p * psi if stage == 1 and x.grad_accum > 1 else grads
    buckets = 2.0 * p * x.bucket  # overlap_comm: two reduce buffers during backward
    fwd_bwd = device + held + x.acts + x.recompute + buckets
    # the optimizer step: grad partition + its fp32 flat copy + AdamW's temporaries
    temps = adam_temporaries(x, part, flat=True)
    step = (device, host + temps) if offload else (device + grads + 4.0 * part + temps, host)
    # the engine wraps the (cast) model: a flat copy while the originals live (DeepSpeed
    # flattens on the host, then moves the flat buffer: derived), then the partitions
    # without Adam's states, which come with the first step. Without offload,
    # initialize_optimizer_states adds a zero fp32 grad partition as the master's .grad
    # and drops it (H200, bf16, N = 1: p*psi + 8psi/N = 10531 MiB, measured 10531)
    flat_copy: Split = (p * psi, p * psi)
    adam = 8.0 * part
    partitions = (device, host - adam) if offload else (device - adam + 4.0 * part, host)
    construction = larger(flat_copy, partitions)
    # measured: + a full p*psi copy of the weights while the checkpoint is written (fp32 and
    # bf16 at N = 2, bf16 at N = 1: docs/evidence/memory.md section 11); on the device
    # beside the weights (derived)
    save = (device + p * psi, host)
    return {"construction": construction, "between_steps": (device, host),
            "forward_backward": (fwd_bwd, host), "optimizer_step": step,
            "checkpoint": save, "checkpoint_other_ranks": save}


def zero3_moments(x: PeakInputs, offload_opt: bool, offload_param: bool) -> dict[str, Split]:
    """DeepSpeed stage 3: param and grad partitions (p bytes each), fp32 master 4psi/N and
    Adam 8psi/N (+ the fp32 grads 4psi/N under offload, on the host); the forward gathers
    parameters up to stage3_max_live_parameters (its default 1e9 keeps every one gathered
    until backward releases it); the optimizer step adds fp32 grads of one sub-group
    (without offload) and AdamW's temporaries over it."""
    psi, p, part = x.psi, x.p, x.psi / x.n
    sg = min(SUB_GROUP_SIZE, part)
    params = p * part
    grads = p * part  # the reduced 16-bit grad partition (fp32 in fp32 runs)
    states = (16.0 if offload_opt else 12.0) * part
    device = grads + (0.0 if offload_param else params) + (0.0 if offload_opt else states)
    host = (params if offload_param else 0.0) + (states if offload_opt else 0.0)
    gathered = p * min(psi, x.max_live)
    fwd_bwd = device + gathered + x.acts + x.recompute
    temps = adam_temporaries(x, sg, flat=True)
    step = (device, host + temps) if offload_opt else (device + 4.0 * sg + temps, host)
    # the 16-bit weights gathered module by module into a state dict on rank 0's host
    save = p * psi if x.gather_on_save else 0.0
    return {"construction": zero3_construction(x, offload_opt, offload_param, device, host),
            "between_steps": (device, host),
            "forward_backward": (fwd_bwd, host), "optimizer_step": step,
            "checkpoint": (device, host + save), "checkpoint_other_ranks": (device, host)}


def zero3_construction(x: PeakInputs, offload_opt: bool, offload_param: bool,
                       device: float, host: float) -> Split:  # device, host: between steps
    """zero.Init builds one module at a time (measured: ~ one layer in full). Without
    offload, the engine then holds the param partitions, the fp32 master and the zero fp32
    grad buffer of the largest sub-group that initialize_optimizer_states sets as .grad and
    drops; no grad partition yet (H200, bf16, N = 1: 6psi + 4 x 1e9 = 10133 MiB, measured
    10152; cpu fp32: 12psi/N, measured 12psi/N + 38M). Offloaded: everything but Adam's
    states (measured on the cpu preset)."""
    part = x.psi / x.n
    if offload_opt:
        return (device + 4.0 * x.layer_psi, host - 8.0 * part)
    params = x.p * part
    on_host = params if offload_param else 0.0
    building: Split = (params - on_host + 4.0 * x.layer_psi, on_host)
    engine: Split = (params - on_host + 4.0 * part + 4.0 * min(SUB_GROUP_SIZE, part), on_host)
    return larger(building, engine)


def lora_zero12_moments(x: PeakInputs, lo: LoraInputs, stage: int,
                        offload: bool) -> dict[str, Split]:
    """ZeRO-1/2: the frozen base stays a plain module tensor (p_b*psi); zero12_moments over
    the adapters (flat p*a, master 4a/N, Adam 8a/N, reduce buckets 2p*bucket). Both the
    Trainer's checkpoint and the final save first clone the whole state dict on every rank
    (accelerate's get_state_dict: clone_tensors_for_torch_save, to the host); rank 0 then
    merges it in place (measured: checkpoint 832.7M, final 1254.3M on rank 0 while the merge
    still cloned the base, 832.7M on rank 1)."""
    moments = shifted(zero12_moments(trainable_view(x, lo), stage, offload),
                      lo.base_bytes * x.psi)
    d, h = moments["between_steps"]
    saved = (d, h + lo.model(x.psi))
    return {**moments, "checkpoint": saved, "checkpoint_other_ranks": saved,
            "final": (d, saved[1] + lo.merge_temporaries), "final_other_ranks": saved}


def lora_zero3_moments(x: PeakInputs, lo: LoraInputs, offload_opt: bool,
                       offload_param: bool) -> dict[str, Split]:
    """ZeRO-3 partitions the frozen base too (p*psi/N). Measured between steps beside it:
    the adapters' partition p*a/N and a p*a buffer, a p*bucket buffer (told apart by size
    only), Adam 8a/N (+ fp32 grads 4a/N on the host under offload). The forward keeps
    every parameter gathered (max_live) and, unlike full fine-tuning, peaks with
    all-gathers in flight: 2N*p*bucket at the forward's start (zero3_offload) or N*p*bucket
    beside the activations (zero3). The first step has no trace yet: each module's
    parameters go after use (measured 395.0M). The Trainer's checkpoint gathers the
    adapters only; the final eval gathers everything again; the final save gathers the
    whole state dict on rank 0 and merges it."""
    psi, p, a, part = x.psi, x.p, lo.adapters, lo.adapters / x.n
    base = p * psi / x.n
    adam = 8.0 * part + (4.0 * part if p == 2 else 0.0)  # + the fp32 master in 16-bit
    states = adam + (4.0 * part if offload_opt else 0.0)
    kept = p * part + p * a + p * x.bucket
    device = kept + (0.0 if offload_param else base) + (0.0 if offload_opt else states)
    host = (base if offload_param else 0.0) + (states if offload_opt else 0.0)
    gather = p * min(psi + a, x.max_live)
    in_flight = 2.0 * x.n * p * x.bucket
    fwd_bwd = device + gather + max(x.acts + x.recompute + in_flight / 2.0, in_flight)
    temps = adam_temporaries(x, part, flat=True)
    step = (device, host + temps) if offload_opt else (device + 4.0 * part + temps, host)
    fresh: Split = (device - (0.0 if offload_opt else 8.0 * part), host)
    saved: Split = (device + p * x.bucket, host)
    return {"construction": larger((base + 4.0 * x.layer_psi, 0.0), fresh),
            "first_step": (fresh[0] + x.acts + p * x.bucket, fresh[1]),
            "between_steps": (device, host), "forward_backward": (fwd_bwd, host),
            "optimizer_step": step, "checkpoint": saved, "checkpoint_other_ranks": saved,
            # rank 0: the gathered save merged in place, or the final eval's gather, which
            # every rank reaches (measured: rank 0's final phase equals rank 1's)
            "final": larger((device, host + lo.model(psi) + lo.merge_temporaries),
                            (device + gather + in_flight, host)),
            "final_other_ranks": (device + gather + in_flight, host)}
