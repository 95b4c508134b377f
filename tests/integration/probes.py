"""Test probes: HF TrainerCallbacks that the integration tests inject through
`train.callbacks` ([{_target_: tests.integration.probes.X, ...}]) to record what a real
run did. The worker instantiates them on every rank and appends them to its own callbacks.

Each probe writes RUN_DIR/probes/<probe>-rank<R>.json (RUN_DIR = parent of the Trainer's
output_dir, R = args.process_index); LogitsProbe writes probes/logits.pt from rank 0.
No probe runs a collective of its own: the only collective is LogitsProbe's forward,
which every rank runs at the same point (on_train_end) because ZeRO-3 and FSDP gather
parameters collectively. Nothing here changes the data, the order or the losses.
"""

from __future__ import annotations

import gc
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rundir import RunDir

LOGITS_SEED = 1234  # the fixed batch whose logits the saved model must reproduce


def run_dir_of(args: TrainingArguments) -> RunDir:
    """The run dir of a Trainer whose output_dir is RUN_DIR/checkpoints."""
    return RunDir(Path(args.output_dir).parent)


def probes_dir(args: TrainingArguments) -> Path:
    """RUN_DIR/probes (the Trainer's output_dir is RUN_DIR/checkpoints)."""
    out = run_dir_of(args).probes
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_probe(args: TrainingArguments, probe: str, record: dict[str, Any]) -> None:
    record = {"rank": args.process_index, "world_size": args.world_size, **record}
    path = probes_dir(args) / f"{probe}-rank{args.process_index}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a parameter: its ZeRO-3 partition, its FSDP2 shard, or all."""
    if hasattr(param, "ds_tensor"):
        return param.ds_tensor
    if hasattr(param, "to_local"):  # DTensor
        return param.to_local()
    return param


def full_numel(param: torch.Tensor) -> int:
    return int(getattr(param, "ds_numel", param.numel()))


def nbytes(tensor: torch.Tensor | None) -> int:
    if tensor is None:
        return 0
    tensor = local_tensor(tensor)
    return tensor.numel() * tensor.element_size()


def tensor_hash(tensor: torch.Tensor) -> str:
    """Hash of the raw bytes (any dtype, bf16 included). A copy: .numpy() on the tensor
    itself would make its storage non-resizable, and FSDP2 frees storage by resizing."""
    raw = tensor.detach().to("cpu", copy=True).contiguous().reshape(-1).view(torch.uint8)
    return hashlib.blake2b(raw.numpy().tobytes(), digest_size=8).hexdigest()


def optimizer_chain(optimizer: Any) -> list[Any]:
    """The wrappers down to the torch optimizer that steps: accelerate's
    AcceleratedOptimizer / DeepSpeedOptimizerWrapper -> ZeRO optimizer -> torch AdamW."""
    chain = [optimizer]
    while getattr(chain[-1], "optimizer", None) is not None:
        chain.append(chain[-1].optimizer)
    return chain


def zero_optimizer(optimizer: Any) -> Any | None:
    chain = optimizer_chain(optimizer)
    return next((o for o in chain if type(o).__module__.startswith("deepspeed.runtime.zero")), None)


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return optimizer_chain(optimizer)[-1]


def wrapper_of(model: nn.Module) -> nn.Module | None:
    """The DDP / DeepSpeedEngine module whose .module is `model` (callbacks get only the
    unwrapped model), found among live objects."""
    return next(
        (
            o
            for o in gc.get_objects()
            if isinstance(o, nn.Module) and getattr(o, "module", None) is model
        ),
        None,
    )


