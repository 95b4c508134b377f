"""Predicted peak live tensor bytes per rank: the max over the moments of a run (each
engine's own, launcher/engines/*), as launcher/rank/memtrace.py measures it: on the cpu
preset every tensor of the rank, on GPU presets the CUDA allocator's (host-side states
apart). The framework allowance is added by estimate.py. Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.config.architecture import (
    count_params,
    expert_adapter_shapes,
    largest_tensor_params,
    layer_linear_params,
    layer_params,
    linear_shapes,
    rank_params,
)
from launcher.config.hardware import gpu_preset
from launcher.config.objectives import is_dpo
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines import engine_of
from launcher.engines.deepspeed.ds_config import STAGE3_MAX_LIVE_PARAMETERS, bucket_elements
from launcher.engines.peak_terms import (
    LoraInputs,
    PeakInputs,
    larger,
    reference_forward,
    with_reference,
)
from launcher.estimator.flops import adapter_params, lora_targets
from launcher.estimator.memory import (
    activation_bytes,
    layer_bytes,
    logits_bytes,
    lora_activation_bytes,
    lora_base_bytes,
    micro_sequences,
    model_state_bytes,
    param_bytes,
    rank_sequence,
    recompute_bytes,
    reference_split,
    reference_weight_bytes,
    reference_wrapped_by_trl,
)

TRAINING_MOMENTS = ("between_steps", "forward_backward", "optimizer_step")
MOMENTS = ("construction", "first_step", *TRAINING_MOMENTS, "checkpoint",
           "checkpoint_other_ranks")
RANK0_MOMENTS = ("checkpoint", "final")
"""Moments only rank 0 reaches (it gathers or merges what it saves); the other ranks'
counterparts are `<moment>_other_ranks`. "final" (the final eval and save) exists for LoRA
runs only: their merged save peaks above every training step (measured); full
fine-tuning's stays below its other moments (docs/evidence/memory.md section 2)."""


def lora_inputs(cfg: RunConfig, strategy: StrategyConfig) -> LoraInputs:
    """LoraInputs from cfg: adapter count and shapes, the engine's byte widths."""
    model, r = cfg.model, cfg.peft.r
    p = param_bytes(cfg.precision.name)
    deepspeed = engine_of(strategy).separate_master_weights
    base = lora_base_bytes(cfg, strategy)
    shapes = [shape for t, shape in linear_shapes(model).items() if t in lora_targets(cfg)]
    experts = expert_adapter_shapes(cfg).values()
    # one adapter tensor: r x a linear's width, or an expert pair's rank x experts x width
    largest_adapter = max([r * max(shape) for shape in shapes]
                          + [rank * e * max(i, o) for rank, e, i, o in experts], default=0)
    # the merge's delta of one weight at a time: a linear's or a whole experts tensor's
    largest = max([i * o for i, o in shapes] + [e * i * o for _, e, i, o in experts], default=0)
    adapters = adapter_params(cfg)
    return LoraInputs(
        adapters=adapters, largest_adapter=largest_adapter,
        layer_adapters=adapters // max(model.num_layers, 1), base_bytes=base,
        adapter_bytes=p if deepspeed else 4,
        merge_temporaries=(8.0 if base == 4 else 14.0) * largest,
    )


@dataclass(frozen=True)
class PeakPrediction:
    moments: dict[str, float]
    host_bytes: float
    """Largest host-side (offloaded) tensor bytes per rank on GPU presets; 0 on cpu, where
    the moments count them already."""
    acts: float
    """One micro batch's activations when the forward returns (a frozen LoRA base keeps
    fewer)."""
    states_bytes: float
    """The model states the device holds in the optimizer step (weights, gradients,
    optimizer states, DPO's reference; its optimizer_step moment): the table's "states"
    column, never above the peak. QLoRA's: memory.model_state_bytes."""

    @property
    def steady_bytes(self) -> float:
        """The peak of a steady-state training step (the first step, without Adam's states
        during its forward/backward, peaks no higher)."""
        return max(self.moments[m] for m in TRAINING_MOMENTS)

    @property
    def peak_bytes(self) -> float:  # rank 0's: it saves the gathered checkpoint
        return max(self.moments.values())

    @property
    def construction_above_training(self) -> bool:
        return self.moments["construction"] > max(
            self.steady_bytes, self.moments["checkpoint"])


def other_ranks_peak(moments: dict[str, float]) -> float:
    """The run's peak on every rank but 0: all moments but those only rank 0 reaches."""
    return max(v for k, v in moments.items() if k not in RANK0_MOMENTS)


def peak_inputs(cfg: RunConfig, strategy: StrategyConfig) -> PeakInputs:
    """The settings the moments read, from cfg (under `strategy`, which need not be
    cfg.strategy: the estimate asks for every row on the same run)."""
    model, tp = cfg.model, cfg.parallel.tp
    h = model.hidden_size
    bucket = bucket_elements(replace(cfg, strategy=strategy))
    return PeakInputs(  # under tensor parallelism: one rank's share, over the dp ranks
        psi=rank_params(model, tp), n=cfg.shard_size, p=param_bytes(cfg.precision.name),
        grad_accum=cfg.train.grad_accum,
        # one decoder layer (an MoE layer with all its experts), its linears split tp ways
        layer_psi=layer_params(model) - layer_linear_params(model) * (tp - 1) // tp,
        largest_tensor=largest_tensor_params(model, tp),
        acts=activation_bytes(cfg), recompute=recompute_bytes(cfg),
        autocast_acts=0.0 if cfg.precision.name == "fp32" else (  # 12h bytes/token and layer
            12.0 * h * (rank_sequence(cfg) * micro_sequences(cfg)) * model.num_layers),
        # GPU presets run a fused Adam (DeepSpeed FusedAdam/CPUAdam, torch fused); the cpu
        # preset the Trainer's torch AdamW, single-tensor on CPU
        fused_optimizer=not gpu_preset(cfg.cluster.gpu).is_cpu,
        bucket=bucket,
        max_live=STAGE3_MAX_LIVE_PARAMETERS + int(0.9 * bucket),
        gather_on_save=strategy.gather_weights_on_save or tp > 1,
        reshard_after_forward=strategy.fsdp_reshard_after_forward,
    )


