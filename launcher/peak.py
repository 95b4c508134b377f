"""Predicted peak live tensor bytes per rank: the max over the moments of a run, per strategy.

The figures are what launcher/memtrace.py measures (docs/memory-notes.md): on the cpu
preset every tensor of the rank (device and host are one memory), on GPU presets the CUDA
allocator's max_memory_allocated (host-side offloaded states are reported apart). The
framework allowance (CUDA context, runtime) is not tensor bytes and is added elsewhere
(launcher/estimate.py).

A peak is a max over moments, not a sum: between steps, forward/backward, the optimizer
step, the checkpoint save (rank 0 and the other ranks) and construction (model build and
engine wrapping). Every formula below was measured on 2 CPU ranks in fp32 (102M Llama,
docs/memory-notes.md sections 3-5) unless its comment says "derived": 16-bit figures
and the GPU/host split of offloaded states follow the engines' code paths.

Notation: psi params, n world size, p working-param bytes (4 fp32, 2 fp16/bf16), E numel
of the largest parameter tensor, L one decoder layer's params, A one micro batch's
activations at the forward's end (launcher/memory.py activation_bytes).
Pure arithmetic: no torch, transformers or deepspeed import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.ds_config import STAGE3_MAX_LIVE_PARAMETERS, SUB_GROUP_SIZE, bucket_elements
from launcher.flops import (
    adapter_params,
    count_params,
    layer_linear_params,
    linear_shapes,
    lora_targets,
)
from launcher.hardware import gpu_preset
from launcher.memory import (
    activation_bytes,
    lora_activation_bytes,
    model_state_bytes,
    param_bytes,
    recompute_bytes,
)
from launcher.schema import RunConfig, StrategyConfig

Split = tuple[float, float]
"""(device bytes, host bytes) one rank holds at a moment."""

TRAINING_MOMENTS = ("between_steps", "forward_backward", "optimizer_step")
MOMENTS = ("construction", "first_step", *TRAINING_MOMENTS, "checkpoint",
           "checkpoint_other_ranks")
RANK0_MOMENTS = ("checkpoint", "final")
"""Moments only rank 0 reaches (it gathers or merges what it saves); the other ranks'
counterparts are `<moment>_other_ranks`. "final" (the final eval and save) exists for LoRA
runs only: their merged save peaks above every training step (measured); full
fine-tuning's stays below its other moments (docs/memory-notes.md section 2)."""


@dataclass(frozen=True)
class PeakInputs:
    """Everything a strategy's peak depends on, taken from the run's own settings."""

    psi: int
    n: int
    p: int
    grad_accum: int
    layer_psi: int
    largest_tensor: int
    acts: float
    """Activations of one micro batch when the forward returns."""
    recompute: float
    """One layer's activations rebuilt during backward (gradient checkpointing), else 0."""
    autocast_acts: float
    """DDP in 16-bit (fp32 weights under autocast): what its fp32 residual stream adds to
    `acts` (derived: each norm keeps an fp32 input and output plus the 16-bit cast for the
    next linear where a 16-bit model keeps 16-bit: 12h bytes per token and layer)."""
    fused_optimizer: bool
    """Fused Adam (GPU presets: DeepSpeed FusedAdam/CPUAdam, torch fused): no temporaries."""
    bucket: int
    """ZeRO reduce bucket, elements."""
    max_live: int
    """ZeRO-3: stage3_max_live_parameters + stage3_prefetch_bucket_size, elements."""
    sub_group: int
    gather_on_save: bool
    reshard_after_forward: bool = True


def larger(*splits: Split) -> Split:
    """The split with the most bytes in all: the moment a rank's total peaks."""
    return max(splits, key=sum)


def flat_temporaries(x: PeakInputs, numel: float) -> float:
    """torch AdamW (single-tensor, the default on CPU) over one flat tensor: sqrt and div
    results alive together, 8 bytes/element (measured, zero1/2 and zero3). Fused: none."""
    return 0.0 if x.fused_optimizer else 8.0 * numel


def per_param_temporaries(x: PeakInputs, numel: float) -> float:
    """The same loop over separate parameters peaks at its largest one: 12 bytes/element
    measured under DDP (ddp: 20psi + 12E to the byte)."""
    return 0.0 if x.fused_optimizer else 12.0 * numel


