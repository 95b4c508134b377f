"""A mixture of datasets (dataset.sources; launcher/data/mixture.py, preprocess.py): drawn
by weight into a seeded, recorded index, each source tokenized and cached on its own (a
new weight re-tokenizes nothing), `ftl preprocess` showing every source's share, bad
sources refused together before anything is built, and hub datasets by name pinned to
their commit and read offline from a datasets cache the test prepares. Training on the
mixture, stopped and resumed exactly: tests/integration/test_sequence_parallel.py."""

from __future__ import annotations

import copy
import shutil
from collections import Counter
from collections.abc import Callable
from itertools import takewhile
from pathlib import Path
from typing import Any

import pytest
from test_preprocess import CountingTokenizer

from launcher.config.compose import compose_config
from launcher.data import preprocess, stream
from launcher.data.tokenizer import load_tokenizer
from launcher.errors import ConfigError, DataError
from launcher.validation.validate import validate

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = {"sums": 0.6, "differences": 0.3, "reversals": 0.1}
"""configs/dataset/mix.yaml's."""


def mix(tmp_path: Path, *extra: str) -> Any:
    return compose_config(["dataset=mix", f"dataset.cache_dir={tmp_path / 'cache'}",
                           f"run.output_dir={tmp_path / 'out'}", *extra])


