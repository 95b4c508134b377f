"""Typed configuration: one dataclass per Hydra group, registered in Hydra's ConfigStore,
so an unknown key or a value of the wrong type fails at compose time (cross-field rules:
validate.py). Every field's attribute docstring (meaning, unit, values, what the default
means) is what `ftl keys` prints; tests/unit/test_keys.py fails on a field without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class ModelConfig:
    name: str = MISSING
    """Preset name (configs/model/NAME.yaml, picked by `model=NAME`), e.g. llama-7b: a label
    in run.name's default and the estimate."""
    path: str = ""
    """Local directory or hub id with the weights; empty: build from the numbers below."""
    tokenizer: str = ""
    """Tokenizer directory or hub id; empty: same as `path`."""
    architecture: str = "llama"
    """HF model_type used when building from config: llama, mistral, qwen2 (q/k/v biases),
    qwen3 (q/k norms), gemma3_text (4 norms per layer), and the mixtures of experts
    qwen3_moe and mixtral (they need model.num_experts). Parameters per architecture:
    launcher/config/architecture.py."""
    decoder_layer: str = "LlamaDecoderLayer"
    """Class name FSDP wraps and the estimator treats as one layer."""
    attn_implementation: str = "sdpa"
    """Attention kernel the model is built with (transformers' attn_implementation), for
    the trained model and DPO's reference: sdpa (torch's scaled_dot_product_attention),
    eager (plain matmuls; keeps the s x s scores), flash_attention_2 (pip install
    flash-attn; Ampere or newer, precision bf16/fp16), flash_attention_3 (FlashAttention-3;
    Hopper), flex_attention (torch's FlexAttention; GPU presets: it has no backward on
    CPU). With parallel.sp > 1 it is also Ulysses' core attention (sdpa or flash only).
    docs/guide.md, "Speed switches"."""
    hidden_size: int = MISSING
    """Width of the residual stream. These numbers always drive the estimate; with `path` the
    weights' config.json builds the model."""
    num_layers: int = MISSING
    """Decoder layers (HF num_hidden_layers)."""
    num_heads: int = MISSING
    """Attention heads; must divide hidden_size."""
    num_kv_heads: int = MISSING
    """Key/value heads (grouped-query attention; = num_heads: multi-head); divides num_heads."""
    head_dim: int = 0
    """Width of one attention head; 0: hidden_size / num_heads. Set it where heads x head_dim
    is not hidden_size (Qwen3-32B: 64 x 128 over 5120; Gemma 3: 256-wide heads)."""
    intermediate_size: int = MISSING
    """Width of the MLP's hidden layer; in a mixture of experts, each expert's (Qwen3-MoE's
    moe_intermediate_size, Mixtral's intermediate_size)."""
    num_experts: int = 0
    """Experts per MoE layer (every layer is one; HF num_experts / num_local_experts);
    0: a dense model. Memory counts every expert's weights."""
    experts_per_token: int = 0
    """Experts each token is routed to (HF num_experts_per_tok), 1..num_experts; 0 for a
    dense model. Compute (6 x active parameters x tokens) counts only these."""
    vocab_size: int = MISSING
    """Embedding rows; a model built from config gets at least the tokenizer's length."""
    max_position_embeddings: int = MISSING
    """Longest sequence in tokens; dataset.max_length may not exceed it."""
    tie_word_embeddings: bool = False
    """Share the input embedding with the output head (one matrix instead of two)."""
    rope_theta: float = 10000.0
    """RoPE base frequency of a model built from config."""


