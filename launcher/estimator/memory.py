"""Model states (what the DeepSpeed engine or torch DDP holds, by kind, and the offloaded
host RAM per node; docs/evidence/memory.md, "Engine accounting"), activations (fitted to
live tensor bytes, 2 CPU ranks, fp32: section 4; Korthikanti et al. 2022's
s*b*h*(34 + 5as/h) per layer was the estimator before) and the framework allowance. The
per-rank peak is launcher/estimator/peak.py's, and so is the table's "states" column (its
optimizer step). Pure arithmetic.

objective=dpo (derived from TRL 1.16's DPOTrainer, not measured): a micro batch is
2 x train.micro_batch_size sequences (micro_sequences), and a full fine-tune holds a frozen
reference model beside the policy (reference_bytes), in the model states.
"""

from __future__ import annotations

from launcher.config.architecture import (
    adapts_experts,
    count_params,
    expert_params,
    is_moe,
    kv_width,
    largest_layer_params,
    layer_linear_params,
    query_width,
    rank_params,
    router_params,
)
from launcher.config.hardware import gpu_preset
from launcher.config.objectives import has_reference_model, is_dpo, sequences_per_row
from launcher.config.schema import ModelConfig, RunConfig, StrategyConfig
from launcher.engines import engine_of
from launcher.engines.deepspeed.ds_config import SUB_GROUP_SIZE
from launcher.engines.peak_terms import Split, reference_weights
from launcher.estimator.flops import adapter_params, lora_targets

GIB = 1024**3

FRAMEWORK_BUFFER_BYTES = int(1.5 * GIB)
"""Per GPU: CUDA context (~0.5 GiB), NCCL buffers and ZeRO buckets (h*h elements each)."""
CPU_FRAMEWORK_BUFFER_BYTES = int(0.5 * GIB)
"""Per process on cluster.gpu=cpu: the torch/python runtime itself."""
FIT_FRACTION = 0.95
"""Share of the preset's memory we plan to use; the rest absorbs allocator fragmentation."""
DEEPSPEED_BUFFER_FACTOR = 1.5
"""DeepSpeed's `additional_buffer_factor` default for host-memory figures."""
LOGITS_BYTES_PER_ELEMENT = {2: 10, 4: 8}
"""Per s*b*V logit element of a training forward, by working-param bytes: 16-bit logits +
the loss's fp32 upcast + fp32 log-softmax (fp32: no upcast)."""
INFERENCE_LOGITS_BYTES_PER_ELEMENT = {2: 4, 4: 8}
"""Per logit element of the harness's loglikelihood forward (`F.log_softmax(logits)` in the
logits' own dtype, lm-eval's default softmax_dtype): the logits and their log-softmax, 2 x
the param bytes; no loss, so no upcast. Measured on CPU with the counting allocator: 4.00
bytes at bf16, 8.00 at fp32 (2 layers, vocab 32,000, 4 x 512 tokens)."""
QLORA_BYTES_PER_PARAM = 0.5 + 4 / 64
"""NF4: 4 bits per weight plus one fp32 absmax per 64-weight block (no double quant)."""
ADAPTER_BYTES_PER_PARAM = 16
"""LoRA adapters train in fp32: weight 4 + grad 4 + Adam m, v 8."""


# ---------------------------------------------------------------- model states


