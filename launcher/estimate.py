"""What a run will cost before any GPU is touched: parameters, FLOPs, time, per-GPU memory.

Pure arithmetic on the RunConfig (no torch, transformers or deepspeed import), so `ftl
estimate` and `ftl plan` answer at once. Sources of each figure:

- Parameters: counted from the architecture numbers (Llama-style decoder: GQA attention,
  gated MLP, RMSNorm, q/k/v biases for architecture=qwen2, untied lm_head unless
  `model.tie_word_embeddings`). Equal to the published counts of Llama-2 7B/13B/70B and
  Mistral-7B, and to HF models built from the same numbers (tests).
- Compute: C = 6*P*D FLOPs (forward 2PD, backward 4PD; Kaplan et al. 2020), plus one more
  forward (2PD) when `train.gradient_checkpointing` recomputes activations. Attention's
  s^2 FLOPs are left out, as in the 6PD rule. Time = C / (world size x peak x `train.mfu`)
  with the preset's dense 16-bit peak (fp16/bf16) or fp32 peak (fp32). The same MFU is used
  for every strategy: offload usually runs at a lower MFU, which we do not guess. With
  LoRA/QLoRA the frozen base gets no weight gradients: C = 4PD (+2PD with checkpointing).
- Tokens D: train.max_steps x global batch x dataset.max_length when max_steps > 0, else
  dataset.num_tokens x train.epochs; None (said so, not invented) when neither is known.
  Callers that count the data pass `tokens=`.
- Model states, three accountings (`accounting=`):
  * "engine" (DEFAULT): what the DeepSpeed engine really allocates, from its source and
    measured on live engines; see ENGINE_ACCOUNTING_NOTES. Precision-aware.
  * "zero_paper": Rajbhandari et al. 2019 (arXiv 1910.02054), 2 + 2 + K bytes per
    parameter (16-bit params, 16-bit grads, K=12 fp32 master + Adam m, v), split over Nd by
    stage. Its table (psi=7.5e9, Nd=64): 120 / 31.4 / 16.6 / 1.9 GB.
  * "deepspeed": DeepSpeed's own `estimate_zero2_model_states_mem_needs` and
    `estimate_zero3_model_states_mem_needs`, reproduced to the byte (tested by calling
    them): 18 bytes per partitioned parameter (they also count fp32 gradients), ZeRO-3
    adds 4 bytes x the largest layer, host figures carry `additional_buffer_factor` 1.5.
    They assume 16-bit training whatever the precision, and they under-count ZeRO-3 by
    one 16-bit partition (2*psi/N), which is why they are not the default.
- Activations: Korthikanti et al. 2022 (arXiv 2205.05198), per layer s*b*h*(34 + 5*a*s/h)
  bytes in 16-bit. The 5*a*s/h term is the stored s x s attention scores; HF models run
  SDPA/flash attention on GPU, which never stores them, so `estimate` leaves the term out
  on GPU presets and keeps it on `cluster.gpu=cpu` (conservative: torch may fall back to
  its math kernel there, which materialises the scores). The 34 is GPT's 4h MLP; a
  Llama gated MLP stores somewhat more, so treat the figure as a close lower bound.
  With gradient checkpointing each layer keeps only its 16-bit input (2*s*b*h) and one
  layer's full activations exist during its recomputation. Logits add s*b*V*10 bytes
  (16-bit logits, their fp32 upcast for the loss, fp32 log-softmax kept for backward).
  fp32 precision doubles the per-element bytes.
- Framework allowance per GPU: FRAMEWORK_BUFFER_BYTES (CUDA context, NCCL buffers, ZeRO
  communication buckets); a run "fits" when model states + activations + allowance
  <= FIT_FRACTION of the preset's memory (the rest is allocator fragmentation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from launcher.hardware import GpuPreset, gpu_preset
from launcher.schema import ModelConfig, RunConfig

GIB = 1024**3

FRAMEWORK_BUFFER_BYTES = int(1.5 * GIB)
"""Per GPU: CUDA context (~0.5 GiB), NCCL buffers and ZeRO buckets (h*h elements each)."""
CPU_FRAMEWORK_BUFFER_BYTES = int(0.5 * GIB)
"""Per process on cluster.gpu=cpu: the torch/python runtime itself."""
FIT_FRACTION = 0.95
"""Share of the preset's memory we plan to use; the rest absorbs allocator fragmentation."""
DEEPSPEED_BUFFER_FACTOR = 1.5
"""DeepSpeed's `additional_buffer_factor` default for host-memory figures."""
LOGITS_BYTES_PER_ELEMENT = {16: 10, 32: 8}
"""Per s*b*V logit element: 16-bit logits + fp32 upcast + fp32 log-softmax (fp32: no upcast)."""
QLORA_BYTES_PER_PARAM = 0.5 + 4 / 64
"""NF4: 4 bits per weight plus one fp32 absmax per 64-weight block (no double quant)."""
ADAPTER_BYTES_PER_PARAM = 16
"""LoRA adapters train in fp32: weight 4 + grad 4 + Adam m, v 8."""