@dataclass
class ColumnsConfig:
    """The column that holds each field of a row; empty: the field's own name. Only the
    fields of `dataset.format` may be set."""

    messages: str = ""
    """Column of the conversation (formats chat and sharegpt); empty: messages for chat
    (conversations when the data has only that), conversations for sharegpt."""
    instruction: str = ""
    """Column of the instruction (format alpaca; required); empty: instruction."""
    input: str = ""
    """Column of the optional input, after a blank line below the instruction (alpaca);
    empty: input."""
    output: str = ""
    """Column of the response trained on (alpaca; required); empty: output."""
    system: str = ""
    """Column of an optional system message (alpaca); empty: system."""
    prompt: str = ""
    """Column of the prompt (format prompt_completion: required; preference: optional, a
    text or a list of turns); empty: prompt."""
    completion: str = ""
    """Column of the completion trained on (prompt_completion; required); empty: completion."""
    text: str = ""
    """Column of the raw text (format text; required); empty: text."""
    chosen: str = ""
    """Column of the preferred answer (format preference; required): text, or a list of
    turns ending in the answer; empty: chosen."""
    rejected: str = ""
    """Column of the dispreferred answer (format preference; required), in chosen's form;
    empty: rejected."""


@dataclass
class SourceConfig:
    """One dataset of a mixture (`dataset.sources`); docs/guide.md, "Data"."""

    path: str = MISSING
    """Local file (json, jsonl, csv, parquet), saved dataset directory, or hub dataset id."""
    weight: float = 1.0
    """Its share of each epoch's training examples, relative to the other sources' (> 0):
    weights 3 and 1 draw three examples of this source for one of the other."""
    name: str = ""
    """Its label (`ftl preprocess`, the recorded mixture, its cache folder); empty: the
    file's stem, or the hub id's last part."""
    format: str = ""
    """Row format, as dataset.format; empty: dataset.format."""
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    """Column renames, as dataset.columns; a field left empty takes dataset.columns'."""
    subset: str = ""
    """Hub dataset: its configuration (load_dataset's name), e.g. main; empty: the default."""
    split: str = "train"
    """Hub dataset or saved dataset directory: the split trained on."""
    revision: str = ""
    """Hub dataset: branch, tag or commit; empty: the newest. Pinned at plan time to the
    commit it resolves to (the run dir's config.yaml records it)."""


@dataclass
class DatasetConfig:
    name: str = MISSING
    """Preset name, e.g. arith or alpaca; prefixes the tokenized cache's folder name."""
    path: str = MISSING
    """Local file (json, jsonl, csv, parquet) or hub dataset id; not read when `sources`
    is set."""
    subset: str = ""
    """Hub dataset: its configuration (load_dataset's name); empty: the default."""
    split: str = "train"
    """Hub dataset or saved dataset directory: the split trained on."""
    revision: str = ""
    """Hub dataset: branch, tag or commit; empty: the newest. Pinned at plan time to the
    commit it resolves to (the run dir's config.yaml records it)."""
    sources: list[SourceConfig] = field(default_factory=list)
    """A mixture of datasets, each tokenized and cached on its own, drawn by weight into
    one training set (a seeded, recorded index); empty: `path` alone. E.g.
    dataset.sources='[{path:a.jsonl,weight:3},{path:b.jsonl,format:chat}]'."""
    exhausted: str = "stop"
    """A mixture's rule for a source that runs out: stop (the epoch ends when the first
    source runs out; no example repeats, larger sources are subsampled) or repeat (a
    source that runs out starts over until every source has been drawn whole once)."""
    streaming: bool = False
    """Tokenize the training set in the data loader as it is read, not up front (corpora
    too large to tokenize first); needs train.max_steps; resumes at the exact row. Its eval
    set is dataset.eval_path's, tokenized up front. docs/guide.md, "Streaming"."""
    shuffle_buffer: int = 10_000
    """Streaming: rows of each source read ahead and shuffled as one block (seeded by the
    block's position, so a resumed run reads the same order); 0: the files' order."""
    format: str = "alpaca"
    """chat (messages), sharegpt (conversations), alpaca (instruction/input/output),
    prompt_completion, text, or preference (prompt/chosen/rejected, for objective=dpo):
    launcher/data/formats.py."""
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    """Column renames, e.g. dataset.columns.messages=conversation."""
    template: str = "auto"
    """auto: the tokenizer's own chat template (the built-in one if it has none); builtin:
    always the built-in one (launcher/data/encode.py's BUILTIN_CHAT_TEMPLATE)."""
    eval_path: str = ""
    """Separate eval file; empty: hold out `eval_fraction` of `path`."""
    eval_fraction: float = 0.05
    """Share of `path`'s rows held out for evaluation (shuffled with train.seed) when
    `eval_path` is empty, in [0, 1); 0: no eval set (and a preset's train.eval_steps,
    eval_on_start and show_examples turn off)."""
    max_length: int = 512
    """Tokens per example (longer ones are truncated); with `packing`, tokens per packed row.
    At most model.max_position_embeddings."""
    packing: bool = False
    """Pack whole examples into rows of `max_length` tokens, each attending only to itself."""
    mask_prompt: bool = True
    """Train on the response tokens only."""
    num_tokens: int | None = None
    """Tokens per epoch for the estimator; empty: counted from the data when needed."""
    cache_dir: str = ""
    """Where tokenized data is cached (shared by all nodes); empty: $FTL_CACHE_DIR/data
    (~/.cache/ftlaunch/data), shared by every output dir (the key is the content)."""
    num_proc: int = 0
    """Tokenizing processes; 0: one per CPU core (up to 8) for large files, else 1.
    Streaming: per rank, 0: the node's cores over its ranks (up to 4), 1: the rank's own."""
    wait_timeout_s: float = 14400.0
    """How long ranks other than 0 wait for rank 0 to tokenize (not the collective's 30 min)."""