class ShardingProbe(TrainerCallback):
    """Batches per epoch of this rank and a hash of every unpadded training row its model
    received (a read-only forward pre-hook: the data and the losses are untouched).

    probes/sharding-rank<R>.json: {"batches_per_epoch": int | null, "rows": [hex, ...]}
    """

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.batches_per_epoch: int | None = None
        self._handle: Any = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        try:
            self.batches_per_epoch = len(kw["train_dataloader"])
        except TypeError:  # an iterable dataset has no length
            self.batches_per_epoch = None
        self._handle = kw["model"].register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not module.training or ids is None:
            return
        mask = kwargs.get("attention_mask")
        for i, row in enumerate(ids):
            self.rows.append(tensor_hash(row if mask is None else row[mask[i].bool()]))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._handle is not None:
            self._handle.remove()
        write_probe(
            args, "sharding", {"batches_per_epoch": self.batches_per_epoch, "rows": self.rows}
        )


class LogitsProbe(TrainerCallback):
    """Logits of the trained model on a fixed batch (every rank runs the forward: ZeRO-3 and
    FSDP gather collectively); rank 0 saves probes/logits.pt {"input_ids", "logits"}."""

    def __init__(self, seed: int = LOGITS_SEED) -> None:
        self.seed = seed

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, tokenizer = kw["model"], kw.get("processing_class")
        vocab = model.config.vocab_size
        if tokenizer is not None:
            vocab = min(vocab, len(tokenizer))
        generator = torch.Generator().manual_seed(self.seed)
        input_ids = torch.randint(3, vocab, (2, 16), generator=generator)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=input_ids.to(args.device)).logits
        model.train(was_training)
        reshard(model)
        if args.process_index == 0:
            record = {"input_ids": input_ids, "logits": logits.float().cpu()}
            torch.save(record, probes_dir(args) / "logits.pt")


