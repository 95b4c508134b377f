"""The hand-written baseline: a minimal HF Trainer script, what a user writes without ftlaunch.

    torchrun --standalone --nproc_per_node 2 bench/baseline_trainer.py SPEC.json

SPEC.json (written by bench/train_overhead.py from the same composed config `ftl train`
uses) gives the tokenized data dirs (the launcher's cache, so data, template and masking are
identical), the model's architecture numbers (built from config), batch, learning rate,
schedule, seed, steps and the strategy (ddp | zero2 | ...). Settings in which the launcher
makes a speed decision the baseline copies (gloo, adamw_torch, no unused-parameter search,
no tqdm), so the ratio measures only what the launcher adds: its callbacks, token counting,
TensorBoard, the run-dir bookkeeping and its start-up. The DeepSpeed config is "auto"
everywhere the Trainer fills it, with ftl's own zero_optimization block (SPEC.json's; its
bucket sizes decide how ZeRO-2 overlaps, so leaving DeepSpeed's 5e8 default would measure
another training); on CPU accelerate's state must be pre-configured (docs/evidence/stack.md)
or DeepSpeed runs each rank alone.

Timing comes from bench.callbacks.StepClock, the same callback `ftl train` gets injected.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import load_from_disk
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
    set_seed,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.callbacks import StepClock  # noqa: E402


def collate(rows: list[dict], pad: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row: pad id in input_ids, -100 in labels, an attention mask."""
    width = max(len(r["input_ids"]) for r in rows)
    ids, labels, mask = [], [], []
    for r in rows:
        fill = width - len(r["input_ids"])
        ids.append(list(r["input_ids"]) + [pad] * fill)
        labels.append(list(r["labels"]) + [-100] * fill)
        mask.append([1] * len(r["input_ids"]) + [0] * fill)
    return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
            "attention_mask": torch.tensor(mask)}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    m, t = spec["model"], spec["train"]
    deepspeed = spec["zero_optimization"] is not None
    if deepspeed:
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        from accelerate import PartialState

        PartialState(backend="gloo")

    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_ds = load_from_disk(spec["train_data"])
    eval_ds = load_from_disk(spec["eval_data"]) if spec["eval_data"] else None

    ds_config = None
    if deepspeed:
        ds_config = {
            "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "zero_optimization": spec["zero_optimization"],
            "zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True,
        }
    args = TrainingArguments(
        output_dir=spec["output_dir"],
        per_device_train_batch_size=t["micro_batch_size"],
        per_device_eval_batch_size=t["micro_batch_size"],
        gradient_accumulation_steps=t["grad_accum"],
        max_steps=t["max_steps"],
        learning_rate=t["lr"],
        warmup_steps=t["warmup_ratio"],
        lr_scheduler_type=t["lr_scheduler"],
        weight_decay=t["weight_decay"],
        max_grad_norm=t["max_grad_norm"],
        logging_steps=t["logging_steps"],
        eval_strategy="steps" if t["eval_steps"] > 0 else "no",
        eval_steps=t["eval_steps"] or None,
        eval_on_start=t["eval_on_start"],
        save_strategy="steps" if t["save_steps"] > 0 else "no",
        save_steps=max(t["save_steps"], 1),
        seed=t["seed"],
        data_seed=t["seed"],
        use_cpu=not deepspeed,
        ddp_backend="gloo",
        optim="adamw_torch",
        dataloader_pin_memory=False,
        ddp_find_unused_parameters=False,
        disable_tqdm=True,
        report_to="none",
        deepspeed=ds_config,
        accelerator_config={"use_configured_state": True} if deepspeed else None,
    )
    set_seed(t["seed"])
    config = AutoConfig.for_model(
        m["architecture"], hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"],
        intermediate_size=m["intermediate_size"],
        vocab_size=max(m["vocab_size"], len(tokenizer)),
        max_position_embeddings=m["max_position_embeddings"],
        tie_word_embeddings=m["tie_word_embeddings"], rope_theta=m["rope_theta"],
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    pad = tokenizer.pad_token_id
    trainer = Trainer(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
        data_collator=lambda rows: collate(rows, pad), processing_class=tokenizer,
        callbacks=[StepClock(spec["clock_dir"])],
    )
    trainer.train()
    if eval_ds is not None:
        trainer.evaluate()
    trainer.save_model(str(Path(spec["output_dir"]) / "model"))
    # A multi-rank gloo run can abort in interpreter teardown (docs/evidence/stack.md).
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
