"""launcher/data/encode.py (through launcher/data/loading.py's encoder_for/encode): chat
templates without generation markers, assistant-only labels, raw formats, truncation, bad
templates."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.data import loading as data
from launcher.data.encode import (
    BUILTIN_CHAT_TEMPLATE,
    IGNORE_INDEX,
    Encoder,
    adopt_chat_template,
    chat_template_for,
)
from launcher.data.formats import RowError, column_map
from launcher.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "assets" / "tokenizer"

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class Template:
    source: str | None
    """The tokenizer's own chat template; None: the tokenizer has none (built-in used)."""
    markers: tuple[str, ...]
    end: str
    """What ends an assistant turn (trained with it)."""
    assistant: str
    """Regex whose group 1 is an assistant turn's trained text, written independently of
    the encoder: located from the template's own markup."""


TEMPLATES = {
    "chatml": Template(CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>",
                       r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)"),
    "llama3": Template(LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                       "<|eot_id|>",
                       r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)"),
    "builtin": Template(None, (), "</s>", r"### Assistant:\n(.*?</s>)"),
}

CONVERSATION = [
    {"role": "system", "content": "You are terse. Answer in words."},
    {"role": "user", "content": "What is one plus two?"},
    {"role": "assistant", "content": "three"},
    # The user repeats the later answer: spans must come from the template, not a search.
    {"role": "user", "content": "And two plus two? Say four, of course, if so."},
    {"role": "assistant", "content": "four, of course."},
]
SHORT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there!"}]
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}

ALPACA = [
    {"instruction": "Add the numbers.", "input": "12 30", "output": "forty two",
     "system": "You are a calculator."},
    {"instruction": "Say hi.", "input": "", "output": "hi", "system": ""},
]
ALPACA_MESSAGES = [
    [{"role": "system", "content": "You are a calculator."},
     {"role": "user", "content": "Add the numbers.\n\n12 30"},
     {"role": "assistant", "content": "forty two"}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}],
]


def chat_case(fmt: str) -> tuple[str, list[dict], list[list[dict]]]:
    """(dataset.format, rows, the conversation each row means)."""
    conversations = [CONVERSATION, SHORT]
    if fmt == "alpaca":
        return "alpaca", ALPACA, ALPACA_MESSAGES
    if fmt == "sharegpt":
        rows = [{"conversations": [{"from": SHAREGPT_ROLES[m["role"]], "value": m["content"]}
                                   for m in conv]} for conv in conversations]
        return "sharegpt", rows, conversations
    if fmt == "chat_conversations":  # format=chat, turns in a `conversations` column
        return "chat", [{"conversations": conv} for conv in conversations], conversations
    return "chat", [{"messages": conv} for conv in conversations], conversations


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def base_tok() -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    assert not getattr(tok, "chat_template", None), "the bundled tokenizer has no template"
    return tok


@pytest.fixture(scope="module")
def toks(base_tok) -> dict[str, Any]:
    """A copy of the bundled tokenizer per template: its markers as special tokens and the
    template as its own (none for builtin). Tests that mutate one take a copy."""
    out = {}
    for name, template in TEMPLATES.items():
        tok = copy.deepcopy(base_tok)
        if template.markers:
            tok.add_special_tokens({"additional_special_tokens": list(template.markers)})
            tok.chat_template = template.source
        out[name] = tok
    return out


@functools.cache
def config(fmt: str, *overrides: str) -> Any:
    return compose_config(["dataset=arith", f"dataset.format={fmt}", "dataset.path=mem.jsonl",
                           "dataset.max_length=512", *overrides])


def encoded(cfg: Any, tok: Any, rows: list[dict]) -> tuple[list[dict], Encoder]:
    """Rows through data.encoder_for and data.encode, as the launcher runs them."""
    from datasets import Dataset

    records = Dataset.from_list(rows)
    encoder = data.encoder_for(cfg, tok, records.column_names)
    return list(data.encode(records, encoder, "mem.jsonl", None)), encoder