def ddp_moments(x: PeakInputs) -> dict[str, Split]:
    """torch DDP: fp32 weights whatever the precision (autocast casts), reducer buckets
    holding a copy of every grad (4psi; accelerate wraps no DDP on one process), Adam 8psi;
    .grad is None between steps."""
    psi = x.psi
    buckets = 4.0 * psi if x.n > 1 else 0.0
    between = 12.0 * psi + buckets
    # autocast caches a 16-bit copy of each weight during the forward (measured, cpu bf16:
    # forward end = 16psi + 2psi + acts + autocast_acts to 0.6 %)
    autocast = 2.0 * psi if x.p == 2 else 0.0
    held = 4.0 * psi if x.grad_accum > 1 else 0.0  # grads kept across micro batches
    forward = between + held + autocast + x.acts + x.autocast_acts + x.recompute
    # autocast drops its cache when the forward's context exits, and the backward frees
    # the 16-bit copies it saved as it fills .grad (measured, cpu bf16: 20psi at its end)
    fwd_bwd = max(forward, between + 4.0 * psi)
    optimizer = between + 4.0 * psi + per_param_temporaries(x, x.largest_tensor)
    return {"construction": (4.0 * psi + buckets, 0.0), "between_steps": (between, 0.0),
            "forward_backward": (fwd_bwd, 0.0), "optimizer_step": (optimizer, 0.0),
            "checkpoint": (between, 0.0), "checkpoint_other_ranks": (between, 0.0)}


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
    temps = flat_temporaries(x, part)
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
    # bf16 at N = 2, bf16 at N = 1: docs/memory-notes.md section 11); on the device
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
    sg = min(x.sub_group, part)
    params = p * part
    grads = p * part  # the reduced 16-bit grad partition (fp32 in fp32 runs)
    states = (16.0 if offload_opt else 12.0) * part
    device = grads + (0.0 if offload_param else params) + (0.0 if offload_opt else states)
    host = (params if offload_param else 0.0) + (states if offload_opt else 0.0)
    gathered = p * min(psi, x.max_live)
    fwd_bwd = device + gathered + x.acts + x.recompute
    temps = flat_temporaries(x, sg)
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
    engine: Split = (params - on_host + 4.0 * part + 4.0 * min(x.sub_group, part), on_host)
    return larger(building, engine)


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

    def on(device: float, host: float) -> Split:  # states on the host under offload
        return (device, host) if offload else (device + host, 0.0)

    states = 12.0 * part
    grads = 4.0 * part
    fwd = on(forward, states)
    bwd = on(backward, states + grads)
    fwd_bwd = larger(fwd, bwd)
    step = on(0.0, states + grads + per_param_temporaries(x, x.largest_tensor / x.n))
    # FULL_STATE_DICT: rank 0 gathers the full fp32 Adam state (8psi), offloaded to its host
    # tensor by tensor (accelerate's StateDictOptions(cpu_offload=True))
    save = 8.0 * psi if x.gather_on_save else 0.0
    rank0 = on(0.0, states)
    # the full fp32 model: built on rank 0's host, allocated but never written on the other
    # ranks' (launcher/model.unfilled_model: the allocator counts it, RSS does not), then
    # sharded onto the device
    return {"construction": (4.0 * part, 4.0 * psi), "between_steps": on(0.0, states),
            "forward_backward": fwd_bwd, "optimizer_step": step,
            "checkpoint": (rank0[0], rank0[1] + save), "checkpoint_other_ranks": rank0}


# ---------------------------------------------------------------- LoRA (frozen base)


@dataclass(frozen=True)
class LoraInputs:
    """What a LoRA run holds beyond PeakInputs (whose psi stays the base's parameters and
    whose acts are lora_activation_bytes). Measured on 2 CPU ranks in fp32, q/k/v/o
    adapters (docs/memory-notes.md section 12); the 16-bit byte widths are derived."""

    adapters: int
    """a: the trainable parameters (launcher/flops.adapter_params)."""
    largest_adapter: int
    """Numel of the largest adapter tensor (r x the widest adapted input or output)."""
    layer_adapters: int
    base_bytes: int
    """Bytes per frozen base weight as the engine holds it: 2 for a bf16 base
    (model_dtype) or under a 16-bit DeepSpeed engine (it casts the module), else 4."""
    adapter_bytes: int
    """Bytes per adapter weight: 4 under DDP/FSDP (peft keeps adapters in fp32), p under
    DeepSpeed (the engine casts them with the base)."""
    merge_temporaries: float
    """The final merge's transient for its largest weight: B @ A and W + B @ A in fp32
    (8 bytes/element measured in fp32; + the fp32 upcast and the cast back in 16-bit)."""

    def model(self, psi: int) -> float:
        """The model's bytes: frozen base + adapters."""
        return self.base_bytes * psi + self.adapter_bytes * self.adapters

    def merged(self, psi: int) -> float:
        """Rank 0's final save from the live model (DDP): a clone of every base weight,
        merged into. A gathered state dict (ZeRO, FSDP) is merged in place: only the
        merge_temporaries (launcher/checkpoints.merge_lora_state_dict)."""
        return self.base_bytes * psi + self.merge_temporaries