def engine_model_state_parts(
    total_params: int,
    largest_layer_params: int,
    world_size: int,
    zero_stage: int,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    param_bytes: int = 2,
) -> dict[str, float]:
    """Bytes per GPU the engine holds at its peak, by kind (docs/evidence/memory.md, "Engine
    accounting").

    Keys: params, grads, optimizer (fp32 master + Adam m, v), gathered (ZeRO-3's working
    set of one layer's full params and grads; 0 elsewhere), transient (alive only inside
    the optimizer step). A test that sums a live engine's tensors as the wrapped torch
    optimizer's step() starts should compare with params + grads + optimizer; the estimate
    plans for the sum of all. With offload_optimizer the optimizer and fp32 gradients live
    on the host and are left out here.
    """
    psi, p, n = total_params, param_bytes, world_size
    if zero_stage == 0:  # torch DDP, fp32 weights under autocast: + a bucket copy of grads
        return {"params": 4 * psi, "grads": 8 * psi, "optimizer": 8 * psi, "gathered": 0,
                "transient": 0}
    if zero_stage in (1, 2):
        if offload_optimizer:
            return {"params": p * psi, "grads": 0, "optimizer": 0, "gathered": 0,
                    "transient": 0}
        # 16-bit training briefly keeps the 16-bit grad partition while casting it to fp32
        transient = 2 * psi / n if p == 2 else 0
        return {"params": p * psi, "grads": 4 * psi / n, "optimizer": 12 * psi / n,
                "gathered": 0, "transient": transient}
    gathered = 2 * p * largest_layer_params
    if offload_optimizer:  # grads go to the host; offload_param also moves the 16-bit params
        params = 0 if offload_param else p * psi / n
        return {"params": params, "grads": 0, "optimizer": 0, "gathered": gathered,
                "transient": 0}
    grads = p * psi / n + 4 * min(SUB_GROUP_SIZE, psi / n)  # fp32 grads: one sub-group at a time
    return {"params": p * psi / n, "grads": grads, "optimizer": 12 * psi / n,
            "gathered": gathered, "transient": 0}


def param_bytes(precision: str) -> int:
    """Bytes of one working-copy parameter: 4 in fp32, 2 in fp16/bf16."""
    return 4 if precision == "fp32" else 2


def model_state_bytes(cfg: RunConfig, strategy: StrategyConfig) -> tuple[float, float]:
    """(GPU bytes per GPU, host bytes per node) of params, grads and optimizer states when
    cfg's model trains under `strategy` (which need not be cfg.strategy: the estimate asks
    for every strategy of the table on the same run)."""
    if cfg.peft.name != "none":
        return peft_model_state_bytes(cfg, strategy)
    psi, largest = rank_params(cfg.model, cfg.parallel.tp), largest_layer_params(cfg.model)
    n, p = cfg.shard_size, param_bytes(cfg.precision.name)
    parts = engine_model_state_parts(
        psi, largest, n, engine_of(strategy).memory_stage(strategy), strategy.offload_optimizer,
        strategy.offload_param, p,
    )
    # offloaded: fp32 master, grads and Adam (+ the 16-bit params) on each node's host
    per_param = (16 + (p if strategy.offload_param else 0)) if strategy.offload_optimizer else 0
    host = per_param * psi * cfg.cluster.gpus_per_node / n * DEEPSPEED_BUFFER_FACTOR
    if has_reference_model(cfg):  # objective=dpo: + the frozen reference, per rank held
        device, on_host = reference_bytes(cfg, strategy)
        return sum(parts.values()) + device, host + on_host * cfg.cluster.gpus_per_node
    return sum(parts.values()), host


# ---------------------------------------------------------------- DPO's reference model


def reference_weight_bytes(cfg: RunConfig, strategy: StrategyConfig) -> int:
    """Bytes per reference weight: TRL loads it in the policy's dtype (fp32 for a full
    fine-tune, launcher/rank/model.model_dtype); a DeepSpeed engine (fp32 masters apart)
    casts it to the training precision, DDP and FSDP2 keep fp32."""
    if engine_of(strategy).separate_master_weights:
        return param_bytes(cfg.precision.name)
    return 4


def reference_wrapped_by_trl(strategy: StrategyConfig) -> bool:
    """A sharding engine without DeepSpeed's own engine (FSDP2): TRL's prepare_fsdp shards
    the reference's root module only, and loads the reference even with
    precompute_ref_log_probs (for the precompute, then frees it)."""
    engine = engine_of(strategy)
    return engine.memory_stage(strategy) == 3 and not engine.separate_master_weights


