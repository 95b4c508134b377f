"""Typed configuration: one dataclass per Hydra group, registered in Hydra's ConfigStore.

Hydra merges every YAML in configs/ and every command-line override into these
dataclasses, so an unknown key or a value of the wrong type fails at compose time.
Cross-field rules live in validate.py; this module only says what exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class ModelConfig:
    name: str = MISSING
    """Preset name, e.g. tiny-llama or llama-7b."""
    path: str = ""
    """Local directory or hub id with the weights; empty: build from the numbers below."""
    tokenizer: str = ""
    """Tokenizer directory or hub id; empty: same as `path`."""
    architecture: str = "llama"
    """HF model_type used when building from config (llama, mistral, qwen2)."""
    decoder_layer: str = "LlamaDecoderLayer"
    """Class name FSDP wraps and the estimator treats as one layer."""
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    intermediate_size: int = MISSING
    vocab_size: int = MISSING
    max_position_embeddings: int = MISSING
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0


@dataclass
class ColumnsConfig:
    """The column that holds each field of a row; empty: the field's own name (for chat,
    `messages`, else `conversations`). Only the fields of `dataset.format` may be set."""

    messages: str = ""
    instruction: str = ""
    input: str = ""
    output: str = ""
    system: str = ""
    prompt: str = ""
    completion: str = ""
    text: str = ""


@dataclass
class DatasetConfig:
    name: str = MISSING
    path: str = MISSING
    """Local file (json, jsonl, csv, parquet) or hub dataset id."""
    format: str = "alpaca"
    """chat (messages), sharegpt (conversations), alpaca (instruction/input/output),
    prompt_completion or text: launcher/formats.py."""
    columns: ColumnsConfig = field(default_factory=lambda: ColumnsConfig())
    """Column renames, e.g. dataset.columns.messages=conversation."""
    template: str = "auto"
    """auto: the tokenizer's own chat template (the built-in one if it has none); builtin."""
    eval_path: str = ""
    """Separate eval file; empty: hold out `eval_fraction` of `path`."""
    eval_fraction: float = 0.05
    max_length: int = 512
    packing: bool = False
    mask_prompt: bool = True
    """Train on the response tokens only."""
    num_tokens: int | None = None
    """Tokens per epoch for the estimator; empty: counted from the data when needed."""
    cache_dir: str = ""
    """Where tokenized data is cached (shared by all nodes); empty: $FTL_CACHE_DIR/data
    (~/.cache/ftlaunch/data), shared by every output dir (the key is the content)."""
    num_proc: int = 0
    """Tokenizing processes; 0: one per CPU core (up to 8) for large files, else 1."""
    wait_timeout_s: float = 14400.0
    """How long ranks other than 0 wait for rank 0 to tokenize (not the collective's 30 min)."""


@dataclass
class PrecisionConfig:
    name: str = MISSING
    """fp32, fp16 (AMP O2 style: half weights, fp32 master, dynamic loss scale) or bf16."""
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: int = 1


@dataclass
class StrategyConfig:
    name: str = MISSING
    backend: str = MISSING
    """ddp, deepspeed, fsdp or auto."""
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    bucket_size: int | None = None
    """ZeRO reduce/allgather bucket in elements; empty: derived from the model's hidden size."""
    gather_weights_on_save: bool = True
    """ZeRO-3 / FSDP: write one consolidated model at save time."""
    fsdp_reshard_after_forward: bool = True
    auto_rank: int = -1
    """Place in strategy=auto's ladder, fastest first; -1: never picked by auto."""


@dataclass
class SlurmConfig:
    """Slurm's own settings (`cluster.slurm.*`), read only by launcher/slurm/."""

    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = "04:00:00"
    """Time limit: MINUTES, HH:MM:SS or D-HH:MM:SS."""
    cpus_per_task: int = 0
    mem: str = ""
    signal_grace_s: int = 120
    """USR1 this many seconds before the time limit: the ranks checkpoint and requeue."""
    max_restarts: int = 3
    sbatch_extra: list[str] = field(default_factory=list)
    """Extra sbatch options, each as typed after `sbatch`, e.g. '--constraint=a100'."""


