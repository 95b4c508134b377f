"""Rows -> token ids and labels: the chat template, assistant-only loss, truncation
(docs/guide.md, "Data"). Assistant turn i is trained from the end of
`render(messages[:i], add_generation_prompt=True)` to the end of `render(messages[:i + 1])`:
with its end-of-turn text (the model learns to stop), without the whitespace after it, and
with no `{% generation %}` markers (most templates lack them). Label 0 is always -100: in a
packed row the previous example's last token must not learn to predict it.

A preference pair (format preference, for TRL's DPOTrainer) becomes TRL's columns:
`prompt_ids`, the tokens of `render(prompt, add_generation_prompt=True)`, and `chosen_ids`
and `rejected_ids`, the tokens of `render(prompt + answer)` after them through the answer's
end-of-turn text: the same character span an SFT encoding trains (`chat_text`). As TRL does,
prompt + answer is tokenized whole and the answer starts where its tokens leave the prompt
tokenized alone (they differ only when a token merges across the boundary; counted in a
warning). Truncation: the prompt is kept whole and each answer cut from its end, so that
prompt + answer <= max_length; a prompt of max_length tokens or more leaves no room for an
answer, and `loading.encode` refuses every such pair at once. mask_prompt does not apply:
DPO never trains on the prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.data.formats import (
    CHAT_FORMATS,
    PREFERENCE,
    TEMPLATE_FORMATS,
    Messages,
    RowError,
    common_prefix,
    messages_of,
    pair_of,
    segments_of,
)

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label value the HF loss ignores."""

BUILTIN_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '### Assistant:\\n' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'system' %}"
    "{{ '### System:\\n' + message['content'] + '\\n\\n' }}"
    "{% else %}"
    "{{ '### Human:\\n' + message['content'] + '\\n\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\\n' }}{% endif %}"
)
"""For tokenizers without a template (the bundled tiny one): ### System/Human/Assistant
headers, each assistant turn ended by eos."""

Span = tuple[int, int]
"""[start, end) character range of trained text."""

SOURCE_ROW = "__ftl_source_row"
"""Column `loading.split_records` adds to preference rows it splits: each row's number in
the file (from 1), so a refused pair is named where the user can find it."""
PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
"""What a preference pair is encoded into: TRL 1.16 DPOTrainer's tokenized columns."""
PAIR_REPORT = ("row", "full_length", "prompt_split")
"""Columns `Encoder.encode_pairs` adds for `loading.encode`'s checks, which removes them."""


@dataclass(frozen=True)
class Encoder:
    """Everything that turns a row into ids: picklable, so `datasets.map` can run it in
    several processes."""

    tokenizer: Any
    fmt: str
    columns: Mapping[str, str]
    template: str
    max_length: int
    mask_prompt: bool = True

    def text(self, row: Mapping[str, Any], index: int) -> tuple[str, list[Span]]:
        """The rendered example and its trained spans; DataError-ready message on a bad row."""
        try:
            if self.fmt in CHAT_FORMATS:
                return chat_text(messages_of(row, self.fmt, self.columns), self.render)
            return raw_text(segments_of(row, self.fmt, self.columns), self.tokenizer)
        except RowError as error:
            raise RowError(f"row {index}: {error}") from None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as error:  # jinja's TemplateError, raise_exception() in templates
            raise RowError(f"the chat template refused this conversation: {error}") from None

    def encode(self, batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list]:
        """Batched `datasets.map` function: input_ids, labels and full_length per row
        (the length before truncation); rows left with no trained token are dropped.
        Format preference: `encode_pairs`."""
        if self.fmt == PREFERENCE:
            return self.encode_pairs(batch, indices)
        out: dict[str, list] = {"input_ids": [], "labels": [], "full_length": []}
        for example in self.examples(_rows(batch), indices):
            if example is not None:
                for key, value in example.items():
                    out[key].append(value)
        return out

    def examples(self, rows: list[dict[str, Any]], indices: list[int]) -> list[dict | None]:
        """Each row encoded, in order; None for a row left with no trained token."""
        rendered = [self.text(row, index) for row, index in zip(rows, indices, strict=True)]
        enc = self.tokenizer([text for text, _ in rendered], add_special_tokens=False,
                             return_offsets_mapping=True)
        examples: list[dict | None] = []
        for (_, spans), ids, offsets in zip(rendered, enc["input_ids"], enc["offset_mapping"],
                                            strict=True):
            labels = label_tokens(ids, offsets, spans, self.mask_prompt)[:self.max_length]
            examples.append(None if all(label == IGNORE_INDEX for label in labels) else {
                "input_ids": list(ids[:self.max_length]), "labels": labels,
                "full_length": len(ids)})
        return examples

    def encode_pairs(self, batch: Mapping[str, list[Any]], indices: list[int]) -> dict[str, list]:
        """Batched `datasets.map` function of format preference: PAIR_COLUMNS per pair, the
        answers cut to fit max_length after the whole prompt, and PAIR_REPORT: the row's
        number in the file (from 1), the longer prompt + answer before truncation, and the
        prompt's tokens left out of prompt_ids (a token merged across the boundary). A
        prompt of max_length tokens or more is kept with both answers empty, for
        `loading.encode` to refuse with every other such pair. A bad row: RowError naming
        its number."""
        numbers = batch.get(SOURCE_ROW) or [index + 1 for index in indices]
        texts = [self.pair_texts(row, number) for row, number in zip(_rows(batch), numbers,
                                                                     strict=True)]
        out: dict[str, list] = {name: [] for name in (*PAIR_COLUMNS, *PAIR_REPORT)}
        if not texts:
            return out
        ids = [self.tokenizer(list(column), add_special_tokens=False)["input_ids"]
               for column in zip(*texts, strict=True)]
        for number, alone, with_chosen, with_rejected in zip(numbers, *ids, strict=True):
            # TRL's rule: the answer starts where prompt + answer leaves the prompt alone.
            kept = min(common_prefix(alone, with_chosen), common_prefix(alone, with_rejected))
            chosen, rejected = with_chosen[kept:], with_rejected[kept:]
            room = max(self.max_length - kept, 0)
            values = (list(alone[:kept]), list(chosen[:room]), list(rejected[:room]), number,
                      kept + max(len(chosen), len(rejected)), len(alone) - kept)
            for name, value in zip((*PAIR_COLUMNS, *PAIR_REPORT), values, strict=True):
                out[name].append(value)
        return out

    def pair_texts(self, row: Mapping[str, Any], number: int) -> tuple[str, str, str]:
        """The rendered prompt, prompt + chosen and prompt + rejected (each through the
        answer's end-of-turn text) of one preference row."""
        try:
            pair = pair_of(row, self.columns)
            (prompt, chosen), (_, rejected) = (pair_text(pair.prompt, answer, self.render)
                                               for answer in (pair.chosen, pair.rejected))
        except RowError as error:
            raise RowError(f"row {number}: {error}") from None
        return prompt, chosen, rejected