def shifted(moments: dict[str, Split], device: float) -> dict[str, Split]:
    """Every moment plus `device` bytes (the frozen base, held throughout)."""
    return {m: (d + device, h) for m, (d, h) in moments.items()}


def trainable_view(x: PeakInputs, lo: LoraInputs) -> PeakInputs:
    """x as if the adapters were the whole model: what an engine's flat buffers, DDP's
    buckets, the grads and Adam cover (measured: ZeRO-1/2 flatten only the parameters
    that require grad; DDP buckets only those)."""
    return replace(x, psi=lo.adapters, largest_tensor=lo.largest_adapter, p=lo.adapter_bytes,
                   autocast_acts=0.0)


def lora_ddp_moments(x: PeakInputs, lo: LoraInputs) -> dict[str, Split]:
    """DDP: the base's p_b*psi + ddp_moments over the adapters (4a params, 4a buckets, 8a
    Adam). Construction held the model twice (measured 826.4M = 2 x 413.2M, not
    attributed: DDP's broadcast of the module states is the candidate). The Trainer's
    checkpoint saves the adapters only; the final save clones the base on rank 0 to merge."""
    moments = shifted(ddp_moments(trainable_view(x, lo)), lo.base_bytes * x.psi)
    if x.p == 2 and lo.base_bytes == 4:  # fp32 base under fp16 autocast (derived): the
        # forward saves a 16-bit copy of each frozen weight for the backward, which frees
        # them (autocast caches only weights that require grad; measured for ddp in bf16:
        # nothing of it is left between steps, docs/memory-notes.md section 11)
        d, h = moments["forward_backward"]
        moments["forward_backward"] = (d + 2.0 * x.psi + x.autocast_acts, h)
    between = moments["between_steps"]
    return {**moments, "construction": (2.0 * lo.model(x.psi), 0.0),
            "checkpoint": between, "checkpoint_other_ranks": between,
            "final": (between[0], between[1] + lo.merged(x.psi)),
            "final_other_ranks": between}


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
    temps = flat_temporaries(x, part)
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


def lora_fsdp_moments(x: PeakInputs, lo: LoraInputs, offload: bool) -> dict[str, Split]:
    """FSDP2 shards base and adapters alike (the model's bytes / N) + Adam 8a/N. Measured
    peak at the backward's start: three unsharded layers (p bytes per parameter under a
    16-bit MixedPrecisionPolicy: derived) while every activation still lives. The
    Trainer's checkpoint gathers the full model state dict on rank 0 (FULL_STATE_DICT)
    while each rank gathers tensor by tensor (3 x the largest: 33.8M on rank 1, to the
    byte); the final save gathers it again and merges; the final eval unshards layers."""
    n, part = x.n, lo.adapters / x.n
    layer = x.p * (x.layer_psi + lo.layer_adapters)

    def on(device: float, host: float) -> Split:  # states on the host under offload
        return (device, host) if offload else (device + host, 0.0)

    states = lo.model(x.psi) / n + 8.0 * part
    grads = lo.adapter_bytes * part
    full_tensor = lo.base_bytes * x.largest_tensor  # one parameter gathered whole
    d, h = between = on(0.0, states)
    # the gathered state dict goes to rank 0's host (cpu_offload=True), the merge runs there
    return {"construction": (lo.model(x.psi) / n, lo.model(x.psi)),
            "between_steps": between,
            "forward_backward": on(3.0 * layer + x.acts + x.recompute, states + grads),
            "optimizer_step": on(0.0, states + grads + per_param_temporaries(
                x, lo.largest_adapter / n)),
            "checkpoint": (d + full_tensor, h + lo.model(x.psi)),
            "checkpoint_other_ranks": (d + 3.0 * full_tensor, h),
            "final": (d + full_tensor, h + lo.model(x.psi) + lo.merge_temporaries),
            "final_other_ranks": (d + 3.0 * layer, h)}