def reference_split(cfg: RunConfig, strategy: StrategyConfig) -> Split:
    """(device, host) bytes per rank of objective=dpo's reference model once the engine
    wraps it (launcher/engines/peak_terms.reference_weights); (0, 0) where TRL builds none:
    objective=sft, LoRA/QLoRA (TRL disables the adapters for the reference pass), and
    precompute_ref_log_probs except under FSDP (loaded for the precompute only)."""
    if not has_reference_model(cfg) or (cfg.objective.precompute_ref_log_probs
                                    and not reference_wrapped_by_trl(strategy)):
        return (0.0, 0.0)
    return reference_weights(
        rank_params(cfg.model, cfg.parallel.tp), cfg.shard_size,
        engine_of(strategy).memory_stage(strategy), reference_weight_bytes(cfg, strategy),
        strategy.offload_param)


def reference_bytes(cfg: RunConfig, strategy: StrategyConfig) -> Split:
    """(device, host) bytes per rank of the reference held while training: reference_split,
    but none with precompute_ref_log_probs (TRL frees FSDP's after the precompute)."""
    if cfg.objective.precompute_ref_log_probs:
        return (0.0, 0.0)
    return reference_split(cfg, strategy)


def reference_placement(cfg: RunConfig, strategy: StrategyConfig) -> str:
    """Where objective=dpo's reference lives under `strategy`, in words (the estimate
    table); "" for objective=sft."""
    if not is_dpo(cfg):
        return ""
    if cfg.peft.name != "none":
        return f"none ({cfg.peft.name}: the base with the adapters disabled)"
    if cfg.objective.precompute_ref_log_probs:
        if reference_wrapped_by_trl(strategy):
            return "none while training (precompute_ref_log_probs; sharded before step 1)"
        return "none (precompute_ref_log_probs)"
    stage, dtype = engine_of(strategy).memory_stage(strategy), (
        "fp32" if reference_weight_bytes(cfg, strategy) == 4 else cfg.precision.name)
    if stage == 0:
        return f"full {dtype} replica per rank"
    if stage < 3:
        return f"full {dtype} replica per rank (TRL runs it at ZeRO stage 0)"
    where = "on the host" if strategy.offload_param else "on the GPU"
    return f"{dtype}, sharded like the policy, {where}"


def lora_base_bytes(cfg: RunConfig, strategy: StrategyConfig) -> int:
    """Bytes per weight of a LoRA run's frozen base as the engine holds it: what the worker
    loads (launcher/rank/model.model_dtype: bf16 when training in bf16, else fp32), which a
    DeepSpeed engine casts to the training precision and DDP/FSDP keep."""
    if engine_of(strategy).separate_master_weights:
        return param_bytes(cfg.precision.name)
    return 2 if cfg.precision.name == "bf16" else 4


def peft_model_state_bytes(cfg: RunConfig, strategy: StrategyConfig) -> tuple[float, float]:
    """LoRA/QLoRA: frozen base weights + fp32 adapters with grads and Adam states.

    A LoRA base's bytes per weight: lora_base_bytes. QLoRA stores the decoder's linear
    weights in NF4 (QLORA_BYTES_PER_PARAM); prepare_model_for_kbit_training upcasts the
    rest (embeddings, norms, lm_head) to fp32, which a DeepSpeed engine casts to the
    training precision. ZeRO-3/FSDP partition the base over the GPUs (offload_param
    moves it to the host); adapters are counted whole on every GPU
    (ADAPTER_BYTES_PER_PARAM each), an over-estimate of a few MB.
    """
    psi = count_params(cfg.model)
    if cfg.peft.bits == 4:
        p = param_bytes(cfg.precision.name) if engine_of(strategy).separate_master_weights else 4
        quantized = cfg.model.num_layers * layer_linear_params(cfg.model)
        base = quantized * QLORA_BYTES_PER_PARAM + (psi - quantized) * p
    else:
        p = lora_base_bytes(cfg, strategy)
        base = float(psi * p)
    adapters = float(adapter_params(cfg) * ADAPTER_BYTES_PER_PARAM)
    if engine_of(strategy).memory_stage(strategy) < 3:
        return base + adapters, 0.0
    if strategy.offload_param:
        per_node = base * cfg.cluster.gpus_per_node / cfg.world_size
        return adapters + 2 * p * largest_layer_params(cfg.model), per_node
    return base / cfg.world_size + adapters, 0.0