@dataclass
class PrecisionConfig:
    name: str = MISSING
    """fp32, fp16 (AMP O2 style: half weights, fp32 master, dynamic loss scale) or bf16."""
    initial_scale_power: int = 16
    """fp16 under DeepSpeed: the dynamic loss scale starts at 2**this."""
    loss_scale_window: int = 1000
    """fp16 under DeepSpeed: steps without overflow before the loss scale doubles."""
    hysteresis: int = 2
    """fp16 under DeepSpeed: overflows tolerated before the loss scale is lowered."""
    min_loss_scale: int = 1
    """fp16 under DeepSpeed: the loss scale never drops below this."""


@dataclass
class StrategyConfig:
    name: str = MISSING
    """Strategy preset, one of configs/strategy/*.yaml (set by `strategy=NAME`); auto: the
    fastest that fits, chosen at plan time."""
    backend: str = MISSING
    """The engine (launcher/engines/): ddp, deepspeed, fsdp, auto, or module:Class of a
    site's own Engine subclass. Next to strategy=auto, fsdp makes auto choose among ddp and
    the FSDP strategies instead of the DeepSpeed ones."""
    zero_stage: int = 0
    """ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also weights; 0: ddp, fsdp."""
    offload_optimizer: bool = False
    """Keep optimizer states (and fp32 gradients) in CPU memory; FSDP: = offload_param."""
    offload_param: bool = False
    """Keep weights in CPU memory between uses (ZeRO-3 or FSDP)."""
    overlap_comm: bool = True
    """DeepSpeed: overlap gradient reduction with the backward (two reduce buckets live)."""
    contiguous_gradients: bool = True
    """DeepSpeed: copy gradients into one contiguous buffer as produced (less fragmentation)."""
    bucket_size: int | None = None
    """ZeRO reduce/allgather bucket in elements; empty: derived from the model's hidden size."""
    gather_weights_on_save: bool = True
    """ZeRO-3 / FSDP: write one consolidated model at save time."""
    fsdp_reshard_after_forward: bool = True
    """FSDP: free gathered weights after each layer's forward and gather again for the
    backward (less memory); false: keep them until the backward (less communication)."""
    auto_rank: int = -1
    """Place in strategy=auto's ladder, fastest first; -1: never picked by auto."""
    auto_checkpointing: bool = True
    """strategy=auto: when no rung fits with everything on the GPUs, try those rungs again
    with train.gradient_checkpointing=true before any offload rung (recomputing costs about
    a third more compute; an optimizer step on the host CPU usually far more). false, or a
    train.gradient_checkpointing you type: auto keeps checkpointing as set."""


