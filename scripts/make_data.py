"""Generate the bundled default dataset (data/arith/), the other two sources of the mixture
preset (data/mix/: configs/dataset/mix.yaml) and the tokenizer (assets/tokenizer/).

    make data        # = .venv/bin/python scripts/make_data.py

Deterministic: the same seed gives byte-identical files (tests/unit/test_data.py checks
the committed ones).

The data: two-digit addition, one consistent format, the sum as the whole answer:

    {"instruction": "12+30", "output": "42"}

Every pair of 10..99 once (8100), shuffled; the first EVAL_ROWS are the held-out prompts,
the rest the training set. A row has no `input`, so its user turn is the instruction alone
and `ftl chat MODEL --prompt "12+30"` renders exactly the prompt the model trained on. The
task is chosen so that the embedded default (tiny Llama, 2 CPU processes, about a minute of
training) visibly learns it: >= 90 % of the held-out sums exactly right, from 0 % before
(`ftl train` prints both, launcher/inference/examples.py); one token per digit keeps the
columns aligned.

The tokenizer is a byte-level BPE (digits split one per token, as Llama does) trained on
TOKENIZER_TASKS, short word and number tasks rendered in the Alpaca layout the first
release trained with (`alpaca_text`). They were the bundled data before the addition task;
they stay the tokenizer's corpus so that the committed tokenizer stays byte-identical and
its merges cover words as well as digits. Vocabulary: <unk> <s> </s> <pad>, the 256
bytes, then merges up to 512 in all.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEED = 1234
OPERANDS = range(10, 100)
EVAL_ROWS = 200
TRAIN_PER_TASK = 600  # the tokenizer corpus: rows per task of TOKENIZER_TASKS
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


TOKENIZER_TASKS: list[Callable[[random.Random], Record]] = [
    make_add, make_successor, make_sort, make_uppercase, make_reverse,
]


def make_addition(seed: int) -> tuple[list[Record], list[Record]]:
    """(train, eval): every "a+b" of two-digit numbers once, shuffled; eval comes first."""
    pairs = [(a, b) for a in OPERANDS for b in OPERANDS]
    random.Random(seed).shuffle(pairs)
    rows = [{"instruction": f"{a}+{b}", "output": str(a + b)} for a, b in pairs]
    return rows[EVAL_ROWS:], rows[:EVAL_ROWS]


MIX_SUBTRACTIONS = 2000
MIX_CHATS = 1000


def make_subtraction(seed: int) -> list[Record]:
    """data/mix/sub.jsonl (alpaca): "a-b" of two-digit numbers, a >= b, each pair once."""
    pairs = [(a, b) for a in OPERANDS for b in OPERANDS if a >= b]
    random.Random(seed + 1).shuffle(pairs)
    return [{"instruction": f"{a}-{b}", "output": str(a - b)}
            for a, b in pairs[:MIX_SUBTRACTIONS]]


def make_reversals(seed: int) -> list[dict[str, list[Record]]]:
    """data/mix/chat.jsonl (chat): "reverse <word>" answered with the word reversed."""
    rng, seen, rows = random.Random(seed + 2), set(), []
    while len(rows) < MIX_CHATS:
        word = pseudo_word(rng)
        if word not in seen:
            seen.add(word)
            rows.append({"messages": [{"role": "user", "content": f"reverse {word}"},
                                      {"role": "assistant", "content": word[::-1]}]})
    return rows


def tokenizer_corpus(seed: int) -> list[Record]:
    """Per task of TOKENIZER_TASKS: distinct inputs drawn in the order the first release's
    data generator drew them (so its rows, and the tokenizer fit on them, are unchanged)."""
    rng = random.Random(seed)
    train: list[Record] = []
    for task in TOKENIZER_TASKS:
        seen: set[str] = set()
        rows: list[Record] = []
        while len(rows) < TRAIN_PER_TASK + EVAL_PER_TASK:
            row = task(rng)
            if row["input"] not in seen:
                seen.add(row["input"])
                rows.append(row)
        train += rows[EVAL_PER_TASK:]  # the first ones were that release's eval rows
    rng.shuffle(train)
    return train


def write_jsonl(path: Path, rows: list[Any]) -> None:
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
    parser.add_argument("--mix-dir", type=Path, default=ROOT / "data" / "mix")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    train, evaluation = make_addition(args.seed)
    write_jsonl(args.data_dir / "train.jsonl", train)
    write_jsonl(args.data_dir / "eval.jsonl", evaluation)
    write_jsonl(args.mix_dir / "sub.jsonl", make_subtraction(args.seed))
    write_jsonl(args.mix_dir / "chat.jsonl", make_reversals(args.seed))
    train_tokenizer(tokenizer_corpus(args.seed), args.tokenizer_dir)
    print(f"wrote {len(train)} train + {len(evaluation)} eval examples to {args.data_dir}, "
          f"the mixture's other sources to {args.mix_dir}, tokenizer to {args.tokenizer_dir}")


if __name__ == "__main__":
    main()