# ---------------------------------------------------------------- activations and buffers


def layer_activation_elements(model: ModelConfig, tp: int = 1, sp: int = 1) -> float:
    """Elements per token one decoder layer keeps for backward (measured fit, fp32 CPU,
    docs/evidence/memory.md section 4): ~8h (the two norm outputs, 2h; q, rotary products,
    attention output and o_proj's input, 6h at the query width heads x head_dim) + k, v at
    the KV width + the MLP's (mlp_activation_elements). Tensor parallelism splits all but
    the two norm outputs (derived). Sequence parallelism (per token of the rank's slice)
    adds q, k, v and the attention output in Ulysses's head-split layout, which sdpa keeps
    besides the slice's own (docs/evidence/memory.md). Measured on Llama (query width = h);
    q_norm/k_norm's inputs (qwen3, gemma3_text) are left out."""
    h, q, kv = model.hidden_size, query_width(model), kv_width(model)
    ulysses = 2 * q + 2 * kv if sp > 1 else 0
    return 2 * h + (6 * q + 2 * kv + mlp_activation_elements(model)) / tp + ulysses


def mlp_activation_elements(model: ModelConfig, frozen: bool = False) -> float:
    """Elements per token one layer's MLP keeps for backward. Dense: 4i (gate, up,
    silu(gate), the product; measured); a frozen base (LoRA) 3i, its linears keep no input.

    A mixture of experts (derived from transformers 5.24's experts forward, the default
    grouped_mm one of integrations/moe.py and the eager loop alike; not measured): the
    token goes through experts_per_token experts, and each keeps what a dense MLP keeps
    plus the token's gathered copy (h, gate_up's input) and its output before the routing
    weight scales it (h): k x (4i + 2h); the router its logits and softmax (2E; the logits
    also for the load-balancing loss). Frozen: k x (3i + h) + E. No capacity limit: every
    token reaches its k experts (none dropped), so the figure does not depend on how
    evenly the router spreads them."""
    i = model.intermediate_size
    if not is_moe(model):
        return (3 if frozen else 4) * i
    k, e, h = model.experts_per_token, model.num_experts, model.hidden_size
    if frozen:
        return k * (3 * i + h) + e
    return k * (4 * i + 2 * h) + 2 * e


def micro_sequences(cfg: RunConfig) -> int:
    """Sequences of one micro batch: train.micro_batch_size, twice it under objective=dpo
    (TRL's DataCollatorForPreference puts each pair's chosen and rejected sequence, each
    with the prompt, into one batch)."""
    return cfg.train.micro_batch_size * sequences_per_row(cfg)