def reshard(model: nn.Module) -> None:
    """FSDP2 keeps the root's parameters unsharded after a forward outside training (its
    reshard_after_forward is False); put the shards back as the Trainer does before it
    builds the optimizer, so later probes and the final save see the sharded model."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


class WrapperProbe(TrainerCallback):
    """The wrapping really applied, read from the objects at the end of training.

    probes/wrapper-rank<R>.json: {"model_class", "wrapped_class", "optimizer_chain",
    "optimizer_class", "optimizer_state_device", "param_dtype", "activation_checkpointing",
    "base_weights_4bit"} plus, under DeepSpeed: "zero_optimizer_class", "zero_stage",
    "offload_optimizer", "offload_param", "local_device_count", "dp_group_timeout_s",
    "param_local_fraction" (ZeRO-3); under FSDP2:
    "fsdp_module", "param_class", "param_local_fraction", "offload_policies",
    "mp_param_dtypes", "mp_reduce_dtypes".
    """

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, optimizer = kw["model"], kw["optimizer"]
        wrapped = wrapper_of(model)
        inner = torch_optimizer(optimizer)
        params = list(model.parameters())
        info: dict[str, Any] = {
            "model_class": type(model).__name__,
            "wrapped_class": type(wrapped).__name__ if wrapped is not None else None,
            "optimizer_chain": [type(o).__name__ for o in optimizer_chain(optimizer)],
            "optimizer_class": type(inner).__name__,
            "optimizer_state_device": next(
                (
                    str(v.device)
                    for s in inner.state.values()
                    for v in s.values()
                    if torch.is_tensor(v) and v.dim() > 0
                ),
                None,
            ),
            "param_dtype": str(params[0].dtype),
            # HF's own (DDP, DeepSpeed; is_activation_checkpointing: the older name warns and
            # goes in transformers v6) or torch's CheckpointWrapper (accelerate, FSDP2).
            "activation_checkpointing": bool(
                getattr(model, "is_activation_checkpointing", False)
                or any(
                    c.__name__ == "CheckpointWrapper"
                    for m in model.modules()
                    for c in type(m).__mro__
                )
            ),
            "base_weights_4bit": any(type(m).__name__ == "Linear4bit" for m in model.modules()),
        }
        zero = zero_optimizer(optimizer)
        if zero is not None:
            info.update(zero_info(zero, params))
        info.update(fsdp_info(model, params))
        write_probe(args, "wrapper", info)


def zero_info(zero: Any, params: list[nn.Parameter]) -> dict[str, Any]:
    """What the ZeRO optimizer object itself does (not what the config asked for)."""
    from deepspeed.accelerator import get_accelerator  # only ranks under DeepSpeed pay for it

    stage3 = hasattr(zero, "fp32_partitioned_groups_flat")
    info: dict[str, Any] = {
        "zero_optimizer_class": type(zero).__name__,
        "zero_stage": 3 if stage3 else (2 if zero.partition_gradients else 1),
        "offload_optimizer": bool(zero.offload_optimizer if stage3 else zero.cpu_offload),
        "offload_param": bool(getattr(zero, "offload_param", False)),
        # The node's rank count on CPU only when the launch sets LOCAL_SIZE (else 1, after a
        # numactl subprocess on every call).
        "local_device_count": get_accelerator().device_count(),
        # DeepSpeed's own group (dist.new_group): the run's collective timeout, not torch's
        # default for a new group (10 minutes on NCCL, 30 on gloo)
        "dp_group_timeout_s": zero.dp_process_group._get_backend(
            torch.device("cpu")).options._timeout.total_seconds(),
    }
    if stage3:
        local = sum(p.ds_tensor.numel() for p in params)
        info["param_local_fraction"] = local / sum(p.ds_numel for p in params)
        info["param_device"] = str(params[0].ds_tensor.device)
    return info


def fsdp_info(model: nn.Module, params: list[nn.Parameter]) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if not isinstance(model, FSDPModule):
        return {"fsdp_module": False}
    # No public accessor for a module's policies (torch 2.13): private state, test code only.
    groups = [
        group
        for module in model.modules()
        if isinstance(module, FSDPModule)
        for group in module._get_fsdp_state()._fsdp_param_groups
    ]
    local = sum(local_tensor(p).numel() for p in params if isinstance(p, DTensor))
    return {
        "fsdp_module": True,
        "param_class": type(params[0]).__name__,
        "param_local_fraction": local / sum(p.numel() for p in params if isinstance(p, DTensor)),
        "offload_policies": sorted({type(g.offload_policy).__name__ for g in groups}),
        "mp_param_dtypes": sorted({str(g.mp_policy.param_dtype) for g in groups}),
        "mp_reduce_dtypes": sorted({str(g.mp_policy.reduce_dtype) for g in groups}),
    }


class ParamChecksumProbe(TrainerCallback):
    """Per parameter: a hash of this rank's local tensor (whole for DDP/ZeRO-1/2, the
    ZeRO-3 partition, the FSDP2 shard) at train begin and end, and requires_grad.

    probes/checksums-rank<R>.json: {"begin": {name: hex}, "end": {name: hex},
    "requires_grad": {name: bool}}
    """

    def __init__(self) -> None:
        self.begin: dict[str, str] = {}

    @staticmethod
    def _hashes(model: nn.Module) -> dict[str, str]:
        return {n: tensor_hash(local_tensor(p)) for n, p in model.named_parameters()}

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.begin = self._hashes(kw["model"])

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model = kw["model"]
        write_probe(
            args,
            "checksums",
            {
                "begin": self.begin,
                "end": self._hashes(model),
                "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
            },
        )


class PrecisionProbe(TrainerCallback):
    """dtype of the first nn.Linear inside the first decoder layer during a training forward
    (autocast, DeepSpeed's bf16 module or FSDP2's MixedPrecisionPolicy all show here).

    probes/precision-rank<R>.json: {"module", "input_dtype", "weight_dtype", "output_dtype"}
    """

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}
        self._handle: Any = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        layer = next(m for m in kw["model"].modules() if type(m).__name__.endswith("DecoderLayer"))
        name, linear = next((n, m) for n, m in layer.named_modules() if isinstance(m, nn.Linear))
        self.record["module"] = f"{type(layer).__name__}.{name}"
        self._handle = linear.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        if module.training and "output_dtype" not in self.record:
            self.record.update(
                input_dtype=str(inputs[0].dtype),
                weight_dtype=str(module.weight.dtype),
                output_dtype=str(output.dtype),
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._handle is not None:
            self._handle.remove()
        write_probe(args, "precision", self.record)


class PartitionProbe(TrainerCallback):
    """Measured per-rank bytes of the optimizer state and of the gradients (first step).

    - grad_bytes_peak: the most gradient bytes (param.grad, and DeepSpeed's grad_accum)
      alive on this rank's model parameters during the backward, sampled after each
      parameter's gradient is accumulated (after DeepSpeed's own hook for it). DDP keeps
      every gradient; ZeRO-1 too, until its end-of-backward epilogue (stage_1_and_2.py:
      reduce_ipg_grads frees other partitions' grads only when partition_gradients);
      ZeRO-2 frees the other ranks' gradients bucket by bucket once reduced; ZeRO-3 keeps
      only the buckets in flight.
    - step_grad_bytes: the gradients the stepping torch optimizer sees (its params' .grad):
      full under DDP, this rank's partition under every ZeRO stage (and FSDP2).
    - optimizer_param_bytes: the params it steps (DDP: the model's; ZeRO: the fp32 master
      partition; FSDP2: the local shards).
    - optimizer_state_bytes: its state tensors after the step (Adam: exp_avg, exp_avg_sq).
    - param_count: trainable parameters of the whole model; param_bytes_local: bytes of
      the model's parameters held on this rank.

    probes/partition-rank<R>.json: the keys above, all ints.
    """

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}
        self._params: list[nn.Parameter] = []
        self._peak = 0
        self._handles: list[Any] = []

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._params = [p for p in kw["model"].parameters() if p.requires_grad]
        self.record.update(
            param_count=sum(full_numel(p) for p in self._params),
            param_bytes_local=sum(nbytes(p) for p in kw["model"].parameters()),
        )
        # Registered after DeepSpeed's hooks, so each sample sees what DeepSpeed kept.
        self._handles = [p.register_post_accumulate_grad_hook(self._sample) for p in self._params]
        inner = torch_optimizer(kw["optimizer"])
        self._handles += [
            inner.register_step_pre_hook(self._pre_step),
            inner.register_step_post_hook(self._post_step),
        ]

    def _live_grad_bytes(self) -> int:
        return sum(nbytes(p.grad) + nbytes(getattr(p, "grad_accum", None)) for p in self._params)

    def _sample(self, param: nn.Parameter) -> None:
        self._peak = max(self._peak, self._live_grad_bytes())

    def _pre_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if "step_grad_bytes" in self.record:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.record.update(
            grad_bytes_peak=self._peak,
            step_grad_bytes=sum(nbytes(p.grad) for p in params),
            optimizer_param_bytes=sum(nbytes(p) for p in params),
        )

    def _post_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if "optimizer_state_bytes" in self.record:
            return
        self.record["optimizer_state_bytes"] = sum(
            nbytes(v)
            for s in optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v) and v.dim() > 0
        )
        for handle in self._handles:  # first step measured: no cost afterwards
            handle.remove()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        write_probe(args, "partition", self.record)


class LiveBytesProbe(TrainerCallback):
    """Live tensor bytes (launcher/rank/memtrace.py's counter, which the worker installed) when
    optimizer step `step` begins and each time the model's forward returns in it: the
    activations of a micro batch are forward end minus step begin. Reads two counters;
    walks nothing."""

    def __init__(self, step: int = 2) -> None:
        self.step = step
        self.current = 0
        self.record: dict[str, Any] = {"step": step, "step_begin": None, "forward_ends": []}

    @staticmethod
    def _allocated() -> int | None:
        from launcher.rank import memtrace

        tracker = memtrace.PHASES.tracker
        return tracker.allocated() if tracker is not None else None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        model: nn.Module | None = None, **kw: Any,
    ) -> None:
        assert model is not None
        model.register_forward_hook(self._forward_end)

    def _forward_end(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if module.training and self.current == self.step:
            self.record["forward_ends"].append(self._allocated())

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.current = state.global_step + 1
        if self.current == self.step:
            self.record["step_begin"] = self._allocated()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        write_probe(args, "live_bytes", self.record)


class ShapeProbe(TrainerCallback):
    """The shape of every parameter this rank holds as training starts (a tensor-parallel
    rank holds its slice of each split linear).

    probes/shapes-rank<R>.json: {name: [dims]}"""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        shapes = {n: list(local_tensor(p).shape) for n, p in kw["model"].named_parameters()}
        write_probe(args, "shapes", {"shapes": shapes})


class SequenceProbe(TrainerCallback):
    """The input_ids shape of every training forward this rank runs (a sequence-parallel
    rank sees its slice of each sequence), read by a forward pre-hook on the embedding.

    probes/sequence-rank<R>.json: {"shapes": [[batch, tokens], ...]}"""

    def __init__(self) -> None:
        self.shapes: list[list[int]] = []

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        embedding = kw["model"].get_input_embeddings()

        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            if module.training:
                self.shapes.append(list(inputs[0].shape))

        embedding.register_forward_pre_hook(record)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        write_probe(args, "sequence", {"shapes": self.shapes})


class StopAfterStep(TrainerCallback):
    """Stop right after the checkpoint of `step` is complete (a preemption at a known step).
    Appended after the worker's CheckpointCallback, whose on_save writes the COMPLETE
    marker, so this on_save runs once the marker exists. `save=True` also asks for the
    save at `step`: a launch that resumes a checkpoint saves every train.save_steps of the
    run that wrote it (transformers restores save_steps with the TrainerState)."""

    def __init__(self, step: int, save: bool = False) -> None:
        self.step, self.save = step, save

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.save and state.global_step == self.step:
            control.should_save = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step >= self.step:
            control.should_training_stop = True


class FailAtStep(TrainerCallback):
    """Raise on every rank at the end of optimizer step `step`: a crash after validation,
    for the tests of what a failed rank leaves behind."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step >= self.step:
            raise RuntimeError(f"injected failure at step {state.global_step}")


class LoadingProbe(TrainerCallback):
    """How the model came out of loading, seen at the end of Trainer.__init__ (on_init_end):
    after build_model, before the strategy wraps it (DeepSpeed's engine and FSDP2's
    fully_shard are applied later, in train()).

    - ZeRO-3: params already partitioned there (`ds_tensor`) were constructed inside
      deepspeed.zero.Init (nothing else partitions them before the engine);
      "zero3_local_fraction" is this rank's share of them, "unpartitioned" the names of the
      others (LoRA adapters, added after loading).
    - FSDP2: accelerate's plugin attribute `cpu_ram_efficient_loading` and the environment
      flags transformers reads (FSDP_CPU_RAM_EFFICIENT_LOADING, ACCELERATE_USE_FSDP).
    - "weights_hash": one hash over this rank's local parameters (equal across ranks means
      each rank holds the same values), "meta_params": parameters left on the meta device.
    - "max_rss_kib": the process peak RSS so far (getrusage), a figure, not a check.

    `perturb_other_ranks=True` (FSDP2 only): on every rank but 0, zero the (still unsharded)
    parameters after recording. With cpu_ram_efficient_loading, accelerate moves the model
    to meta and broadcasts RANK 0's state dict into the shards, so this changes nothing; if
    each rank kept its own weights instead, half of every shard would be zeros and the first
    eval loss would show it. Unlike the other probes it writes to the model, on purpose.

    probes/loading-rank<R>.json: the keys above.
    """

    def __init__(self, perturb_other_ranks: bool = False) -> None:
        self.perturb_other_ranks = perturb_other_ranks

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        import os
        import resource

        from accelerate.state import AcceleratorState

        model = kw["model"]
        named = list(model.named_parameters())
        partitioned = [p for _, p in named if hasattr(p, "ds_tensor")]
        plugin = AcceleratorState._shared_state.get("fsdp_plugin")
        local = [local_tensor(p) for _, p in named]
        digest = hashlib.blake2b(digest_size=8)
        for tensor in local:
            if tensor.device.type != "meta":
                digest.update(tensor_hash(tensor).encode())
        record: dict[str, Any] = {
            "param_count": len(named),
            "zero3_partitioned": len(partitioned),
            "zero3_local_fraction": (
                sum(p.ds_tensor.numel() for p in partitioned)
                / sum(p.ds_numel for p in partitioned)
                if partitioned else None
            ),
            "unpartitioned": [n for n, p in named if not hasattr(p, "ds_tensor")],
            "meta_params": sum(t.device.type == "meta" for t in local),
            "weights_hash": digest.hexdigest(),
            "fsdp_plugin": plugin is not None,
            "cpu_ram_efficient_loading": (
                getattr(plugin, "cpu_ram_efficient_loading", None) if plugin else None
            ),
            "env_FSDP_CPU_RAM_EFFICIENT_LOADING": os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING"),
            "env_ACCELERATE_USE_FSDP": os.environ.get("ACCELERATE_USE_FSDP"),
            "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "perturbed": False,
        }
        if self.perturb_other_ranks and args.process_index != 0:
            if plugin is None or partitioned:
                raise RuntimeError("LoadingProbe(perturb_other_ranks=True) is for FSDP2 only")
            with torch.no_grad():
                for _, param in named:
                    param.zero_()
            record["perturbed"] = True
        write_probe(args, "loading", record)


class SlowSteps(TrainerCallback):
    """Sleep `seconds` at every step end on every rank: steps slow enough that a test can
    send a signal at a chosen step (the losses are unchanged). With `restart`, only in the
    Slurm launch whose SLURM_RESTART_COUNT (0 when unset) is that number."""

    def __init__(self, seconds: float, restart: int | None = None) -> None:
        self.seconds = seconds
        self.restart = restart

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        import os
        import time

        if self.restart is None or int(os.environ.get("SLURM_RESTART_COUNT", 0)) == self.restart:
            time.sleep(self.seconds)


class FillDisk(TrainerCallback):
    """Rank 0 fills the filesystem of `path` at the end of step `step`, leaving
    `leave_bytes` free: enough for the step's log line, not for the checkpoint that follows
    (a disk that fills up during a save)."""

    def __init__(self, step: int, path: str, leave_bytes: int = 65536) -> None:
        self.step, self.path, self.leave_bytes = step, Path(path), leave_bytes

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        import shutil

        if state.global_step != self.step or args.process_index != 0:
            return
        with self.path.open("wb") as filler:
            while (free := shutil.disk_usage(self.path).free) > self.leave_bytes:
                filler.write(bytes(min(2**20, free - self.leave_bytes)))
                filler.flush()


class BlockAtStep(TrainerCallback):
    """Rank `rank` stops making progress at the end of step `step` (a rank stuck in the
    user's code while the others wait in a collective): it sleeps `seconds` there. Before
    that, with `slow_s`, each of its forward passes takes that much longer (a slower
    device: a straggler the others wait for in the gradient all-reduce)."""

    def __init__(self, step: int, rank: int = 1, seconds: float = 3600.0,
                 slow_s: float = 0.0) -> None:
        self.step, self.rank, self.seconds, self.slow_s = step, rank, seconds, slow_s

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        model: nn.Module | None = None, **kw: Any,
    ) -> None:
        if self.slow_s > 0 and args.process_index == self.rank and model is not None:
            model.register_forward_pre_hook(self._slow_forward)

    def _slow_forward(self, module: nn.Module, inputs: Any) -> None:
        import time

        if module.training:
            time.sleep(self.slow_s)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        import time

        if state.global_step == self.step and args.process_index == self.rank:
            time.sleep(self.seconds)