def lora_moments(x: PeakInputs, lo: LoraInputs, strategy: StrategyConfig) -> dict[str, Split]:
    """The moments of a LoRA run under `strategy`, first_step included."""
    part = lo.adapters / x.n
    offload = strategy.offload_optimizer or (strategy.backend == "fsdp" and strategy.offload_param)
    adam: Split = (0.0, 8.0 * part) if offload else (8.0 * part, 0.0)
    if strategy.backend == "ddp":
        moments, adam = lora_ddp_moments(x, lo), (8.0 * lo.adapters, 0.0)
    elif strategy.backend == "fsdp":
        moments = lora_fsdp_moments(x, lo, offload)
    elif strategy.backend != "deepspeed" or strategy.zero_stage not in (1, 2, 3):
        return strategy_moments(x, strategy)  # the same clear error
    elif strategy.zero_stage == 3:
        return lora_zero3_moments(x, lo, strategy.offload_optimizer, strategy.offload_param)
    else:
        moments = lora_zero12_moments(x, lo, strategy.zero_stage, strategy.offload_optimizer)
    return {**moments, "first_step": first_step(moments, adam)}


def lora_inputs(cfg: RunConfig, strategy: StrategyConfig) -> LoraInputs:
    """LoraInputs from cfg: adapter count and shapes, the engine's byte widths."""
    model, r = cfg.model, cfg.peft.r
    p = param_bytes(cfg.precision.name)
    deepspeed = strategy.backend == "deepspeed"
    base = p if deepspeed else (2 if cfg.precision.name == "bf16" else 4)
    widest = max((max(i, o) for t, (i, o) in linear_shapes(model).items()
                  if t in lora_targets(cfg)), default=0)
    largest = max((i * o for t, (i, o) in linear_shapes(model).items()
                   if t in lora_targets(cfg)), default=0)
    adapters = adapter_params(cfg)
    return LoraInputs(
        adapters=adapters, largest_adapter=r * widest,
        layer_adapters=adapters // max(model.num_layers, 1), base_bytes=base,
        adapter_bytes=p if deepspeed else 4,
        merge_temporaries=(8.0 if base == 4 else 14.0) * largest,
    )


# ---------------------------------------------------------------- from a run's config


@dataclass(frozen=True)
class PeakPrediction:
    """Per-rank predicted live tensor bytes: every moment, and their max."""

    moments: dict[str, float]
    """Moment -> bytes, the quantity the run measures (cpu preset: device + host tensors;
    GPU presets: device allocator only)."""
    host_bytes: float
    """Largest host-side (offloaded) tensor bytes per rank on GPU presets; 0 on cpu, where
    the moments count them already."""

    @property
    def steady_bytes(self) -> float:
        """The peak of a steady-state training step (the first step, without Adam's states
        during its forward/backward, peaks no higher)."""
        return max(self.moments[m] for m in TRAINING_MOMENTS)

    @property
    def peak_bytes(self) -> float:
        """The run's peak on rank 0 (which saves the gathered checkpoint)."""
        return max(self.moments.values())

    @property
    def construction_above_training(self) -> bool:
        """Building and wrapping the model peaks above every step and the save."""
        return self.moments["construction"] > max(
            self.steady_bytes, self.moments["checkpoint"])

    def rank_peak_bytes(self, rank: int) -> float:
        """The run's peak on `rank`: only rank 0 holds the gathered checkpoint (and, with
        LoRA, the merged final model)."""
        return self.peak_bytes if rank == 0 else other_ranks_peak(self.moments)


def other_ranks_peak(moments: dict[str, float]) -> float:
    """The run's peak on every rank but 0: all moments but those only rank 0 reaches."""
    return max(v for k, v in moments.items() if k not in RANK0_MOMENTS)