@dataclass
class SlurmConfig:
    """Slurm's own settings (`cluster.slurm.*`), read only by launcher/schedulers/slurm/."""

    partition: str = ""
    """sbatch --partition; empty: the cluster's default partition."""
    account: str = ""
    """sbatch --account; empty: your default account."""
    qos: str = ""
    """sbatch --qos; empty: the default quality of service."""
    time: str = "04:00:00"
    """Time limit: MINUTES, HH:MM:SS or D-HH:MM:SS."""
    cpus_per_task: int = 0
    """sbatch --cpus-per-task (one task per node runs all its ranks); 0: Slurm's default."""
    mem: str = ""
    """sbatch --mem per node, e.g. 500G (K/M/G/T; 0: all of it); empty: Slurm's default."""
    signal_grace_s: int = 120
    """USR1 this many seconds before the time limit: the ranks checkpoint and requeue."""
    max_restarts: int = 3
    """Requeues after a stop request or the time limit, same job id and run dir; 0: never."""
    sbatch_extra: list[str] = field(default_factory=list)
    """Extra sbatch options, each as typed after `sbatch`, e.g. '--constraint=a100'."""


NO_SCHEDULER = "none"
"""cluster.scheduler of a cluster whose ranks `ftl train` starts itself (cluster=local)."""


@dataclass
class ClusterConfig:
    name: str = MISSING
    """Preset name (configs/cluster/<name>.yaml), e.g. local or slurm."""
    scheduler: str = NO_SCHEDULER
    """none: `ftl train` starts the ranks here; slurm: `ftl submit` sends a batch job."""
    nodes: int = 1
    """Machines; world size = nodes x gpus_per_node."""
    gpus_per_node: int = 1
    """GPUs per node; on gpu=cpu, processes per node."""
    gpu: str = "cpu"
    """GPU preset (launcher/config/hardware.py: memory, peak FLOP/s, fp16/bf16) the plan
    and estimate use; cpu: processes on CPUs, no GPU."""
    launcher: str = "torchrun"
    """The program that starts the ranks on each node: torchrun or deepspeed."""
    master_port: int = 29500
    """TCP port of the rendezvous on the head node for multi-node runs and the deepspeed
    launcher; one-node torchrun picks a free port itself."""
    hostfile: str = ""
    """deepspeed multi-node without a scheduler: hostfile listing the nodes."""
    host_memory_gib: float = 0.0
    """CPU RAM per node in GiB, which offloaded states must fit; 0: unknown (not estimated;
    `ftl train` checks this machine's RAM)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines a batch job runs before the launcher, e.g. `module load cuda`."""
    startup_timeout_s: float = 900.0
    """Seconds every rank (and, multi-node under torchrun, every node's launcher) gets to
    join the process group after its own loading; past it the run ends naming the ranks that
    never joined and the address and port they were told (launcher/rank/startup.py)."""
    network_gb_s: float = 0.0
    """All-reduce bus bandwidth (GB/s, nccl-tests' busbw) expected between nodes, which
    `ftl doctor` measures against; 0: unknown (reported, not judged)."""
    doctor: bool = False
    """`ftl submit --doctor`: `ftl doctor`'s checks as the job's first step; train if they pass."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Slurm's own settings, used when scheduler=slurm."""