ZERO3_SUB_GROUP_SIZE = 1_000_000_000
"""ZeRO-3 `sub_group_size` the ds_config writes (launcher/ds_config.py SUB_GROUP_SIZE)."""

ACCOUNTINGS = ("engine", "deepspeed", "zero_paper")
DEFAULT_ACCOUNTING = "engine"

ENGINE_ACCOUNTING_NOTES = """\
engine accounting: what DeepSpeed 0.19.8 holds per rank, read from stage_1_and_2.py /
stage3.py and measured (every live tensor summed on 2 CPU ranks and 1, tiny Llama, bf16
and fp32). psi = parameters, N = world size, p = 2 (fp16/bf16) or 4 (fp32), L = largest layer.
  zero1, zero2: p*psi + (16 + g)*psi/N; 16 = fp32 grads 4 + fp32 master 4 + Adam 8 of the
         partition; g = 2 in 16-bit (the 16-bit grad partition is still alive while it is
         cast to fp32 inside step(): read from the source, too brief for a snapshot at the
         step's start to see), 0 in fp32. Stage 1 held exactly what stage 2 held.
         For 16-bit this equals DeepSpeed's 2*psi + 18*psi/N.
  zero3: (2p + 12)*psi/N + 4*min(sub_group_size, psi/N) + 2p*L: 16-bit param and grad
         partitions stay allocated, fp32 grads exist one sub-group at a time, one layer's
         params + grads are gathered. DeepSpeed's function says 4L + 18*psi/N (it leaves
         out one 16-bit partition): measured 20.05 bytes/param at N=1, 10.05 at N=2.
  offload: GPU keeps the 16-bit params (zero2_offload) or only the gathered layer
         (zero3_offload); host per node = (16 [+ p with offload_param]) * psi *
         gpus_per_node / N * 1.5 (DeepSpeed's additional_buffer_factor). On CPU, where
         "GPU" and host are the same memory, a rank held (fp32, N=2) 15.6 bytes/param with
         zero2_offload (predicted 4 + 12 = 16.0) and 12.1 with zero3_offload (predicted
         15.0: the 1.5 factor is headroom there).
  ddp:   torch DDP under the HF Trainer: fp32 weights with autocast, 4 params + 4 grads +
         4 bucket copy of the grads (gradient_as_bucket_view=False) + 8 Adam = 20*psi.
         Not measured (the reducer's buckets are not Python-visible).
  fsdp / fsdp_offload: counted as zero3 / zero3_offload.
"""


@dataclass(frozen=True)
class StrategyShape:
    """What the estimator needs to know about a strategy (mirrors configs/strategy/)."""

    name: str
    zero_stage: int
    offload_optimizer: bool = False
    offload_param: bool = False
    backend: str = "deepspeed"


STRATEGY_SHAPES: dict[str, StrategyShape] = {
    s.name: s
    for s in (
        StrategyShape("ddp", 0, backend="ddp"),
        StrategyShape("zero1", 1),
        StrategyShape("zero2", 2),
        StrategyShape("zero2_offload", 2, offload_optimizer=True),
        StrategyShape("zero3", 3),
        StrategyShape("zero3_offload", 3, offload_optimizer=True, offload_param=True),
        StrategyShape("fsdp", 3, backend="fsdp"),
        StrategyShape("fsdp_offload", 3, True, True, backend="fsdp"),
    )
}


# ---------------------------------------------------------------- parameters and compute


def _linear_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear layer in one decoder layer, by HF module name."""
    h, inter = model.hidden_size, model.intermediate_size
    kv = h // model.num_heads * model.num_kv_heads
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def layer_linear_params(model: ModelConfig) -> int:
    """Weights of one decoder layer's linear layers (the ones QLoRA quantizes)."""
    return sum(i * o for i, o in _linear_shapes(model).values())