def token_ranges(tok: Any, ids: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each token in the decoded text (by decoding growing prefixes)."""
    bounds = [len(tok.decode(ids[:n])) for n in range(len(ids) + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


def expected_labels(tok: Any, ids: list[int], spans: list[tuple[int, int]]) -> list[int]:
    """ids for tokens inside a trained character span, -100 outside and at position 0; a
    token straddling a span boundary fails the test (the expectation would be ambiguous)."""
    labels = []
    for position, (start, end) in enumerate(token_ranges(tok, ids)):
        inside = any(a <= start and end <= b for a, b in spans)
        outside = all(end <= a or b <= start for a, b in spans)
        assert inside or outside, f"token {position} {tok.decode([ids[position]])!r} " \
                                  f"straddles a trained span {spans}"
        labels.append(ids[position] if inside and position else IGNORE_INDEX)
    return labels


def assert_conversations_fallback(cfg: Any, tok: Any) -> None:
    columns = data.encoder_for(cfg, tok, ["conversations"]).columns
    assert columns == {"messages": "conversations"}, (
        "BUG launcher/data/formats.py column_map: the launcher passes dataset.columns as "
        "asdict(ColumnsConfig) ({'messages': '', ...}), so `'messages' not in renames` is "
        "False and a chat file with only a `conversations` column is never read from it "
        f"(column map {columns}); the check should be `not renames.get('messages')`"
    )


def trained(tok: Any, example: dict) -> str:
    return tok.decode([t for t in example["labels"] if t != IGNORE_INDEX])


# ---------------------------------------------------------------------------- chat formats


@pytest.mark.parametrize("fmt", ["chat", "sharegpt", "chat_conversations", "alpaca"])
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_chat_rows_train_exactly_each_assistant_turn_and_its_end_token(toks, name, fmt):
    template, tok = TEMPLATES[name], toks[name]
    dataset_format, rows, conversations = chat_case(fmt)
    if fmt == "chat_conversations":
        assert_conversations_fallback(config("chat"), tok)
    examples, encoder = encoded(config(dataset_format), tok, rows)
    assert encoder.template == (template.source or BUILTIN_CHAT_TEMPLATE)
    assert len(examples) == len(rows)
    for example, messages in zip(examples, conversations, strict=True):
        ids, labels = example["input_ids"], example["labels"]
        assert len(ids) == len(labels)
        rendered = tok.apply_chat_template(messages, tokenize=False,
                                           chat_template=template.source or BUILTIN_CHAT_TEMPLATE)
        assert tok.decode(ids) == rendered, "input_ids are not the rendered conversation"
        answers = [m["content"] + template.end for m in messages if m["role"] == "assistant"]
        turns = list(re.finditer(template.assistant, rendered, flags=re.S))
        assert [turn.group(1) for turn in turns] == answers
        assert trained(tok, example) == "".join(answers)
        # Token by token: system, user, headers and separators -100; answers + end trained.
        assert labels == expected_labels(tok, ids, [turn.span(1) for turn in turns])
        assert labels[0] == IGNORE_INDEX


def test_chat_file_keeping_its_turns_in_conversations_loads_and_encodes(tmp_path, base_tok):
    """format=chat on a file whose turns are in `conversations`, through the launcher's own
    loading (data.split_records) and encoder (data.encoder_for)."""
    path = tmp_path / "convs.jsonl"
    path.write_text("".join(json.dumps({"conversations": conv}) + "\n"
                            for conv in (CONVERSATION, SHORT)))
    cfg = compose_config(["dataset=arith", "dataset.format=chat", f"dataset.path={path}",
                          "dataset.eval_path=", "dataset.eval_fraction=0",
                          "dataset.max_length=512"])
    assert_conversations_fallback(cfg, base_tok)
    train, held_out, _ = data.split_records(cfg)
    assert held_out is None and len(train) == 2
    encoder = data.encoder_for(cfg, base_tok, train.column_names)
    first, second = data.encode(train, encoder, str(path), None)
    assert trained(base_tok, first) == "three</s>four, of course.</s>"
    assert trained(base_tok, second) == "Hello there!</s>"


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_conversation_opening_with_an_assistant_turn_trains_only_its_text(toks, name):
    """A conversation may open with the assistant (a greeting): only its text and end token
    are trained, as for any later turn, not the template's assistant header."""
    template, tok = TEMPLATES[name], toks[name]
    messages = [{"role": "assistant", "content": "Hello, how can I help?"},
                {"role": "user", "content": "Add two and two."},
                {"role": "assistant", "content": "four"}]
    (example,), _ = encoded(config("chat"), tok, [{"messages": messages}])
    got = trained(tok, example)
    assert got == f"Hello, how can I help?{template.end}four{template.end}", (
        "BUG launcher/data/encode.py chat_text: an assistant turn at index 0 gets before='' "
        "(transformers refuses to render an empty conversation), so the whole rendered "
        "turn, the template's assistant header included, is trained: trained text "
        f"{got!r}"
    )


# ---------------------------------------------------------------------------- raw formats


def test_prompt_completion_with_renamed_columns_trains_completion_and_eos(base_tok):
    cfg = config("prompt_completion", "dataset.columns.prompt=question",
                 "dataset.columns.completion=answer")
    rows = [{"question": "Q: What is two plus two?\nA:", "answer": " four"},
            {"question": "Name a colour.\n", "answer": "blue, like the sky"}]
    examples, _ = encoded(cfg, base_tok, rows)
    assert len(examples) == 2
    for example, row in zip(examples, rows, strict=True):
        ids = example["input_ids"]
        prompt = "<s>" + row["question"]
        assert base_tok.decode(ids) == prompt + row["answer"] + "</s>"
        assert trained(base_tok, example) == row["answer"] + "</s>"
        span = (len(prompt), len(prompt) + len(row["answer"]) + len("</s>"))
        assert example["labels"] == expected_labels(base_tok, ids, [span])


def test_text_trains_every_token_but_the_first(base_tok):
    rows = [{"text": "the cat sat on the mat"}, {"text": "Once upon a time, 42 owls."}]
    examples, _ = encoded(config("text"), base_tok, rows)
    for example, row in zip(examples, rows, strict=True):
        ids = example["input_ids"]
        assert base_tok.decode(ids) == "<s>" + row["text"] + "</s>"
        assert example["labels"] == [IGNORE_INDEX, *ids[1:]]


@pytest.mark.parametrize("fmt", ["chat", "alpaca", "prompt_completion"])
def test_mask_prompt_false_trains_everything_but_position_zero(toks, fmt):
    rows = {"chat": [{"messages": CONVERSATION}], "alpaca": ALPACA,
            "prompt_completion": [{"prompt": "Q: 2+2?\nA:", "completion": " four"}]}[fmt]
    examples, _ = encoded(config(fmt, "dataset.mask_prompt=false"), toks["chatml"], rows)
    assert len(examples) == len(rows)
    for example in examples:
        ids = example["input_ids"]
        assert example["labels"] == [IGNORE_INDEX, *ids[1:]]


# ---------------------------------------------------------------------------- truncation


def test_example_longer_than_max_length_is_cut_to_max_length(base_tok):
    messages = [{"role": "user", "content": "Count."},
                {"role": "assistant", "content": " ".join(str(n) for n in range(60))}]
    rows = [{"messages": messages}]
    (full,), encoder = encoded(config("chat"), base_tok, rows)
    assert len(full["input_ids"]) > 60
    short = dataclasses.replace(encoder, max_length=40)
    out = short.encode({"messages": [messages]}, [0])
    assert out["input_ids"] == [full["input_ids"][:40]]
    assert out["labels"] == [full["labels"][:40]]
    assert out["full_length"] == [len(full["input_ids"])]
    assert trained(base_tok, {"labels": out["labels"][0]}).startswith("0 1 2")


@pytest.mark.parametrize("fmt", ["chat", "prompt_completion"])
def test_example_whose_answer_starts_after_max_length_is_dropped(base_tok, fmt):
    long_prompt = "Please read this very long question carefully. " * 3
    if fmt == "chat":
        columns = column_map("chat", {})
        batch = {"messages": [[{"role": "user", "content": long_prompt},
                               {"role": "assistant", "content": "yes"}], SHORT]}
    else:
        columns = column_map("prompt_completion", {})
        batch = {"prompt": [long_prompt, "Hi\n"], "completion": ["yes", "Hello there!"]}
    encoder = Encoder(tokenizer=base_tok, fmt=fmt, columns=columns,
                      template=BUILTIN_CHAT_TEMPLATE, max_length=512)
    full = encoder.encode(batch, [0, 1])
    first_trained = [next(i for i, t in enumerate(labels) if t != IGNORE_INDEX)
                     for labels in full["labels"]]
    assert first_trained[0] > 40 > len(full["input_ids"][1])

    cut = dataclasses.replace(encoder, max_length=40).encode(batch, [0, 1])
    assert len(cut["input_ids"]) == 1, "the row with no trained token left must be dropped"
    assert cut["input_ids"] == [full["input_ids"][1]]
    assert cut["labels"] == [full["labels"][1]]

    # At the boundary: the first trained token at position max_length - 1 is kept alone.
    edge = dataclasses.replace(encoder, max_length=first_trained[0])
    assert len(edge.encode(batch, [0, 1])["input_ids"]) == 1
    kept = dataclasses.replace(encoder, max_length=first_trained[0] + 1).encode(batch, [0, 1])
    assert len(kept["input_ids"]) == 2
    assert sum(t != IGNORE_INDEX for t in kept["labels"][0]) == 1


def test_encode_refuses_data_where_every_row_is_dropped(base_tok):
    from datasets import Dataset

    rows = [{"prompt": "A long question that never ends. " * 4, "completion": "yes"}] * 3
    records = Dataset.from_list(rows)
    encoder = data.encoder_for(config("prompt_completion", "dataset.max_length=16"), base_tok,
                               records.column_names)
    with pytest.raises(DataError, match=r"dataset\.max_length=16") as err:
        data.encode(records, encoder, "long.jsonl", None)
    assert "long.jsonl" in str(err.value)


# ---------------------------------------------------------------------------- bad templates


LAST_RENDERED_DIFFERENTLY = (  # in conversations of more than 3 messages
    "{% for m in messages %}{% if loop.last and messages | length > 3 %}"
    "{{ m['role'] | upper }}: {{ m['content'] }}\n{% else %}{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
REWRITES_EARLIER_TURNS = (
    "{% for m in messages %}{{ m['role'] }}{% if messages | length > 2 %} #{{ loop.index }}"
    "{% endif %}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
REFUSES_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('system turns are not supported by this model') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def with_template(base_tok: Any, template: str) -> Any:
    tok = copy.deepcopy(base_tok)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("template", [LAST_RENDERED_DIFFERENTLY, REWRITES_EARLIER_TURNS],
                         ids=["last_rendered_differently", "rewrites_earlier_turns"])
def test_template_that_is_not_prefix_consistent_is_refused_with_the_row(base_tok, template):
    from datasets import Dataset

    tok, good = with_template(base_tok, template), SHORT
    rows = [{"messages": good}, {"messages": CONVERSATION}]
    records = Dataset.from_list(rows)
    encoder = data.encoder_for(config("chat"), tok, records.column_names)
    assert encoder.encode({"messages": [good]}, [0])["input_ids"], "a usable row is encoded"
    with pytest.raises(RowError, match=r"^row 7: .*prefix"):
        encoder.encode({"messages": [good, CONVERSATION]}, [6, 7])
    with pytest.raises(DataError) as err:
        data.encode(records, encoder, "convs.jsonl", None)
    message = str(err.value)
    assert "convs.jsonl" in message and re.search(r"\brow 1\b", message), message
    assert "prefix" in message and "dataset.template=builtin" in message


def test_template_raise_exception_is_reported_with_the_row(base_tok):
    from datasets import Dataset

    tok = with_template(base_tok, REFUSES_SYSTEM)
    records = Dataset.from_list([{"messages": SHORT}, {"messages": CONVERSATION}])
    encoder = data.encoder_for(config("chat"), tok, records.column_names)
    with pytest.raises(DataError) as err:
        data.encode(records, encoder, "convs.jsonl", None)
    message = str(err.value)
    assert re.search(r"\brow 1\b", message), message
    assert "system turns are not supported by this model" in message


# ---------------------------------------------------------------------------- which template


@pytest.mark.parametrize("fmt", ["chat", "sharegpt", "alpaca"])
def test_adopt_gives_a_templateless_tokenizer_the_builtin_for_chat_formats(base_tok, fmt):
    tok = copy.deepcopy(base_tok)
    assert adopt_chat_template(tok, config(fmt).dataset) is tok
    assert tok.chat_template == BUILTIN_CHAT_TEMPLATE
    # The saved tokenizer now renders the data the way it was trained.
    assert tok.apply_chat_template(SHORT, tokenize=False) == (
        "<s>### Human:\nHi\n\n### Assistant:\nHello there!</s>")


def test_adopt_keeps_the_tokenizers_own_template_and_leaves_raw_formats_alone(toks, base_tok):
    own = copy.deepcopy(toks["chatml"])
    adopt_chat_template(own, config("chat").dataset)
    assert own.chat_template == CHATML
    for fmt in ("text", "prompt_completion"):
        bare = copy.deepcopy(base_tok)
        adopt_chat_template(bare, config(fmt).dataset)
        assert not getattr(bare, "chat_template", None)
        adopt_chat_template(own, config(fmt, "dataset.template=builtin").dataset)
        assert own.chat_template == CHATML


def test_template_builtin_forces_the_builtin_template(toks):
    tok = copy.deepcopy(toks["chatml"])
    cfg = config("chat", "dataset.template=builtin")
    (example,), encoder = encoded(cfg, tok, [{"messages": SHORT}])
    assert encoder.template == BUILTIN_CHAT_TEMPLATE
    assert tok.decode(example["input_ids"]) == (
        "<s>### Human:\nHi\n\n### Assistant:\nHello there!</s>")
    assert trained(tok, example) == "Hello there!</s>"
    adopt_chat_template(tok, cfg.dataset)
    assert tok.chat_template == BUILTIN_CHAT_TEMPLATE


def test_chat_template_for_modes():
    own = SimpleNamespace(chat_template="OWN")
    assert chat_template_for(own, "auto") == ("OWN", False)
    assert chat_template_for(own, "builtin") == (BUILTIN_CHAT_TEMPLATE, True)
    assert chat_template_for(SimpleNamespace(chat_template=None), "auto") == (
        BUILTIN_CHAT_TEMPLATE, True)
    named = SimpleNamespace(chat_template={"tool_use": "TOOLS", "default": "DEFAULT"})
    assert chat_template_for(named, "auto") == ("DEFAULT", False)


def test_builtin_stand_in_is_announced_only_when_it_replaces_a_missing_template(
        base_tok, toks, caplog):
    with caplog.at_level(logging.WARNING, logger="launcher.data.loading"):
        data.encoder_for(config("chat"), base_tok, ["messages"])
    assert "no chat template" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="launcher.data.loading"):
        data.encoder_for(config("chat", "dataset.template=builtin"), base_tok, ["messages"])
        data.encoder_for(config("chat"), toks["chatml"], ["messages"])
        data.encoder_for(config("text"), base_tok, ["text"])
    assert "no chat template" not in caplog.text
