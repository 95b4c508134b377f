"""Streaming (dataset.streaming; launcher/data/stream.py): the training set tokenized as it
is read. In the files' order a stream's rows and batches are the up-front cache's; a stream
stopped at any row (mid-block, mid-chunk, at a pass's end, after it) and started again from
the state recorded before that row reads on exactly, as it does tokenized in processes of
its own; each block's order is seeded and keeps every
row; `ftl preprocess` estimates a pass from the sources' sizes; what a stream cannot do is
refused before launch, and `ftl estimate --count-tokens` takes a stream's tokens from
those sizes. Training on a stream, killed and resumed exactly:
tests/integration/test_chaos.py (make test's case streams the mixture)."""

from __future__ import annotations

import copy
import json
from itertools import islice, takewhile
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import main
from launcher.config.compose import compose_config
from launcher.data import preprocess, stream
from launcher.data.loading import collator, encode_splits
from launcher.data.tokenizer import load_tokenizer
from launcher.errors import ConfigError
from launcher.validation.validate import validate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(compose_config([]))


def head(source: Path, target: Path, rows: int) -> Path:
    lines = source.read_text().splitlines()[:rows]
    target.write_text("\n".join(lines) + "\n")
    return target


def ids(rows: Any) -> list[tuple[tuple[int, ...], ...]]:
    return [tuple(tuple(row[key]) for key in sorted(row)) for row in rows]


def test_a_stream_in_file_order_is_the_up_front_cache(tmp_path: Path, tokenizer: Any) -> None:
    """Packed, one source, shuffle_buffer=0: the same rows, the same collated batches."""
    sums = head(ROOT / "data" / "arith" / "train.jsonl", tmp_path / "sums.jsonl", 1500)
    overrides = [f"dataset.path={sums}", f"dataset.eval_path={ROOT / 'data/arith/eval.jsonl'}",
                 "dataset.packing=true", "dataset.max_length=128"]
    up_front, _ = encode_splits(compose_config(overrides), tokenizer, progress=False)
    cfg = compose_config([*overrides, "dataset.streaming=true", "dataset.shuffle_buffer=0"])
    rows = stream.train_rows(cfg, tokenizer)
    streamed = list(takewhile(lambda _: rows.epoch == 0, rows))  # one pass
    assert len(streamed) == len(up_front) > 100
    assert ids(streamed) == ids(up_front)
    collate = collator(tokenizer, packed=True)
    for start in range(0, 64, 8):  # the first batches as a Trainer draws them in order
        got, want = collate(streamed[start:start + 8]), collate(list(up_front)[start:start + 8])
        assert got.keys() == want.keys() == {"input_ids", "labels", "position_ids"}
        assert all((got[key] == want[key]).all() for key in got)