@dataclass
class TrainConfig:
    max_steps: int = -1
    """Optimizer steps; -1: run `epochs` epochs."""
    epochs: float = 1.0
    """Passes over the training set (fractions allowed) when max_steps is -1."""
    lr: float = 2e-5
    """Peak learning rate, reached after warmup and then decayed by `lr_scheduler`."""
    micro_batch_size: int = 1
    """Examples (packed rows with dataset.packing) per rank per forward pass."""
    grad_accum: int = 1
    """Micro batches accumulated per optimizer step."""
    global_batch_size: int | None = None
    """If set, must equal micro_batch_size x grad_accum x data-parallel size."""
    save_steps: int = 500
    """Optimizer steps between checkpoints."""
    save_total_limit: int = 0
    """Checkpoints kept, oldest deleted first; 0: all. At least 2: the Trainer deletes the
    oldest before the newest is marked COMPLETE, so 1 could leave no complete checkpoint."""
    eval_steps: int = 0
    """Optimizer steps between evaluations; 0: evaluate at the end only. With no eval set
    (dataset.eval_fraction=0, no dataset.eval_path) a preset's value turns off, saying so;
    a typed one is refused."""
    logging_steps: int = 10
    """Optimizer steps between log events (console line, metrics.jsonl, TensorBoard)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward: less memory, about a third more compute."""
    liger_kernel: bool = False
    """Liger's Triton kernels (pip install liger-kernel; the Trainer's use_liger_kernel):
    fused RMSNorm, RoPE, SwiGLU and a fused linear + cross-entropy that never holds the
    whole logits (the estimate counts one chunk of them). GPU presets only: Triton has no
    CPU backend."""
    compile: bool = False
    """torch.compile the model (the Trainer's torch_compile, inductor): faster steps after
    a first step that compiles (its seconds: the start-up line's `compile` phase); a new
    sequence length compiles once more (dynamic shapes). docs/guide.md, "Speed switches"."""
    seed: int = 42
    """Seed of the initial weights, data order and the eval split."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay; 0: none."""
    warmup_ratio: float = 0.03
    """Share of the steps the learning rate rises linearly from 0, in [0, 1) (constant: none)."""
    lr_scheduler: str = "cosine"
    """Learning-rate shape after warmup (the Trainer's lr_scheduler_type)."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    adam_beta1: float = 0.9
    """AdamW's decay rate of the gradient's running mean."""
    adam_beta2: float = 0.999
    """AdamW's decay rate of the squared gradient's running mean."""
    adam_epsilon: float = 1e-8
    """AdamW's epsilon, added to the denominator."""
    optimizer: str = "auto"
    """AdamW implementation. auto: DeepSpeed's own under DeepSpeed on GPU presets (FusedAdam;
    DeepSpeedCPUAdam with offload_optimizer), both JIT-compiled on first use (FusedAdam with
    nvcc: it needs the CUDA toolkit, and `ftl train` refuses it on a machine with neither
    nvcc nor a build of it); the Trainer's torch AdamW elsewhere (fused on GPUs).
    torch: the Trainer's torch AdamW everywhere (torch's fused CUDA kernel on GPUs, as fast
    as FusedAdam): nothing to compile, so a machine with only the driver can run DeepSpeed."""
    mfu: float = 0.4
    """Model FLOPs utilisation assumed by the time estimate."""
    eval_on_start: bool = False
    """Evaluate before the first step (never on a launch that resumes). With no eval set a
    preset's true turns off, saying so; a typed one is refused."""
    show_examples: int = 0
    """`ftl train` only: once the ranks finish, answer the first N prompts of the eval set
    greedily with the initial and the final model, print a few with the exact-match rate
    over all N before and after training, and write them to RUN_DIR/examples.json. Runs
    on the launcher's CPU: for small models (the tiny-llama preset sets 200). Needs an eval
    set: with none, a preset's value turns off, saying so, and a typed one is refused;
    formats without a prompt and answer (text, prompt_completion) skip it. 0: off."""
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    """Extra TrainerCallbacks, each {_target_: module.Class, **kwargs}, built on every rank
    (e.g. the probes the integration tests inject)."""
    cpu_live_bytes: bool = False
    """CPU ranks: count every tensor allocation (a wrapper around torch's CPU allocator,
    launcher/rank/memtrace.py), so result.json and `ftl report` give live tensor bytes per
    phase beside the resident memory. Costs ~9 % of the tiny model's step time
    (bench/train_overhead.py), so off unless asked; GPU ranks always measure, free (torch's
    CUDA statistics)."""
    hang_timeout_s: float = 1800.0
    """Hang watchdog: seconds without progress (an optimizer step, an eval batch, a
    finished save) after which every rank writes the stacks of its threads to RUN_DIR/hang/
    and the run ends with exit code 76 (resumable from the last complete checkpoint). 0 or
    negative: no watchdog. Must exceed the slowest step and the longest checkpoint save."""
    first_step_timeout_s: float = 3600.0
    """The watchdog's bound until a launch's first optimizer step (model loading,
    compilation, process-group set-up); at least train.hang_timeout_s."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers rank 0 logs every log event to: any of tensorboard
    (RUN_DIR/tensorboard), wandb, mlflow, or [none]. wandb and mlflow (extras: pip install
    'ftlaunch[wandb]') also get the resolved config, strategy, world size, estimate and
    start-up times, and one run spans every launch (its id: RUN_DIR/trackers.json).
    Credentials and servers come from the environment only (WANDB_API_KEY, WANDB_MODE,
    WANDB_PROJECT, MLFLOW_TRACKING_URI, ...; docs/guide.md, "Trackers")."""