@dataclass
class ClusterConfig:
    name: str = MISSING
    """Preset name (configs/cluster/<name>.yaml), e.g. local or slurm."""
    scheduler: str = "none"
    """none: `ftl train` starts the ranks here; slurm: `ftl submit` sends a batch job."""
    nodes: int = 1
    gpus_per_node: int = 1
    """GPUs per node; on gpu=cpu, processes per node."""
    gpu: str = "cpu"
    """Preset: cpu, v100-32g, a100-40g, a100-80g, h100-80g, h200-141g."""
    launcher: str = "torchrun"
    """torchrun or deepspeed."""
    master_port: int = 29500
    hostfile: str = ""
    """deepspeed multi-node without a scheduler: hostfile listing the nodes."""
    host_memory_gib: float = 0.0
    """CPU RAM per node for offload; 0: unknown (not checked)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines a batch job runs before the launcher, e.g. `module load cuda`."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass
class TrainConfig:
    max_steps: int = -1
    """Optimizer steps; -1: run `epochs` epochs."""
    epochs: float = 1.0
    lr: float = 2e-5
    micro_batch_size: int = 1
    grad_accum: int = 1
    global_batch_size: int | None = None
    """If set, must equal micro_batch_size x grad_accum x world size."""
    save_steps: int = 500
    save_total_limit: int = 0
    """Checkpoints kept, oldest deleted first; 0: all. At least 2: the Trainer deletes the
    oldest before the newest is marked COMPLETE, so 1 could leave no complete checkpoint."""
    eval_steps: int = 0
    """0: evaluate at the end only."""
    logging_steps: int = 10
    gradient_checkpointing: bool = False
    seed: int = 42
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    lr_scheduler: str = "cosine"
    max_grad_norm: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optimizer: str = "auto"
    """AdamW implementation. auto: DeepSpeed's own under DeepSpeed on GPU presets (FusedAdam;
    DeepSpeedCPUAdam with offload_optimizer), both JIT-compiled on first use (FusedAdam with
    nvcc: it needs the CUDA toolkit); the Trainer's torch AdamW elsewhere (fused on GPUs).
    torch: the Trainer's torch AdamW everywhere (torch's fused CUDA kernel on GPUs, as fast
    as FusedAdam): nothing to compile, so a machine with only the driver can run DeepSpeed."""
    mfu: float = 0.4
    """Model FLOPs utilisation assumed by the time estimate."""
    eval_on_start: bool = False
    """Evaluate before the first step (never on a launch that resumes)."""
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    """Extra TrainerCallbacks, each {_target_: module.Class, **kwargs}, built on every rank
    (e.g. the probes the integration tests inject)."""


@dataclass
class PeftConfig:
    name: str = "none"
    """none, lora or qlora."""
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    bits: int = 16
    """Base weights: 16 (lora) or 4 (qlora, NF4); 8-bit bases are refused."""


@dataclass
class RunSection:
    name: str = "${model.name}-${strategy.name}"
    """Run folder under output_dir; default: <model>-<strategy>."""
    output_dir: str = "outputs"
    resume: str = "auto"
    """auto (last complete checkpoint of this run), never, or a checkpoint PATH."""
    force: bool = False
    """Launch even when the plan says the run will not fit."""


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    peft: PeftConfig = field(default_factory=PeftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunSection = field(default_factory=RunSection)

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.gpus_per_node


GROUPS: tuple[str, ...] = ("model", "dataset", "precision", "strategy", "cluster", "peft")


def register_configs() -> None:
    """Make `base_config` (the typed root) available to configs/config.yaml's defaults."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=RunConfig)