def rank_sequence(cfg: RunConfig) -> int:
    """Tokens of each sequence one rank runs: dataset.max_length, split over the
    sequence-parallel ranks (padded to a multiple of parallel.sp)."""
    return -(-cfg.dataset.max_length // cfg.parallel.sp)


def activation_bytes(cfg: RunConfig) -> float:
    """Activations of one micro batch at dataset.max_length (a rank's slice of it under
    sequence parallelism) when the forward returns (the same under every strategy: none
    of them shards activations); outside the layers 3h per token (embedding output, final
    norm) and the logits. No s x s term but eager attention's (attention_score_bytes):
    SDPA on GPU and torch's CPU flash kernel keep no attention scores (measured: the s =
    128 run doubled, it did not quadruple). With gradient checkpointing each layer keeps
    its input only (measured -2.7 %)."""
    model = cfg.model
    s, b, h = rank_sequence(cfg), micro_sequences(cfg), model.hidden_size
    checkpointed = cfg.train.gradient_checkpointing
    per_layer = (h if checkpointed
                 else layer_activation_elements(model, cfg.parallel.tp, cfg.parallel.sp))
    layers = model.num_layers * per_layer + 3 * h
    scores = 0.0 if checkpointed else model.num_layers * attention_score_bytes(cfg)
    return (param_bytes(cfg.precision.name) * s * b * layers + scores
            + training_logits_bytes(cfg, s))


SCORE_BYTES = {"fp32": 4, "fp16": 6, "bf16": 6}
"""Bytes per attention score eager attention keeps for backward: softmax's output, which it
computes in fp32, and under 16-bit precision also the 16-bit copy the scores-times-values
matmul keeps (measured, fp32 and bf16 on CPU: ddp, the ~102M Llama at 2 x 512 tokens,
eager minus sdpa at the forward's end = 4 and 6 bytes x b x heads x s^2 x layers, to
0.2 %; docs/evidence/memory.md)."""


def attention_score_bytes(cfg: RunConfig) -> float:
    """One layer's attention scores kept for backward: eager attention's b x heads x s x s
    (a tensor-parallel rank's share of the heads); 0 for the kernels that keep none (sdpa,
    FlashAttention, FlexAttention recompute them in backward)."""
    if cfg.model.attn_implementation != "eager":
        return 0.0
    heads = cfg.model.num_heads / cfg.parallel.tp
    return (SCORE_BYTES[cfg.precision.name] * micro_sequences(cfg) * heads
            * rank_sequence(cfg) ** 2)


def logits_bytes(cfg: RunConfig, s: int) -> float:
    """One micro batch's logits and their fp32 log-softmax. objective=dpo: TRL's fused LM
    head scores the answer tokens in chunks and never holds the whole s x b x V logits,
    so there this term is an upper bound (not measured)."""
    p = param_bytes(cfg.precision.name)
    return s * micro_sequences(cfg) * cfg.model.vocab_size * LOGITS_BYTES_PER_ELEMENT[p]


def training_logits_bytes(cfg: RunConfig, s: int) -> float:
    """The logits term of a training forward: logits_bytes, or with train.liger_kernel
    (objective=sft) what Liger's fused linear + cross-entropy holds instead. Derived from
    its source (liger-kernel 0.8, ops/fused_linear_cross_entropy.py), not measured (no
    GPU here): it runs the T = s x b tokens through the LM head in chunks of
    next_pow2(ceil(T / ceil(V / h))) rows, about T x h logits at a time in the compute
    precision (its cross-entropy kernel writes their gradient over them: no fp32 copy),
    and keeps the input's gradient (T x h) from the forward to the backward. Its other
    buffer, the LM head's weight gradient, is the gradient the states count. DPO is left
    as it is: TRL's DPOTrainer applies only Liger's layer kernels and chunks the logits
    itself."""
    if not cfg.train.liger_kernel or is_dpo(cfg):
        return logits_bytes(cfg, s)
    p, h, vocab = param_bytes(cfg.precision.name), cfg.model.hidden_size, cfg.model.vocab_size
    tokens = s * micro_sequences(cfg)
    chunks = -(-vocab // h)
    rows = min(tokens, 1 << max(-(-tokens // chunks) - 1, 0).bit_length())
    return p * (rows * vocab + tokens * h)


LORA_INPUT = {"q_proj": "attn_in", "k_proj": "attn_in", "v_proj": "attn_in",
              "o_proj": "attn_out", "gate_proj": "mlp_in", "up_proj": "mlp_in",
              "down_proj": "mlp_mid"}
"""The tensor each LoRA-targeted linear reads: q, k, v share the attention norm's output,
gate and up the MLP norm's output."""


def lora_activation_bytes(cfg: RunConfig) -> float:
    """Activations of one micro batch when the forward returns, LoRA (frozen base) runs.

    Measured (fp32 CPU, q/k/v/o adapters: 91.9M against 89.3M for full fine-tuning,
    docs/evidence/memory.md section 12) and counted per op with saved-tensor hooks: a frozen
    linear keeps nothing for backward (its input gradient needs only the weight), so the
    norms' outputs, o_proj's and down_proj's inputs are not kept; what stays per layer is
    the two norms' inputs (2h), SDPA's q, k, v and output (2h + 2 kv), the MLP's gate, up
    and silu(gate) (3i), and per adapted linear of input width w: dropout's mask (w; torch
    on CPU keeps a float noise tensor, a GPU's fused dropout a bool mask: 1 byte, derived),
    the dropout output lora_A keeps (w) and lora_A's output (r). Layer 0 reads the frozen
    embedding: its attention norm keeps nothing and the q/k/v dropouts no mask. Outside the
    layers the final norm's input (h) and the logits. Without dropout (peft's Identity)
    lora_A keeps its input, once per distinct input. Gradient checkpointing: each layer
    keeps its input, as in activation_bytes (derived). Only one shape was measured. An MoE
    layer's frozen experts: mlp_activation_elements(frozen); adapted ones (all-linear, no
    dropout): expert_lora_bytes."""
    if cfg.train.gradient_checkpointing:
        return activation_bytes(cfg) + expert_lora_bytes(cfg)
    model = cfg.model
    s, b, h, r = cfg.dataset.max_length, micro_sequences(cfg), model.hidden_size, cfg.peft.r
    e = param_bytes(cfg.precision.name)
    mask = e if gpu_preset(cfg.cluster.gpu).is_cpu else 1
    q, kv = query_width(model), kv_width(model)
    widths = {"attn_in": h, "attn_out": q, "mlp_in": h, "mlp_mid": model.intermediate_size}
    targets, experts = lora_targets(cfg), adapts_experts(cfg)
    mlp = mlp_activation_elements(model, frozen=not experts)
    layer = e * (2 * h + 2 * q + 2 * kv + mlp + r * len(targets))
    if cfg.peft.dropout > 0:
        layer += sum((e + mask) * widths[LORA_INPUT[t]] for t in targets)
        first = layer - e * h - sum(mask * h for t in targets if LORA_INPUT[t] == "attn_in")
    else:  # lora_A keeps its input itself, one per distinct input tensor; adapted experts
        # and router keep theirs (the MLP norm's output) for their weights' gradients
        inputs = {LORA_INPUT[t] for t in targets} | ({"mlp_in"} if experts else set())
        layer += sum(e * widths[i] for i in inputs)
        first = layer - e * h
    layers = (model.num_layers - 1) * layer + first + e * h
    # eager attention's scores: the adapted q/k/v need their gradients through them
    # (derived from the full fine-tune's measurement)
    scores = model.num_layers * attention_score_bytes(cfg)
    return s * b * layers + scores + training_logits_bytes(cfg, s) + expert_lora_bytes(cfg)


def expert_lora_bytes(cfg: RunConfig) -> float:
    """Adapted experts (architecture.adapts_experts): peft runs each MoE layer on its experts' and
    router's weights with the update added, W + scaling x B @ A, a new tensor of the whole
    layer's experts that the backward keeps (it forms that weight's gradient), in the
    compute precision; per layer, whatever the micro batch; one layer at a time under
    gradient checkpointing. Measured with saved-tensor hooks on the tiny MoE (fp32, 2 x 16
    tokens; tests/unit/test_moe.py): all-linear keeps these weights and the unfrozen
    experts' and router's inputs over attention-only LoRA. 0 otherwise."""
    if not adapts_experts(cfg):
        return 0.0
    model = cfg.model
    layers = 1 if cfg.train.gradient_checkpointing else model.num_layers
    weights = expert_params(model) + router_params(model)
    return float(param_bytes(cfg.precision.name) * layers * weights)


def recompute_bytes(cfg: RunConfig) -> float:
    """Gradient checkpointing: the one layer whose activations the backward rebuilds at a
    time (derived, not isolated by a measurement); 0 without it."""
    if not cfg.train.gradient_checkpointing:
        return 0.0
    return layer_bytes(cfg)


def layer_bytes(cfg: RunConfig) -> float:
    """One decoder layer's activations of one micro batch."""
    s, b = rank_sequence(cfg), micro_sequences(cfg)
    return float(param_bytes(cfg.precision.name) * s * b
                 * layer_activation_elements(cfg.model, cfg.parallel.tp, cfg.parallel.sp)
                 + attention_score_bytes(cfg))