def reference_forward_bytes(cfg: RunConfig, strategy: StrategyConfig, x: PeakInputs) -> float:
    """objective=dpo: what the reference's no_grad forward adds at the policy forward's end
    (peak_terms.reference_forward; LoRA: the policy's own base with the adapters disabled,
    which gathers nothing more); 0 for objective=sft and with precompute_ref_log_probs."""
    if not is_dpo(cfg) or cfg.objective.precompute_ref_log_probs:
        return 0.0
    layer, logits = layer_bytes(cfg), logits_bytes(cfg, rank_sequence(cfg))
    if cfg.peft.name != "none":
        return layer + logits
    return reference_forward(x, layer, logits, engine_of(strategy).memory_stage(strategy),
                             reference_weight_bytes(cfg, strategy),
                             module_gathers=not reference_wrapped_by_trl(strategy))


def dpo_eval_bytes(cfg: RunConfig) -> float:
    """objective=dpo's eval step on top of the states: the policy's and the reference's
    no_grad forwards, one layer's activations and the logits each (measured on the 52M
    Llama, LoRA under ddp, micro batch 2 x 64: +37 MB over between-steps, predicted
    2 x 21.75 MB)."""
    return 2.0 * (layer_bytes(cfg) + logits_bytes(cfg, rank_sequence(cfg)))


def predict_peak(cfg: RunConfig, strategy: StrategyConfig) -> PeakPrediction:
    """Per-rank peak of cfg's run under `strategy`. LoRA: the engine's lora_moments (a
    frozen base, measured). QLoRA is not measured (it needs a pretrained checkpoint and
    bitsandbytes' 4-bit kernels): its one moment is model states plus activations.

    objective=dpo (derived, not measured): activations of 2 x micro_batch_size sequences;
    the reference's forward at the policy forward's end, passed to the moments inside the
    activations (reference_forward_bytes; the reported acts leave it out); the reference's
    weights at every moment (peak_terms.with_reference; FSDP with
    precompute_ref_log_probs: at construction only, the precompute's own forward left
    out)."""
    on_cpu = gpu_preset(cfg.cluster.gpu).is_cpu
    if cfg.peft.name == "qlora":
        acts = activation_bytes(cfg)
        states = model_state_bytes(cfg, strategy)[0]
        total = states + acts
        if is_dpo(cfg):
            total += reference_forward_bytes(cfg, strategy, peak_inputs(cfg, strategy))
        return PeakPrediction(dict.fromkeys(MOMENTS, total), 0.0, acts, states)
    x, engine = peak_inputs(cfg, strategy), engine_of(strategy)
    if cfg.peft.name == "lora":
        x, lo = replace(x, acts=lora_activation_bytes(cfg)), lora_inputs(cfg, strategy)
    acts = x.acts
    if is_dpo(cfg):
        x = replace(x, acts=acts + reference_forward_bytes(cfg, strategy, x))
    if cfg.peft.name == "lora":
        moments, trainable = engine.lora_moments(x, lo, strategy), lo.adapters
    else:
        moments, trainable = engine.moments(x, strategy), x.psi
    if is_dpo(cfg):
        moments = with_reference(moments, reference_split(cfg, strategy),
                                 during_training=not cfg.objective.precompute_ref_log_probs)
        if "final_other_ranks" in moments:  # LoRA: the final eval is that moment's peak
            d, h = moments["final_other_ranks"]
            moments["final_other_ranks"] = (d + dpo_eval_bytes(cfg), h)
    if "first_step" not in moments:
        # Adam's states (8 bytes per trainable parameter, on the host under offload) appear
        # only inside its optimizer step, so the first step's forward/backward holds all but
        # them (measured: fsdp's first step 834.9M = its optimizer moment, below the steady
        # backward's 991.2M)
        adam = 8.0 * trainable / (x.n if engine.shards else 1)
        d, h = moments["forward_backward"]
        without_adam = (d, h - adam) if strategy.offload_optimizer else (d - adam, h)
        moments = {**moments, "first_step": larger(moments["optimizer_step"], without_adam)}
    if cfg.parallel.tp > 1:  # rank 0 gathers the whole model's 16-bit weights to save them
        d, h = moments["checkpoint"]  # (measured: + 393 MB of the 409 MB fp32 102M model)
        moments["checkpoint"] = (d, h + x.p * count_params(cfg.model))
    if on_cpu:  # one memory: the tracker counts host tensors too
        device = {m: d + h for m, (d, h) in moments.items()}
        return PeakPrediction(device, 0.0, acts, device["optimizer_step"])
    host = max(h for _, h in moments.values())
    device = {m: d for m, (d, _) in moments.items()}
    return PeakPrediction(device, host, acts, device["optimizer_step"])
