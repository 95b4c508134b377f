"""launcher/data/loading.py packing: data.pack keeps every example whole and exactly once with
restarting position_ids, fills its rows, and the packed Collator's batches (position_ids, no
attention_mask) keep examples from attending to each other in a real (tiny) Llama."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from launcher.data import loading as data
from launcher.data.encode import IGNORE_INDEX, Encoder
from launcher.data.formats import column_map
from launcher.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "assets" / "tokenizer"
MAX_LENGTH = 128
WORDS = ("alpha beta gamma delta kappa lambda omega sigma theta river stone cloud maple "
         "copper violet harbor lantern meadow").split()


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def encode_texts(tok: Any, texts: list[str], max_length: int = MAX_LENGTH) -> Any:
    """format=text rows through the launcher's encoder (every token but the first trained)."""
    from datasets import Dataset

    encoder = Encoder(tokenizer=tok, fmt="text", columns=column_map("text", {}), template="",
                      max_length=max_length)
    return data.encode(Dataset.from_list([{"text": t} for t in texts]), encoder, "mem.jsonl",
                       None)


def varied_texts(count: int, seed: int = 0) -> list[str]:
    """Unique texts (each opens with its number) of widely varying length."""
    rng = random.Random(seed)
    return [f"ex{i:03d}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 24)))
            for i in range(count)]


def segments(row: dict) -> list[tuple[int, int]]:
    """[start, end) of each example in a packed row: where position_ids restart at 0."""
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0]
    return list(zip(starts, [*starts[1:], len(row["input_ids"])], strict=True))


# ---------------------------------------------------------------------------- data.pack


def test_pack_keeps_every_example_whole_and_exactly_once(tok):
    encoded = encode_texts(tok, varied_texts(400))
    examples = list(encoded)
    lengths = [len(e["input_ids"]) for e in examples]
    assert min(lengths) <= 10 and max(lengths) >= 110 and max(lengths) <= MAX_LENGTH, lengths
    identities = Counter((tuple(e["input_ids"]), tuple(e["labels"])) for e in examples)
    assert len(identities) == len(examples), "test data: every example must be unique"

    packed = data.pack(encoded, MAX_LENGTH)
    assert set(packed.column_names) == {"input_ids", "labels", "position_ids"}
    rows = list(packed)
    found: Counter = Counter()
    for row in rows:
        ids, labels, positions = row["input_ids"], row["labels"], row["position_ids"]
        assert len(ids) == len(labels) == len(positions) <= MAX_LENGTH
        assert positions[0] == 0
        for start, end in segments(row):
            assert positions[start:end] == list(range(end - start)), "positions count up by 1"
            found[(tuple(ids[start:end]), tuple(labels[start:end]))] += 1
    # Each example (ids and labels) is one whole segment of one row, exactly once: nothing
    # lost, duplicated, split across rows or merged with a neighbour.
    assert found == identities
    assert sum(found.values()) == len(examples)

    # And by content: each example's trained tokens appear contiguously, in one row, exactly
    # once (tokens as characters, rows separated, so a substring is a run of tokens).
    def chars(labels: list[int]) -> str:
        return "".join(chr(0x1000 + t) for t in labels if t != IGNORE_INDEX)

    stream = "|".join(chars(row["labels"]) for row in rows)
    for example in examples:
        wanted = chars(example["labels"])
        first = stream.find(wanted)
        assert first >= 0 and stream.find(wanted, first + 1) < 0, tok.decode(example["input_ids"])

    total = sum(len(row["input_ids"]) for row in rows)
    assert total == sum(lengths)
    fill = total / (len(rows) * MAX_LENGTH)
    assert fill >= 0.95, f"fill {fill:.3f} over {len(rows)} rows"


# ---------------------------------------------------------------------------- the collator