def _rows(batch: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """A `datasets.map` batch (column -> values) as rows."""
    names = list(batch)
    return [dict(zip(names, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def pair_text(
    prompt: Messages, answer: Messages, render: Callable[[Messages, bool], str]
) -> tuple[str, str]:
    """(render(prompt, add_generation_prompt=True), prompt + answer rendered through the end
    of the answer's last turn): the spans `chat_text` trains, so the answer ends with its
    end-of-turn text and without the whitespace after it. The answer starts (and ends) with
    an assistant turn (`formats.pair_of`)."""
    full, spans = chat_text([*prompt, *answer], render)
    start = spans[sum(1 for turn in prompt if turn["role"] == "assistant")][0]
    return full[:start], full[:spans[-1][1]]


def chat_text(
    messages: list[dict[str, str]], render: Callable[[list[dict[str, str]], bool], str]
) -> tuple[str, list[Span]]:
    """The rendered conversation and the character span of every assistant turn."""
    full = render(messages, False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        through = render(messages[:index + 1], False)
        before = render(messages[:index], True) if index else _header_of(through, message)
        if not (through.startswith(before) and full.startswith(through)):
            raise RowError(
                f"the chat template does not render turn {index} as a prefix of the whole "
                "conversation, so its assistant text cannot be located; use "
                "dataset.template=builtin or a template that renders turns in order"
            )
        # The turn's separator after its end token ("<|im_end|>" + "\n") is not learned.
        spans.append((len(before), len(through.rstrip())))
    return full, spans


def _header_of(rendered: str, first: dict[str, str]) -> str:
    """What a template writes before an opening assistant turn's content (a conversation
    cannot be rendered empty, so there is no prefix to render)."""
    start = rendered.rfind(first["content"].strip())
    if start < 0:
        raise RowError("the chat template does not write the opening assistant turn's text")
    return rendered[:start]


def raw_text(pieces: list[tuple[str, bool]], tokenizer: Any) -> tuple[str, list[Span]]:
    """bos + pieces + eos; the eos belongs to the last trained piece."""
    text, spans = tokenizer.bos_token or "", []
    pieces = [*pieces[:-1], (pieces[-1][0] + (tokenizer.eos_token or ""), pieces[-1][1])]
    for piece, trained in pieces:
        if trained:
            spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


def label_tokens(
    ids: Sequence[int], offsets: Sequence[tuple[int, int]], spans: list[Span], mask_prompt: bool
) -> list[int]:
    """ids where trained (first character inside a span; everything without mask_prompt),
    -100 elsewhere and at position 0."""
    labels = []
    for token, (start, _) in zip(ids, offsets, strict=True):
        trained = not mask_prompt or any(a <= start < b for a, b in spans)
        labels.append(int(token) if trained else IGNORE_INDEX)
    if labels:
        labels[0] = IGNORE_INDEX
    return labels


def chat_template_for(tokenizer: Any, mode: str) -> tuple[str, bool]:
    """(template, is_builtin): the tokenizer's own (a fine-tuned instruct model keeps its
    format) unless it has none or mode=builtin."""
    own = getattr(tokenizer, "chat_template", None)
    if mode == "builtin" or not own:
        return BUILTIN_CHAT_TEMPLATE, True
    if isinstance(own, dict):  # several named templates: the default one
        own = own.get("default") or next(iter(own.values()))
    return str(own), False


def adopt_chat_template(tokenizer: Any, dataset: Any) -> Any:
    """Give the tokenizer the template the chat data is rendered with (the built-in one
    when it has none), so the model saved with it chats in the format it learned."""
    if dataset.format in TEMPLATE_FORMATS:
        tokenizer.chat_template = chat_template_for(tokenizer, dataset.template)[0]
    return tokenizer