@pytest.fixture(scope="module")
def small_mix(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two sources (alpaca sums and chat reversals), 3:1, blocks of 64 rows."""
    tmp = tmp_path_factory.mktemp("stream")
    sums = head(ROOT / "data" / "arith" / "train.jsonl", tmp / "sums.jsonl", 300)
    chats = head(ROOT / "data" / "mix" / "chat.jsonl", tmp / "chats.jsonl", 150)
    return compose_config([
        f"dataset.sources=[{{path:{sums},weight:3}},{{path:{chats},format:chat,weight:1}}]",
        "dataset.streaming=true", "dataset.shuffle_buffer=64", "dataset.eval_fraction=0",
        f"dataset.cache_dir={tmp / 'cache'}", "train.max_steps=10"])


def test_a_stream_resumes_at_the_exact_row_across_passes(small_mix: Any, tokenizer: Any) -> None:
    """Chunks of 50 drawn rows: rows mid-chunk, at a chunk's start, at a pass's end."""
    def make(processes: int = 1) -> stream.StreamRows:
        return stream.StreamRows(lambda epoch: stream.drawn_rows(small_mix, epoch),
                                 stream.chunk_encoder(small_mix, tokenizer), 50, processes)

    rows = make()
    passes: dict[int, list] = {0: [], 1: []}
    for row in rows:  # endless: pass after pass, each in its own block order
        if rows.epoch == 2:
            break
        passes[rows.epoch].append(ids([row])[0])
    first, second = passes[0], passes[1]
    assert len(first) == len(second) > 300 and first != second
    everything = first + second
    for row in (0, 1, 37, 50, len(first) - 1, len(first), len(first) + 5, len(everything) - 1):
        state = json.loads(json.dumps(rows.state_before(row)))  # as the checkpoint holds it
        resumed = make()
        resumed.load(state)
        continued = [ids([r])[0] for r in islice(resumed, len(everything) - row)]
        assert continued == everything[row:], row
    # Tokenizing processes: the chunks ahead encoded apart, the same rows in the same order
    assert [ids([r])[0] for r in islice(make(processes=2), len(everything))] == everything
    # A pass under `stop` ends when the sums run out: ~300 / 0.75 examples, 1/4 chats.
    estimate = stream.estimate(small_mix, tokenizer)
    assert estimate["rows"] == pytest.approx(len(first), rel=0.03)
    assert [s["drawn"] for s in estimate["sources"]] == pytest.approx([300, 100], rel=0.03)


def test_blocks_are_shuffled_by_seed_and_keep_every_row() -> None:
    block = stream.shuffled_block("42-sums-0")
    batch = {"a": list(range(64)), "b": [str(i) for i in range(64)]}
    once, again = block(batch, list(range(64))), block(batch, list(range(64)))
    assert once == again and once["a"] != batch["a"] and sorted(once["a"]) == batch["a"]
    assert once["b"] == [str(i) for i in once["a"]]  # rows move whole
    assert block(batch, list(range(64, 128)))["a"] != once["a"]  # the next block: another order
    assert stream.shuffled_block("42-sums-1")(batch, list(range(64)))["a"] != once["a"]


def test_preprocess_estimates_a_pass_and_caches_only_the_eval_set(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture,
) -> None:
    cfg = compose_config([
        "dataset=mix", "dataset.streaming=true", f"dataset.cache_dir={tmp_path}",
        f"dataset.eval_path={ROOT / 'data/arith/eval.jsonl'}", "dataset.packing=true",
        "dataset.max_length=128"])
    directory = preprocess.data_dir(cfg)
    prepared = preprocess.ensure_prepared(cfg, directory, tokenizer, progress=False)
    assert prepared.streamed and prepared.train == "" and Path(prepared.eval).is_dir()
    assert {p.name for p in directory.iterdir()} == {"eval", "meta.json"}
    sources = {s["name"]: s for s in prepared.sources}
    assert sources["sums"]["rows"] == pytest.approx(7900, rel=0.02)  # from the file's size
    assert sources["differences"]["rows"] == 2000 and sources["reversals"]["rows"] == 1000
    # `stop`: the differences (2,000 at 30 %) end the pass
    assert sources["differences"]["drawn"] == 2000
    assert sum(s["drawn"] for s in sources.values()) == pytest.approx(6667, abs=2)
    assert 0.5 < prepared.fill <= 1 and prepared.rows < 6667  # packed rows hold examples
    shuffled = copy.deepcopy(cfg)
    shuffled.dataset.shuffle_buffer = 5
    assert preprocess.data_dir(shuffled) != directory  # the block order is in the key
    # `ftl estimate --count-tokens`: D from the sources' sizes, x the epochs (no max_steps)
    assert main(["estimate", "--count-tokens", "--json", "dataset=mix", "dataset.streaming=true",
                 f"dataset.cache_dir={tmp_path}", "dataset.packing=true", "train.epochs=2",
                 "dataset.max_length=128", f"dataset.eval_path={ROOT / 'data/arith/eval.jsonl'}"]
                ) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 2 * prepared.tokens


def test_what_a_stream_cannot_do_is_refused_before_launch(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    cfg = compose_config(["dataset=mix", "dataset.streaming=true", "parallel.sp=2",
                          "dataset.shuffle_buffer=-1", f"run.output_dir={tmp_path}"])
    notices = capsys.readouterr().err  # the preset's held-out share turned off, with one line
    assert "the preset's dataset.eval_fraction=0.05 turned off" in notices
    with pytest.raises(ConfigError) as refused:
        validate(cfg, "train")
    text = str(refused.value)
    for expected in ("train.max_steps=-1: dataset.streaming=true needs a step count",
                     "parallel.tp=1, parallel.sp=2: dataset.streaming=true",
                     "dataset.shuffle_buffer=-1"):
        assert expected in text, (expected, text)
    typed = compose_config(["dataset=mix", "dataset.streaming=true", "train.max_steps=4",
                            "dataset.eval_fraction=0.1", f"run.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="dataset.eval_fraction=0.1: a stream's share"):
        validate(typed, "train")
    pairs = compose_config(["dataset=prefs", "objective=dpo", "dataset.streaming=true",
                            "train.max_steps=4", f"run.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="preference pairs are tokenized up front"):
        validate(pairs, "preprocess")


def test_a_checkpoint_without_a_stream_position_is_not_resumed_as_a_stream(
        tmp_path: Path) -> None:
    from launcher.errors import DataError
    from launcher.rank.worker import continue_stream
    from launcher.rundir import write_stream_state

    class Rows:
        loaded: dict | None = None

        def load(self, state: dict) -> None:
            self.loaded = state

    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    with pytest.raises(DataError, match="holds no stream position .*resume it without "
                                        "dataset.streaming"):
        continue_stream(Rows(), checkpoint)
    state = {"epoch": 1, "rows": 64, "stream": {"any": 1}, "skip": 3}
    write_stream_state(checkpoint, state)
    rows = Rows()
    continue_stream(rows, checkpoint)
    assert rows.loaded == state