def test_packed_collator_pads_positions_and_gives_no_attention_mask(tok):
    import torch

    rows = [{"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7], "position_ids": [0, 1, 0]},
            {"input_ids": [8, 9, 10, 11, 12], "labels": [IGNORE_INDEX, 9, 10, IGNORE_INDEX, 12],
             "position_ids": [0, 1, 2, 0, 1]}]
    pad = tok.pad_token_id
    assert pad is not None and pad != tok.eos_token_id

    batch = data.collator(tok, packed=True)(rows)
    assert set(batch) == {"input_ids", "labels", "position_ids"}, "packed: no attention_mask"
    assert all(v.dtype == torch.long and v.shape == (2, 5) for v in batch.values())
    assert batch["input_ids"].tolist() == [[5, 6, 7, pad, pad], [8, 9, 10, 11, 12]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7, IGNORE_INDEX, IGNORE_INDEX],
                                        [IGNORE_INDEX, 9, 10, IGNORE_INDEX, 12]]
    # The pad tail is one more sequence: its positions start at 0.
    assert batch["position_ids"].tolist() == [[0, 1, 0, 0, 1], [0, 1, 2, 0, 1]]

    plain = [{k: v for k, v in row.items() if k != "position_ids"} for row in rows]
    batch = data.collator(tok)(plain)
    assert set(batch) == {"input_ids", "labels", "attention_mask"}, "unpacked: no position_ids"
    assert batch["input_ids"].tolist() == [[5, 6, 7, pad, pad], [8, 9, 10, 11, 12]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, 6, 7, IGNORE_INDEX, IGNORE_INDEX]


def test_collator_pads_with_eos_without_a_pad_token_and_refuses_neither():
    from types import SimpleNamespace

    assert data.collator(SimpleNamespace(pad_token_id=None, eos_token_id=2)).pad_token_id == 2
    with pytest.raises(DataError, match="pad"):
        data.collator(SimpleNamespace(pad_token_id=None, eos_token_id=None))


# ---------------------------------------------------------------------------- attention


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tok) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=request.param)
    assert model.config._attn_implementation == request.param
    model.eval()
    model.config.use_cache = False  # as the HF Trainer runs it in training
    return model


def logits(model: Any, **inputs: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(**inputs).logits


def solo_logits(model: Any, ids: list[int]) -> Any:
    import torch

    return logits(model, input_ids=torch.tensor([ids]))[0]


def max_diff(a: Any, b: Any) -> float:
    return float((a - b).abs().max())


THREE = ["ex001: alpha beta gamma", "ex002: river stone cloud maple copper violet harbor",
         "ex003: lantern meadow omega sigma theta kappa lambda delta beta alpha river stone"]


def test_packed_row_gives_each_example_its_solo_logits(tok, model):
    import torch

    examples = list(encode_texts(tok, THREE))
    packed = list(data.pack(encode_texts(tok, THREE), MAX_LENGTH))
    assert len(packed) == 1, "the three examples fit one row"
    row = packed[0]
    batch = data.collator(tok, packed=True)([row])
    assert "attention_mask" not in batch

    got = logits(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"])[0]
    crossed = logits(model, input_ids=batch["input_ids"])[0]  # plain causal, one sequence
    leaky = logits(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                   attention_mask=torch.ones_like(batch["input_ids"]))[0]
    bounds = segments(row)
    assert len(bounds) == 3
    for order, (start, end) in enumerate(bounds):
        ids = row["input_ids"][start:end]
        assert ids in [e["input_ids"] for e in examples]
        solo = solo_logits(model, ids)
        assert max_diff(got[start:end], solo) < 1e-4, (
            f"{model.config._attn_implementation}: example {order} of the packed row attends "
            "outside itself (or gets wrong positions)")
        # Teeth: without the block-diagonal mask the later examples see the earlier ones.
        if order:
            assert max_diff(crossed[start:end], solo) > 1e-3
            assert max_diff(leaky[start:end], solo) > 1e-3
        else:
            assert max_diff(crossed[start:end], solo) < 1e-4


def test_batch_of_packed_rows_of_different_lengths_keeps_padding_isolated(tok, model):
    # 7 examples of 12..45 tokens: rows of 62, 55, 59 and 12 tokens, three with two examples.
    texts = [f"ex{i:03d}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(n))
             for i, n in enumerate([1, 2, 4, 6, 7, 9, 3])]
    encoded = encode_texts(tok, texts, max_length=64)
    examples = {tuple(ids) for ids in encoded["input_ids"]}
    rows = list(data.pack(encoded, 64))
    widths = [len(r["input_ids"]) for r in rows]
    assert len(rows) >= 3 and len(set(widths)) >= 3, widths
    assert sum(len(segments(r)) >= 2 for r in rows if len(r["input_ids"]) < max(widths)) >= 2

    batch = data.collator(tok, packed=True)(rows)
    assert "attention_mask" not in batch
    got = logits(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    seen = set()
    for b, row in enumerate(rows):
        for start, end in segments(row):
            ids = row["input_ids"][start:end]
            assert max_diff(got[b, start:end], solo_logits(model, ids)) < 1e-4, (
                f"{model.config._attn_implementation}: row {b} of a padded packed batch leaks "
                "attention across examples or padding")
            seen.add(tuple(ids))
    assert seen == examples
