"""Generate the bundled default dataset (data/arith/) and its tokenizer (assets/tokenizer/).

    make data        # = .venv/bin/python scripts/make_data.py

Deterministic: the same seed gives byte-identical files (tests/unit/test_data.py checks
the committed ones). Five short tasks a tiny Llama (hidden 64, 2 layers, vocab 512) can
visibly learn in minutes on a CPU; every example stays well under the 64-token context:

    add        "Add the two numbers."       "23 45"  -> "68"
    successor  "Give the next number."      "407"    -> "408"
    sort       "Sort the digits."           "5381"   -> "1358"
    uppercase  "Write the word in capitals." "kodami" -> "KODAMI"
    reverse    "Reverse the word."          "kodami" -> "imadok"

Words are pronounceable pseudo-words (consonant-vowel syllables) so there are enough
distinct ones for a train and an eval split that share no (instruction, input) pair.

The tokenizer is a byte-level BPE (digits split one per token, as Llama does) trained on the
examples in the Alpaca layout the first release trained with (`alpaca_text`; kept so the
committed tokenizer stays byte-identical); vocabulary: <unk> <s> </s> <pad>, the 256
bytes, then merges up to 512 in all.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 1234
TRAIN_PER_TASK = 600
EVAL_PER_TASK = 40
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"

Record = dict[str, str]


def pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(2, 3)))


def make_add(rng: random.Random) -> Record:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return {"instruction": "Add the two numbers.", "input": f"{a} {b}", "output": str(a + b)}


def make_successor(rng: random.Random) -> Record:
    n = rng.randint(0, 998)
    return {"instruction": "Give the next number.", "input": str(n), "output": str(n + 1)}


def make_sort(rng: random.Random) -> Record:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 6)))
    return {"instruction": "Sort the digits.", "input": digits, "output": "".join(sorted(digits))}


def make_uppercase(rng: random.Random) -> Record:
    word = pseudo_word(rng)
    return {"instruction": "Write the word in capitals.", "input": word, "output": word.upper()}


def make_reverse(rng: random.Random) -> Record:
    word = pseudo_word(rng)
    return {"instruction": "Reverse the word.", "input": word, "output": word[::-1]}


TASKS: list[Callable[[random.Random], Record]] = [
    make_add, make_successor, make_sort, make_uppercase, make_reverse,
]


def make_splits(seed: int) -> tuple[list[Record], list[Record]]:
    """Per task: distinct inputs, the first EVAL_PER_TASK for eval, the rest for train."""
    rng = random.Random(seed)
    train: list[Record] = []
    evaluation: list[Record] = []
    for task in TASKS:
        seen: set[str] = set()
        rows: list[Record] = []
        while len(rows) < TRAIN_PER_TASK + EVAL_PER_TASK:
            row = task(rng)
            if row["input"] not in seen:
                seen.add(row["input"])
                rows.append(row)
        evaluation += rows[:EVAL_PER_TASK]
        train += rows[EVAL_PER_TASK:]
    rng.shuffle(train)
    rng.shuffle(evaluation)
    return train, evaluation


def write_jsonl(path: Path, rows: list[Record]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=True) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8", newline="\n")


def alpaca_text(row: Record) -> str:
    """The "### Instruction / ### Input / ### Response" rendering the tokenizer was fit on."""
    prompt = f"### Instruction:\n{row['instruction']}\n\n"
    if row["input"]:
        prompt += f"### Input:\n{row['input']}\n\n"
    return prompt + "### Response:\n" + row["output"]


def train_tokenizer(rows: list[Record], out_dir: Path) -> None:
    """Byte-level BPE on the rendered examples, saved as a transformers tokenizer dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # One token per digit (as in Llama): keeps numbers aligned for the arithmetic tasks.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [alpaca_text(row) for row in rows]
    tok.train_from_iterator(texts, trainer=trainer)
    # tokenizer("...") starts with <s>, like Llama's; launcher.data.loading adds bos itself.
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=256,  # tiny-llama's max_position_embeddings
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "arith")
    parser.add_argument("--tokenizer-dir", type=Path, default=ROOT / "assets" / "tokenizer")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    train, evaluation = make_splits(args.seed)
    write_jsonl(args.data_dir / "train.jsonl", train)
    write_jsonl(args.data_dir / "eval.jsonl", evaluation)
    train_tokenizer(train, args.tokenizer_dir)
    print(f"wrote {len(train)} train + {len(evaluation)} eval examples to {args.data_dir}, "
          f"tokenizer to {args.tokenizer_dir}")


if __name__ == "__main__":
    main()