def count_params(model: ModelConfig) -> int:
    """Total parameters of a Llama-style decoder from its architecture numbers."""
    h = model.hidden_size
    kv = h // model.num_heads * model.num_kv_heads
    bias = h + 2 * kv if model.architecture == "qwen2" else 0  # Qwen2 has q/k/v biases
    per_layer = layer_linear_params(model) + bias + 2 * h  # + input/post-attention norms
    embeddings = model.vocab_size * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return embeddings + model.num_layers * per_layer + h + lm_head  # + final norm


def largest_layer_params(model: ModelConfig) -> int:
    """Parameters of the largest single module (what DeepSpeed's model_to_params finds)."""
    biased = ("q_proj", "k_proj", "v_proj") if model.architecture == "qwen2" else ()
    linear = max(i * o + (o if name in biased else 0)
                 for name, (i, o) in _linear_shapes(model).items())
    return max(model.vocab_size * model.hidden_size, linear)


def adapter_params(cfg: RunConfig) -> int:
    """LoRA adapter parameters: r*(in+out) per targeted linear per layer ("all-linear": all)."""
    if cfg.peft.name == "none":
        return 0
    shapes = _linear_shapes(cfg.model)
    targets = shapes if "all-linear" in cfg.peft.target_modules else cfg.peft.target_modules
    per_layer = sum(cfg.peft.r * sum(shapes[t]) for t in targets if t in shapes)
    return cfg.model.num_layers * per_layer


def global_batch_size(cfg: RunConfig) -> int:
    train = cfg.train
    return train.global_batch_size or train.micro_batch_size * train.grad_accum * cfg.world_size


def training_tokens(cfg: RunConfig) -> int | None:
    """Tokens D the run processes; None when neither max_steps nor num_tokens says."""
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps * global_batch_size(cfg) * cfg.dataset.max_length
    if cfg.dataset.num_tokens:
        return int(cfg.dataset.num_tokens * cfg.train.epochs)
    return None


def training_flops(
    params: int, tokens: int, gradient_checkpointing: bool = False, frozen_base: bool = False
) -> float:
    """C = 6PD (2PD forward + 4PD backward), + 2PD for the recomputed forward.

    With LoRA/QLoRA (`frozen_base`) the backward pass computes activation gradients (2PD)
    but no weight gradients for the frozen base, so C = 4PD (+2PD with checkpointing);
    the adapters' own FLOPs are negligible.
    """
    per_token = (4 if frozen_base else 6) + (2 if gradient_checkpointing else 0)
    return float(per_token) * params * tokens


def peak_flops(preset: GpuPreset, precision: str) -> float:
    """Dense peak FLOP/s of one device at the run's precision."""
    tflops = preset.peak_tflops_fp32 if precision == "fp32" else preset.peak_tflops_16bit
    return tflops * 1e12


def training_seconds(flops: float, world_size: int, peak: float, mfu: float) -> float:
    return flops / (world_size * peak * mfu)


# ---------------------------------------------------------------- model states


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
    `estimate_zero3_model_states_mem_needs` (zero_init=True); both assume 16-bit training
    whatever the precision. Stage 1 uses the stage-2 function (DeepSpeed has no stage-1
    estimator; both stages run DeepSpeedZeroOptimizer and held the same bytes when
    measured). Stage 0 is the ZeRO paper's 16 bytes per parameter (no DeepSpeed function).
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