def strategy_moments(x: PeakInputs, strategy: StrategyConfig) -> dict[str, Split]:
    """The moments of `strategy` (its backend, ZeRO stage and offload settings)."""
    part = x.psi / x.n
    offload = strategy.offload_optimizer or (strategy.backend == "fsdp" and strategy.offload_param)
    adam: Split = (0.0, 8.0 * part) if offload else (8.0 * part, 0.0)
    if strategy.backend == "ddp":
        moments, adam = ddp_moments(x), (8.0 * x.psi, 0.0)
    elif strategy.backend == "fsdp":
        moments = fsdp_moments(x, offload)
    elif strategy.backend != "deepspeed" or strategy.zero_stage not in (1, 2, 3):
        raise ValueError(f"peak memory: no moments for strategy {strategy.name} (backend "
                         f"{strategy.backend}, ZeRO stage {strategy.zero_stage})")
    elif strategy.zero_stage == 3:
        moments = zero3_moments(x, strategy.offload_optimizer, strategy.offload_param)
    else:
        moments = zero12_moments(x, strategy.zero_stage, strategy.offload_optimizer)
    return {**moments, "first_step": first_step(moments, adam)}


def first_step(moments: dict[str, Split], adam: Split) -> Split:
    """The first step's peak: Adam's states appear only inside its optimizer step, so its
    forward/backward holds everything but them (measured: fsdp's first step 834.9M =
    its optimizer moment, below the steady backward's 991.2M)."""
    d, h = moments["forward_backward"]
    return larger(moments["optimizer_step"], (d - adam[0], h - adam[1]))


def peak_inputs(cfg: RunConfig, strategy: StrategyConfig) -> PeakInputs:
    """The settings the moments read, from cfg (under `strategy`, which need not be
    cfg.strategy: the estimate asks for every row on the same run)."""
    model = cfg.model
    h, i, v = model.hidden_size, model.intermediate_size, model.vocab_size
    bucket = strategy.bucket_size or bucket_elements(replace(cfg, strategy=strategy))
    return PeakInputs(
        psi=count_params(model), n=cfg.world_size, p=param_bytes(cfg.precision.name),
        grad_accum=cfg.train.grad_accum,
        layer_psi=layer_linear_params(model) + 2 * h,
        largest_tensor=max(v * h, h * i, h * h),
        acts=activation_bytes(cfg), recompute=recompute_bytes(cfg),
        autocast_acts=autocast_activation_bytes(cfg),
        # GPU presets run a fused Adam (DeepSpeed FusedAdam/CPUAdam, torch fused); the cpu
        # preset the Trainer's torch AdamW, single-tensor on CPU
        fused_optimizer=not gpu_preset(cfg.cluster.gpu).is_cpu,
        bucket=bucket,
        max_live=STAGE3_MAX_LIVE_PARAMETERS + int(0.9 * bucket),
        sub_group=SUB_GROUP_SIZE,
        gather_on_save=strategy.gather_weights_on_save,
        reshard_after_forward=strategy.fsdp_reshard_after_forward,
    )


def autocast_activation_bytes(cfg: RunConfig) -> float:
    """PeakInputs.autocast_acts: 12h bytes per token and layer in 16-bit runs, else 0."""
    if cfg.precision.name == "fp32":
        return 0.0
    tokens = cfg.dataset.max_length * cfg.train.micro_batch_size
    return 12.0 * cfg.model.hidden_size * tokens * cfg.model.num_layers


def predict_peak(cfg: RunConfig, strategy: StrategyConfig) -> PeakPrediction:
    """Per-rank peak of cfg's run under `strategy`. LoRA: its own moments (a frozen
    base, launcher/peak.py's lora_* functions, measured). QLoRA is not measured (it
    needs a pretrained checkpoint and bitsandbytes' 4-bit kernels): its one moment is the
    model-state accounting plus activations (launcher/memory.py)."""
    on_cpu = gpu_preset(cfg.cluster.gpu).is_cpu
    if cfg.peft.name == "qlora":
        total = model_state_bytes(cfg, strategy)[0] + activation_bytes(cfg)
        return PeakPrediction(dict.fromkeys(MOMENTS, total), 0.0)
    x = peak_inputs(cfg, strategy)
    if cfg.peft.name == "lora":
        x = replace(x, acts=lora_activation_bytes(cfg))
        moments = lora_moments(x, lora_inputs(cfg, strategy), strategy)
    else:
        moments = strategy_moments(x, strategy)
    if on_cpu:  # one memory: the tracker counts host tensors too
        return PeakPrediction({m: d + h for m, (d, h) in moments.items()}, 0.0)
    host = max(h for _, h in moments.values())
    return PeakPrediction({m: d for m, (d, _) in moments.items()}, host)
