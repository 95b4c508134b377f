"""The terms every engine's peak-memory moments (launcher/engines/*) are written in: what
one rank holds at one point of a run, as (device, host) bytes. Every formula was measured on 2
CPU ranks in fp32 (102M Llama, docs/evidence/memory.md sections 3-5) unless its comment says
"derived": 16-bit figures and the GPU/host split of offloaded states follow the engines'
code paths.

Notation: psi params, n world size, p working-param bytes (4 fp32, 2 fp16/bf16), E numel
of the largest parameter tensor, L one decoder layer's params, A one micro batch's
activations at the forward's end (launcher/estimator/memory.py activation_bytes).
Pure arithmetic: no torch, transformers or deepspeed import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

Split = tuple[float, float]
"""(device bytes, host bytes) one rank holds at a moment."""


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
    gather_on_save: bool
    reshard_after_forward: bool = True


def larger(*splits: Split) -> Split:
    """The split with the most bytes in all: the moment a rank's total peaks."""
    return max(splits, key=sum)


def adam_temporaries(x: PeakInputs, numel: float, flat: bool) -> float:
    """torch AdamW (single-tensor, the default on CPU) over `numel` elements: over one flat
    tensor its sqrt and div results alive together, 8 bytes/element (measured, zero1/2 and
    zero3); over separate parameters it peaks at the largest one, 12 bytes/element
    (measured under DDP: 20psi + 12E to the byte). Fused: none."""
    return 0.0 if x.fused_optimizer else (8.0 if flat else 12.0) * numel


@dataclass(frozen=True)
class LoraInputs:
    """What a LoRA run holds beyond PeakInputs (whose psi stays the base's parameters and
    whose acts are lora_activation_bytes). Measured on 2 CPU ranks in fp32, q/k/v/o
    adapters (docs/evidence/memory.md section 12); the 16-bit byte widths are derived."""

    adapters: int
    """a: the trainable parameters (flops.adapter_params)."""
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


def shifted(moments: dict[str, Split], device: float) -> dict[str, Split]:
    """Every moment plus `device` bytes (the frozen base, held throughout)."""
    return {m: (d + device, h) for m, (d, h) in moments.items()}


def trainable_view(x: PeakInputs, lo: LoraInputs) -> PeakInputs:
    """x as if the adapters were the whole model: what an engine's flat buffers, DDP's
    buckets, the grads and Adam cover (measured: ZeRO-1/2 flatten only the parameters
    that require grad; DDP buckets only those)."""
    return replace(x, psi=lo.adapters, largest_tensor=lo.largest_adapter, p=lo.adapter_bytes,
                   autocast_acts=0.0)


# ---------------------------------------------------------------- DPO's reference model


def reference_weights(psi: int, n: int, stage: int, weight_bytes: int,
                      offload_param: bool) -> Split:
    """The frozen reference model of a full fine-tune under objective=dpo (psi
    parameters per rank, n ranks sharing a shard group), as TRL 1.16's DPOTrainer holds it
    beside the policy (derived from its code, not measured): it loads
    a second copy of the model in the policy's dtype (fp32 here) and prepares it for the
    engine. `stage` is the ZeRO stage the engine acts like (Engine.memory_stage):

    - 0 (DDP): accelerate's prepare_model(evaluation_mode=True), a full replica per rank,
      not cast (weight_bytes 4: fp32 under autocast, like the policy's weights);
    - 1, 2 (ZeRO-1/2): a DeepSpeed engine at stage 0 (trl prepare_deepspeed): a full
      replica per rank in the training precision (weight_bytes = p);
    - 3 (ZeRO-3, FSDP): wrapped like the policy, sharded over the n ranks, no grads nor
      optimizer (ZeRO-3: p bytes; FSDP2 keeps fp32 shards); ZeRO-3's offload_param and
      FSDP's CPUOffloadPolicy keep the shards on the host.

    Its load (a full copy on each rank's host before the engine casts or shards it,
    except under ZeRO-3's zero.Init) is not counted."""
    if stage < 3:
        return (float(weight_bytes * psi), 0.0)
    part = weight_bytes * psi / n
    return (0.0, part) if offload_param else (part, 0.0)


def reference_forward(x: PeakInputs, layer_acts: float, logits: float, stage: int,
                      weight_bytes: int, module_gathers: bool) -> float:
    """Device bytes the reference's forward adds while it runs (derived from TRL's code, not
    measured): TRL runs it under no_grad right after the policy's forward, whose
    activations are all alive, so it keeps one layer's activations and its logits at a
    time, plus the weights it gathers. Sharded (stage 3): ZeRO-3 (`module_gathers`)
    gathers module by module and keeps up to max_live elements gathered, as the policy's
    forward does (p*min(psi, max_live)); FSDP2, which trl's prepare_fsdp applies to the
    root module only, unshards the whole model for the forward (p*psi under a 16-bit
    MixedPrecisionPolicy). An fp32 replica under 16-bit autocast caches a 16-bit copy of
    each weight until its forward ends (2psi)."""
    if stage == 3:
        gathered = x.p * (min(x.psi, x.max_live) if module_gathers else x.psi)
    else:
        gathered = 2.0 * x.psi if weight_bytes == 4 and x.p == 2 else 0.0
    return layer_acts + logits + gathered


def with_reference(moments: dict[str, Split], weights: Split,
                   during_training: bool) -> dict[str, Split]:
    """Every moment plus the reference's weights; with during_training False (FSDP with
    precompute_ref_log_probs: TRL shards it, precomputes the log-probs before the first
    step, then frees it) construction only."""
    keys = moments if during_training else ("construction",)
    return {m: (d + weights[0], h + weights[1]) if m in keys else (d, h)
            for m, (d, h) in moments.items()}