def engine_model_state_parts(
    total_params: int,
    largest_layer_params: int,
    world_size: int,
    zero_stage: int,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    param_bytes: int = 2,
    sub_group_size: int = ZERO3_SUB_GROUP_SIZE,
) -> dict[str, float]:
    """Bytes per GPU the engine holds at its peak, by kind (see ENGINE_ACCOUNTING_NOTES).

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
    grads = p * psi / n + 4 * min(sub_group_size, psi / n)  # fp32 grads: one sub-group at a time
    return {"params": p * psi / n, "grads": grads, "optimizer": 12 * psi / n,
            "gathered": gathered, "transient": 0}


def engine_host_bytes(
    total_params: int, gpus_per_node: int, world_size: int, shape: StrategyShape, p: int
) -> float:
    """Host RAM per node for offloaded states: fp32 master, grads, Adam (+ 16-bit params)."""
    if not shape.offload_optimizer:
        return 0.0
    per_param = 16 + (p if shape.offload_param else 0)
    return per_param * total_params * gpus_per_node / world_size * DEEPSPEED_BUFFER_FACTOR


def param_bytes(precision: str) -> int:
    """Bytes of one working-copy parameter: 4 in fp32, 2 in fp16/bf16."""
    return 4 if precision == "fp32" else 2


def model_state_bytes(
    cfg: RunConfig, shape: StrategyShape, accounting: str = DEFAULT_ACCOUNTING
) -> tuple[float, float]:
    """(GPU bytes per GPU, host bytes per node) of params, grads and optimizer states."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {ACCOUNTINGS}, not {accounting!r}")
    if cfg.peft.name != "none":
        return peft_model_state_bytes(cfg, shape)
    psi, largest = count_params(cfg.model), largest_layer_params(cfg.model)
    nodes, per_node, n = cfg.cluster.nodes, cfg.cluster.gpus_per_node, cfg.world_size
    if accounting == "zero_paper":
        if shape.offload_optimizer:
            return zero_paper_offload(psi, n, per_node, shape.offload_param)
        return zero_paper_model_states(psi, n, shape.zero_stage), 0.0
    if accounting == "deepspeed":
        host, gpu = deepspeed_model_states(
            psi, largest, per_node, nodes, shape.zero_stage,
            shape.offload_optimizer, shape.offload_param,
        )
        return float(gpu), float(host)
    p = param_bytes(cfg.precision.name)
    parts = engine_model_state_parts(
        psi, largest, n, shape.zero_stage, shape.offload_optimizer, shape.offload_param, p
    )
    return sum(parts.values()), engine_host_bytes(psi, per_node, n, shape, p)


def peft_model_state_bytes(cfg: RunConfig, shape: StrategyShape) -> tuple[float, float]:
    """LoRA/QLoRA: frozen base weights + fp32 adapters with grads and Adam states.

    Base bytes per weight follow what the worker loads: fp32 weights, which a DeepSpeed
    engine casts to the 16-bit dtype (2 bytes) and DDP/FSDP keep (4 bytes, autocast does
    the 16-bit math). QLoRA stores the decoder's linear weights in NF4
    (QLORA_BYTES_PER_PARAM); prepare_model_for_kbit_training upcasts the rest (embeddings,
    norms, lm_head) to fp32. ZeRO-3/FSDP partition the base over the GPUs (offload_param
    moves it to the host); adapters are counted whole on every GPU
    (ADAPTER_BYTES_PER_PARAM each), an over-estimate of a few MB.
    """
    psi = count_params(cfg.model)
    p = param_bytes(cfg.precision.name) if shape.backend == "deepspeed" else 4
    if cfg.peft.bits == 4:
        quantized = cfg.model.num_layers * layer_linear_params(cfg.model)
        base = quantized * QLORA_BYTES_PER_PARAM + (psi - quantized) * p
    else:
        base = float(psi * p)
    adapters = float(adapter_params(cfg) * ADAPTER_BYTES_PER_PARAM)
    if shape.zero_stage < 3:
        return base + adapters, 0.0
    if shape.offload_param:
        per_node = base * cfg.cluster.gpus_per_node / cfg.world_size
        return adapters + 2 * p * largest_layer_params(cfg.model), per_node
    return base / cfg.world_size + adapters, 0.0


# ---------------------------------------------------------------- activations


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, scores: bool = True) -> float:
    """Activation bytes one transformer layer stores in 16-bit (Korthikanti et al. 2022)."""
    return s * b * h * (34 + (5 * a * s / h if scores else 0))


def activation_bytes(cfg: RunConfig) -> float:
    """Per-GPU activation memory of one micro batch at dataset.max_length."""
    model = cfg.model
    s, b = cfg.dataset.max_length, cfg.train.micro_batch_size
    h, a, layers = model.hidden_size, model.num_heads, model.num_layers
    scale = 2 if cfg.precision.name == "fp32" else 1  # the formula counts 16-bit elements
    scores = gpu_preset(cfg.cluster.gpu).is_cpu  # SDPA/flash on GPU stores no s x s scores
    one_layer = korthikanti_layer_bytes(s, b, h, a, scores)
    if cfg.train.gradient_checkpointing:
        layers_bytes = layers * 2 * s * b * h + one_layer
    else:
        layers_bytes = layers * one_layer
    logits = s * b * model.vocab_size * LOGITS_BYTES_PER_ELEMENT[16 * scale]
    return scale * layers_bytes + logits