@dataclass
class ObjectiveConfig:
    name: str = "sft"
    """What the run optimizes (`objective=NAME`): sft (next-token loss on the answers) or
    dpo (preference pairs, dataset.format=preference: TRL's DPOTrainer against a frozen
    reference, the model as the run starts)."""
    beta: float = 0.1
    """dpo: how far the policy may move from the reference (the KL weight; IPO's tau);
    higher: closer to the reference."""
    loss_type: str = "sigmoid"
    """dpo: the pair loss, one of TRL DPOConfig's: sigmoid (DPO), ipo, hinge (SLiC),
    robust, exo_pair, nca_pair, bco_pair, sppo_hard, aot, aot_unpaired, apo_zero,
    apo_down, discopop, sigmoid_norm (launcher/config/objectives.py)."""
    label_smoothing: float = 0.0
    """dpo: the share of pairs assumed mislabelled (cDPO, robust), in [0, 0.5); exo_pair
    needs it above 0 (1e-3 in the EXO paper)."""
    sft_weight: float = 0.0
    """dpo: weight of an added next-token loss on the chosen answers (RPO); 0: none."""
    precompute_ref_log_probs: bool = False
    """dpo: run the reference over the data once before the first step and keep only its
    log-probabilities, so no reference model is held while training (full fine-tunes)."""