def drawn(directory: Path) -> Counter[int]:
    from datasets import load_from_disk

    return Counter(load_from_disk(str(directory / "index"))["source"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, preprocess.Prepared, int]:
    """The mix preset prepared once: (tmp dir, config, figures, texts tokenized)."""
    tmp = tmp_path_factory.mktemp("mix")
    cfg = mix(tmp)
    tokenizer = CountingTokenizer()
    prepared = preprocess.ensure_prepared(cfg, preprocess.data_dir(cfg), tokenizer,
                                          progress=False)
    return tmp, cfg, prepared, tokenizer.texts


def test_the_mixture_draws_each_source_by_its_weight_and_records_it(built) -> None:
    tmp, cfg, prepared, texts = built
    assert texts == 7900 + 2000 + 1000  # every source tokenized once, its held-out rows too
    counts = drawn(preprocess.data_dir(cfg))
    total = sum(counts.values())
    assert total == prepared.rows  # unpacked: one training row per drawn example
    for index, (name, weight) in enumerate(WEIGHTS.items()):
        assert counts[index] / total == pytest.approx(weight, abs=0.02), (name, counts)
    sources = {s["name"]: s for s in prepared.sources}
    assert list(sources) == list(WEIGHTS)
    assert sources["differences"]["rows"] == 1900  # 2,000 less its 5 % held out
    # stop: the epoch ends with the first source that runs out, here the differences
    assert sources["differences"]["drawn"] == 1900
    assert all(s["drawn"] <= s["rows"] for s in sources.values())  # nothing repeats
    assert sum(s["drawn"] for s in sources.values()) == total
    from datasets import load_from_disk

    held = load_from_disk(prepared.eval)  # each source's own 5 %, together
    assert len(held) == 395 + 100 + 50


def test_a_new_weight_draws_again_and_tokenizes_nothing(built) -> None:
    tmp, cfg, prepared, _ = built
    again = CountingTokenizer()
    reweighted = mix(tmp, "dataset.sources.2.weight=0.3")
    directory = preprocess.data_dir(reweighted)
    assert directory != preprocess.data_dir(cfg)
    figures = preprocess.ensure_prepared(reweighted, directory, again, progress=False)
    assert again.texts == 0 and not figures.cached  # a new mixture of the cached sources
    counts = drawn(directory)
    assert counts[2] / sum(counts.values()) == pytest.approx(0.3 / 1.2, abs=0.02)
    assert preprocess.ensure_prepared(cfg, preprocess.data_dir(cfg), again).cached


def test_repeat_draws_every_source_whole_and_repeats_the_small_ones(built) -> None:
    tmp, _, _, _ = built
    cfg = mix(tmp, "dataset.exhausted=repeat", "dataset.packing=true")
    prepared = preprocess.ensure_prepared(cfg, preprocess.data_dir(cfg), CountingTokenizer(),
                                          progress=False)
    sources = {s["name"]: s for s in prepared.sources}
    assert all(s["drawn"] >= s["rows"] for s in sources.values()), sources
    assert sources["differences"]["drawn"] > 1.5 * sources["differences"]["rows"]
    total = sum(s["drawn"] for s in sources.values())
    assert prepared.rows < total and prepared.fill > 0.5  # packed: several per row


def test_ftl_preprocess_prints_every_source(built, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.cli import main

    tmp, _, prepared, _ = built
    monkeypatch.chdir(ROOT)
    assert main(["preprocess", "dataset=mix", f"dataset.cache_dir={tmp / 'cache'}"]) == 0
    out = capsys.readouterr().out
    assert f"already cached: {prepared.rows} rows" in out
    header, *rows = [line.split() for line in out.splitlines()[1:5]]
    assert header == ["source", "rows", "tokens", "weight", "share", "drawn", "drawn", "%"]
    assert [row[0] for row in rows] == list(WEIGHTS)
    assert [row[4] for row in rows] == ["60.0%", "30.0%", "10.0%"]
    assert rows[1][1] == rows[1][5] == "1900"


def test_bad_sources_are_refused_together_before_anything_is_built(tmp_path: Path) -> None:
    alpaca_rows = tmp_path / "sums.jsonl"
    shutil.copy(ROOT / "data" / "arith" / "eval.jsonl", alpaca_rows)
    sources = ("dataset.sources=["
               f"{{path:{alpaca_rows},weight:0}},"
               f"{{path:{alpaca_rows},format:chat,name:chats}},"
               f"{{path:{ROOT / 'data' / 'prefs' / 'eval.jsonl'},format:preference}},"
               f"{{path:{tmp_path / 'gone.jsonl'},format:tabular,name:'a/b'}}]")
    cfg = compose_config([sources, "dataset.exhausted=sometimes",
                          f"dataset.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(ConfigError) as refused:
        validate(cfg, "preprocess")
    text = str(refused.value)
    for expected in (
        "dataset.exhausted=sometimes: not one of stop, repeat",
        "dataset.sources.0.weight=0.0: a source's share of the mixture",
        "dataset.sources.3.format=tabular: not one of",
        "dataset.sources.3.name='a/b'",
        "dataset.sources: preference pairs mixed with alpaca, chat, tabular rows",
    ):
        assert expected in text, (expected, text)
    assert not (tmp_path / "cache").exists()
    fixed = compose_config([
        f"dataset.sources=[{{path:{alpaca_rows}}},{{path:{alpaca_rows},format:chat,name:chats}}]",
        f"dataset.cache_dir={tmp_path / 'cache'}", "cluster.gpus_per_node=1"])
    with pytest.raises(ConfigError) as rows:  # a file's rows that are not its format
        validate(fixed, "preprocess")
    first, *rest = rows.value.problems  # the first 10 lines, then a count
    assert first.startswith(f"dataset.sources.1.path={alpaca_rows}: {alpaca_rows}:1: field "
                            "'messages'"), first
    assert all(p.startswith("dataset.sources.1.path=") for p in rest), rest
    gone = compose_config([f"dataset.sources=[{{path:{tmp_path / 'gone.jsonl'}}}]",
                           "cluster.gpus_per_node=1"])
    with pytest.raises(ConfigError, match=r"dataset.sources.0.path=.*gone.jsonl: not found"):
        validate(gone, "preprocess")
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------- hub datasets by name

HUB_ID = "tiny-org/sums"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """An HF datasets cache holding HUB_ID's train split at COMMIT, as `load_dataset` leaves
    it where the hub was reachable (built here by datasets' own json builder), and the hub
    offline."""
    import datasets.config

    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def fill(rows_file: str) -> Path:
        from datasets import load_dataset_builder

        builder = load_dataset_builder("json", data_files={"train": rows_file},
                                       cache_dir=str(tmp_path / "build"))
        builder.download_and_prepare()
        built = Path(builder.cache_dir)
        target = cache / HUB_ID.replace("/", "___") / "default" / "0.0.0" / COMMIT
        target.mkdir(parents=True)
        for path in built.iterdir():
            name = path.name.replace("json-", f"{HUB_ID.split('/')[1]}-")
            shutil.copy(path, target / name)
        return target

    return fill


def test_a_cached_hub_dataset_loads_offline_pinned_to_its_commit(
    tmp_path: Path, hub_cache: Callable[[str], Path],
) -> None:
    hub_cache(str(ROOT / "data" / "arith" / "eval.jsonl"))
    cfg = compose_config([f"dataset.path={HUB_ID}", "dataset.eval_path=",
                          f"dataset.cache_dir={tmp_path / 'cache'}", "train.seed=3"])
    checked = validate(cfg, "preprocess")
    assert checked.cfg.dataset.revision == COMMIT  # what the run dir's config.yaml records
    prepared = preprocess.ensure_prepared(checked.cfg, checked.data_dir, progress=False)
    assert prepared.rows == 190  # the 200 rows, 5 % held out
    mixed = compose_config([f"dataset.sources=[{{path:{HUB_ID},weight:1}},"
                            f"{{path:data/mix/sub.jsonl,weight:1}}]",
                            f"dataset.cache_dir={tmp_path / 'cache'}"])
    checked = validate(mixed, "preprocess")
    assert [s.revision for s in checked.cfg.dataset.sources] == [COMMIT, ""]
    # Streamed: the pinned build read from the cache as it is drawn, offline
    streamed = copy.deepcopy(checked.cfg)
    streamed.dataset.streaming, streamed.dataset.eval_fraction = True, 0.0
    tokenizer = load_tokenizer(streamed)
    figures = preprocess.ensure_prepared(streamed, preprocess.data_dir(streamed), tokenizer,
                                         progress=False)
    assert [s["rows"] for s in figures.sources] == [200, 2000]  # the hub's exact
    rows = stream.train_rows(streamed, tokenizer)
    one_pass = list(takewhile(lambda _: rows.epoch == 0, rows))  # `stop`: ~2 x the hub's 200
    assert len(one_pass) == pytest.approx(400, rel=0.1) == figures.rows


def test_an_uncached_hub_dataset_is_refused_offline_with_the_fetch_command(
    tmp_path: Path, hub_cache: Callable[[str], Path],
) -> None:
    cfg = compose_config(["dataset.sources=[{path:nobody/nothing,subset:main,weight:1}]",
                          f"dataset.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(ConfigError) as refused:
        validate(cfg, "preprocess")
    (problem,) = refused.value.problems
    assert problem.startswith("dataset.sources.0.path=nobody/nothing: not in the HF cache")
    assert "datasets.load_dataset('nobody/nothing', name='main', split='train')" in problem
    from launcher.data.eval_tasks import hub_offline
    from launcher.data.hub import Coordinates, load_hub

    with hub_offline(), pytest.raises(DataError):  # a rank, offline, would say so too
        load_hub("nobody/nothing", Coordinates())



def test_the_held_out_rows_of_every_source_feed_examples_and_quantize(built) -> None:
    """train.show_examples asks the sources' held-out prompts in turn (each in its own
    format); `ftl quantize`'s perplexity reads every source's held-out rows."""
    from launcher.data.tokenizer import load_tokenizer
    from launcher.inference.examples import held_out_prompts
    from launcher.inference.quantize import eval_batches

    _, cfg, _, _ = built
    prompts = held_out_prompts(cfg, 500)  # 395 sums, 100 differences, then reversals
    assert len(prompts) == 500
    assert "+" in prompts[0][0][-1]["content"] and "-" in prompts[395][0][-1]["content"]
    last_turns, answer = prompts[-1]
    assert last_turns[-1]["content"].startswith("reverse ")
    assert answer == last_turns[-1]["content"].split()[1][::-1]
    batches = eval_batches(cfg, load_tokenizer(cfg))
    assert sum(len(batch["input_ids"]) for batch in batches) == 395 + 100 + 50