def framework_buffer_bytes(preset: GpuPreset) -> int:
    return CPU_FRAMEWORK_BUFFER_BYTES if preset.is_cpu else FRAMEWORK_BUFFER_BYTES


def device_memory_bytes(cfg: RunConfig) -> float:
    """Memory one rank may use: the GPU's, or on gpu=cpu the host's share per process."""
    preset = gpu_preset(cfg.cluster.gpu)
    per_rank = preset.memory_gib / cfg.cluster.gpus_per_node if preset.is_cpu else preset.memory_gib
    return per_rank * GIB


# ---------------------------------------------------------------- per strategy and report


@dataclass
class StrategyEstimate:
    strategy: str
    model_state_gpu_bytes: float
    activation_bytes: float
    buffer_bytes: float
    gpu_bytes: float
    gpu_capacity_bytes: float
    host_bytes: float
    """Host RAM per node (offload states, or the fp32 load copy DeepSpeed counts)."""
    host_capacity_bytes: float | None
    fits_gpu: bool
    fits_host: bool
    fits: bool
    est_seconds: float | None


@dataclass
class Estimate:
    model: str
    params: int
    trainable_params: int
    tokens: int | None
    flops: float | None
    est_seconds: float | None
    gpu_hours: float | None
    precision: str
    accounting: str
    cluster: dict
    strategy: str
    """The configured strategy (may be `auto`)."""
    strategies: list[StrategyEstimate]


def shape_of(cfg: RunConfig) -> StrategyShape:
    """The configured strategy as the estimator sees it (user overrides included)."""
    st = cfg.strategy
    stage = 3 if st.backend == "fsdp" else st.zero_stage
    return StrategyShape(st.name, stage, st.offload_optimizer, st.offload_param, st.backend)


def strategy_estimate(
    cfg: RunConfig, shape: StrategyShape, accounting: str, seconds: float | None
) -> StrategyEstimate:
    preset = gpu_preset(cfg.cluster.gpu)
    states, host = model_state_bytes(cfg, shape, accounting)
    acts, buffers = activation_bytes(cfg), framework_buffer_bytes(preset)
    gpu = states + acts + buffers
    capacity = device_memory_bytes(cfg)
    host_cap = cfg.cluster.host_memory_gib * GIB if cfg.cluster.host_memory_gib > 0 else None
    fits_gpu = gpu <= FIT_FRACTION * capacity
    fits_host = host_cap is None or host <= host_cap
    return StrategyEstimate(
        shape.name, states, acts, buffers, gpu, capacity, host, host_cap,
        fits_gpu, fits_host, fits_gpu and fits_host, seconds,
    )


def estimate(
    cfg: RunConfig, accounting: str = DEFAULT_ACCOUNTING, tokens: int | None = None
) -> Estimate:
    """Every strategy's memory on cfg's cluster, plus FLOPs and time for the whole run.

    `tokens` overrides the figure from the config (e.g. counted from the data by the caller).
    The configured strategy is computed from cfg.strategy itself, so an override such as
    strategy.offload_param=true shows up in its row.
    """
    preset = gpu_preset(cfg.cluster.gpu)
    params = count_params(cfg.model)
    tokens = tokens if tokens is not None else training_tokens(cfg)
    flops = seconds = hours = None
    if tokens is not None:
        flops = training_flops(
            params, tokens, cfg.train.gradient_checkpointing, cfg.peft.name != "none"
        )
        seconds = training_seconds(
            flops, cfg.world_size, peak_flops(preset, cfg.precision.name), cfg.train.mfu
        )
        hours = seconds * cfg.world_size / 3600
    shapes = dict(STRATEGY_SHAPES)
    if cfg.strategy.name in shapes:
        shapes[cfg.strategy.name] = shape_of(cfg)
    rows = [strategy_estimate(cfg, s, accounting, seconds) for s in shapes.values()]
    trainable = adapter_params(cfg) if cfg.peft.name != "none" else params
    cluster = {
        "nodes": cfg.cluster.nodes, "gpus_per_node": cfg.cluster.gpus_per_node,
        "world_size": cfg.world_size, "gpu": cfg.cluster.gpu,
        "gpu_memory_gib": preset.memory_gib, "host_memory_gib": cfg.cluster.host_memory_gib,
    }
    return Estimate(
        cfg.model.name, params, trainable, tokens, flops, seconds, hours,
        cfg.precision.name, accounting, cluster, cfg.strategy.name, rows,
    )