@dataclass
class PeftConfig:
    name: str = "none"
    """none, lora or qlora."""
    r: int = 16
    """LoRA rank: inner width of each adapter."""
    alpha: int = 32
    """LoRA scaling numerator: adapter output x alpha / r."""
    dropout: float = 0.05
    """Dropout probability on the adapters' input; 0: none."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """Decoder linears that get adapters (q/k/v/o_proj, gate/up/down_proj), or ["all-linear"]
    (on an MoE model also every expert's weights and the router, without dropout)."""
    bits: int = 16
    """Base weights: 16 (lora) or 4 (qlora, NF4); 8-bit bases are refused."""


@dataclass
class ParallelConfig:
    tp: int = 1
    """Tensor-parallel size: each decoder linear split over this many ranks of one node
    (DeepSpeed AutoTP; ZeRO strategies); embeddings and lm_head stay whole. The
    data-parallel size is the world size / (tp x sp)."""
    sp: int = 1
    """Sequence-parallel size: each sequence split over this many ranks, attention
    exchanged all-to-all (DeepSpeed Ulysses / ALST; ZeRO-3 only): activations per rank
    divided by sp, for long-context runs. The ranks of one sp group train one batch."""


@dataclass
class EvalConfig:
    """Benchmarks on lm-evaluation-harness (the extra: pip install 'ftlaunch[eval]'):
    `ftl eval MODEL_DIR`, and `ftl train` / a Slurm job after training when `tasks` is set.
    Offline by design: task data comes from the HF cache (`ftl eval --prefetch`)."""

    tasks: list[str] = field(default_factory=list)
    """Harness tasks or groups (e.g. [arith], [mmlu, gsm8k]) that `ftl train` runs on the
    final model once the ranks finish, and a Slurm job as its last step; results in
    RUN_DIR/eval/<timestamp>/. arith: the bundled demo task (eval_tasks/). Empty: none."""
    num_fewshot: int | None = None
    """Few-shot examples per prompt; empty: each task's own default (0 if it has none)."""
    limit: float | None = None
    """Examples per task: a count (>= 1), or a share of each task in (0, 1); empty: all."""
    batch_size: int = 16
    """Prompts per forward pass."""
    apply_chat_template: bool = True
    """Render each prompt with the model's chat template (what a chat fine-tune was trained
    on; the harness's --apply_chat_template); false: plain text, as for base models."""
    include_path: str = ""
    """A directory of your own task YAMLs (the harness's --include_path); empty: only the
    harness's tasks and ftl's bundled ones."""
    gen_kwargs: str = ""
    """Generation settings for generate_until tasks, the harness's form, e.g.
    'temperature=0,max_gen_toks=256'; empty: each task's own."""
    before: bool = False
    """`ftl train`: also evaluate the weights the run starts from (model.path, else the
    architecture built with train.seed), so before/after scores sit in one run dir."""
    shard: bool = False
    """Split one model's layers over this node's GPUs (the harness's parallelize=True), for
    a model too large for one device; one process."""
    processes: int = 1
    """Data-parallel evaluation: this many processes on as many of the node's GPUs, each
    scoring its share of the examples (the harness under `accelerate launch`), for a model
    dir the harness loads by path; 1: one process. GPUs only: on CPU the harness gives
    every process every example."""


@dataclass
class RunSection:
    name: str = "${model.name}-${strategy.name}"
    """Run folder under output_dir; default: <model>-<strategy>."""
    output_dir: str = "outputs"
    """Root of the run folders (relative: from the working directory); each launch writes
    output_dir/<name>/<YYYYmmdd-HHMMSS>/."""
    resume: str = "auto"
    """auto (last complete checkpoint of this run), never, or a checkpoint PATH."""
    force: bool = False
    """Launch even when the plan says the run will not fit (too little disk: a warning)."""


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model: `model=NAME` picks configs/model/NAME.yaml."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """The training data: `dataset=NAME` picks configs/dataset/NAME.yaml."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Number formats of weights and compute: `precision=NAME`."""
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    """How the ranks share the work (engine, sharding, offload): `strategy=NAME`."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where the ranks run: `cluster=NAME` picks configs/cluster/NAME.yaml."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """What is optimized: `objective=sft` (default) or `objective=dpo`."""
    peft: PeftConfig = field(default_factory=PeftConfig)
    """Parameter-efficient fine-tuning: `peft=NAME` (none: every weight is trained)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The Trainer's schedule, optimizer and batch settings."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Model parallelism beside the data-parallel axis (parallel.tp, parallel.sp)."""
    run: RunSection = field(default_factory=RunSection)
    """The run folder: its name, where it goes, resume, force."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Benchmarks after training (lm-evaluation-harness): `eval.tasks=[arith]`."""

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.gpus_per_node

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: each holds a different batch (world size / (tp x sp))."""
        return self.world_size // max(self.parallel.tp, 1) // max(self.parallel.sp, 1)

    @property
    def shard_size(self) -> int:
        """Ranks ZeRO/FSDP shard the model states over: every rank of a tensor-parallel
        slice (sequence-parallel ranks hold the same weights, so they shard them too)."""
        return self.world_size // max(self.parallel.tp, 1)


GROUPS: tuple[str, ...] = (
    "model", "dataset", "precision", "strategy", "cluster", "objective", "peft",
)
