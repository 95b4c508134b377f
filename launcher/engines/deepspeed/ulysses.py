"""Sequence parallelism (parallel.sp > 1): DeepSpeed Ulysses (ALST) under ZeRO-3, rank side.
The HF Trainer does the work given accelerate's ParallelismConfig(sp_backend="deepspeed");
what the pinned stack gets wrong on CPU or on resume is patched here, each measured
(docs/evidence/stack.md, "Tensor parallelism ... and sequence parallelism").
"""

from __future__ import annotations

from typing import Any


def parallelism_config(sp: int, attention: str) -> Any:
    from accelerate import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    # The core attention under the Ulysses wrapper must be named, and DeepSpeed raises
    # unless it is the one the model was built with: model.attn_implementation (validation
    # refuses eager and flex_attention here: launcher/validation/speed.py).
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True,
                                              sp_attn_implementation=attention)
    return ParallelismConfig(sp_backend="deepspeed", sp_size=sp, sp_handler=handler)


def trainer_class() -> type:
    """The Trainer with the two Ulysses fixes: contiguous inputs, and resume skipping."""
    import transformers.trainer
    from transformers import Trainer

    # transformers 5.25's Trainer.get_resumed_dataloader still calls this module global;
    # overriding that hook instead needs the supported floor (5.23) to have it.
    transformers.trainer.skip_first_batches = _skip_first_batches

    class UlyssesTrainer(Trainer):
        def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
            # The adapter slices each batch along the sequence without a copy; on CPU its
            # .cpu() is a no-op, so shift_labels of a batch > 1 stays non-contiguous and
            # the loss's .view(-1) fails.
            prepared = super()._prepare_inputs(inputs)
            return {key: value.contiguous() if hasattr(value, "contiguous") else value
                    for key, value in prepared.items()}

    return UlyssesTrainer


def _skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """accelerate's skip_first_batches, taught the Ulysses adapter: a resumed launch
    skips the batches the checkpoint trained. The adapter turns one batch of each rank's
    loader into sp micro batches (one per rank of the group), so n micro batches are
    n // sp loader batches, then n % sp micro batches."""
    from accelerate import skip_first_batches
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    if not isinstance(dataloader, UlyssesSPDataLoaderAdapter):
        return skip_first_batches(dataloader, num_batches)
    sp = dataloader.sp_world_size
    skipped = UlyssesSPDataLoaderAdapter(
        skip_first_batches(dataloader.dl, num_batches // sp), dataloader.sp_rank,
        dataloader.sp_group, sp, dataloader.device)
    for _ in range(num_batches % sp):
        next(skipped)
    return skipped