def estimate_json(
    cfg: RunConfig, accounting: str = DEFAULT_ACCOUNTING, tokens: int | None = None
) -> dict:
    """`ftl estimate --json`: the Estimate as plain JSON types, plus the chosen strategy."""
    est = estimate(cfg, accounting, tokens)
    data = asdict(est)
    data["chosen"] = chosen_strategy(cfg, est)
    return data


def chosen_strategy(cfg: RunConfig, est: Estimate) -> str | None:
    """The configured strategy, or for `auto` the one auto would pick (None: nothing fits)."""
    if cfg.strategy.name != "auto":
        return cfg.strategy.name
    from launcher.auto import fastest_fitting  # auto imports this module

    name, _ = fastest_fitting(cfg, est.strategies)
    return name


def render_estimate_table(
    cfg: RunConfig, accounting: str = DEFAULT_ACCOUNTING, tokens: int | None = None
) -> str:
    """`ftl estimate`: a fixed-width table of every strategy, the chosen one marked `*`."""
    est = estimate(cfg, accounting, tokens)
    chosen = chosen_strategy(cfg, est)
    c = est.cluster
    host = f"{c['host_memory_gib']:g} GiB host RAM/node" if c["host_memory_gib"] else (
        "host RAM not checked (cluster.host_memory_gib=0)"
    )
    lines = [
        f"{est.model}: {_count(est.params)} params ({_trainable(est)}), "
        f"precision {est.precision}, {c['nodes']} node(s) x "
        f"{c['gpus_per_node']} {c['gpu']} ({c['gpu_memory_gib']:g} GiB), {host}",
        _compute_line(cfg, est),
        f"memory: {accounting} accounting; fits = total <= {FIT_FRACTION:.0%} of device "
        f"memory; total includes {framework_buffer_bytes(gpu_preset(c['gpu'])) / GIB:g} GiB "
        f"framework buffers; micro batch {cfg.train.micro_batch_size} x "
        f"{cfg.dataset.max_length} tokens"
        + (", gradient checkpointing" if cfg.train.gradient_checkpointing else ""),
        "",
    ]
    unit, size = ("GiB", GIB) if max(r.gpu_bytes for r in est.strategies) >= GIB else (
        "MiB", 1024**2
    )
    lines.append(
        f"  {'strategy':<14}{'states ' + unit:>11}{'activ. ' + unit:>11}{'total ' + unit:>11}"
        f"{'fits':>6}{'host ' + unit + '/node':>15}{'time':>10}"
    )
    for row in est.strategies:
        mark = "*" if row.strategy == chosen else " "
        fits = "yes" if row.fits else ("no" if not row.fits_gpu else "host")
        lines.append(
            f"{mark} {row.strategy:<14}{row.model_state_gpu_bytes / size:>11.2f}"
            f"{row.activation_bytes / size:>11.2f}{row.gpu_bytes / size:>11.2f}{fits:>6}"
            f"{row.host_bytes / size:>15.1f}{_duration(row.est_seconds):>10}"
        )
    lines.append("")
    lines.append(_chosen_line(cfg, chosen))
    return "\n".join(lines)


def _trainable(est: Estimate) -> str:
    if est.trainable_params == est.params:
        return "all trainable"
    return f"{_count(est.trainable_params)} trainable adapter params"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _compute_line(cfg: RunConfig, est: Estimate) -> str:
    if est.tokens is None or est.flops is None:
        return (
            "compute: unknown - the token count is not known; set dataset.num_tokens "
            "(tokens per epoch) or train.max_steps"
        )
    return (
        f"compute: {est.tokens:.3g} tokens, {est.flops:.3g} FLOPs "
        f"({_flops_rule(cfg)}), {_duration(est.est_seconds)} "
        f"at MFU {cfg.train.mfu:g} = {est.gpu_hours:.3g} GPU-hours (same MFU for every row)"
    )


def _flops_rule(cfg: RunConfig) -> str:
    per_token = (4 if cfg.peft.name != "none" else 6) + 2 * cfg.train.gradient_checkpointing
    return f"{per_token}PD"


def _chosen_line(cfg: RunConfig, chosen: str | None) -> str:
    if cfg.strategy.name != "auto":
        return f"* configured: strategy={chosen}"
    if chosen is None:
        return "strategy=auto: nothing fits (see `ftl plan` for the reasons and fixes)"
    return f"* strategy=auto picks {chosen} (the fastest that fits)"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.2g} s"
