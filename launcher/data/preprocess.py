"""Tokenize once: rows -> encoded (and packed) datasets, cached on disk by content.

The directory is `<dataset.cache_dir or $FTL_CACHE_DIR/data>/<name>-<key>` (FTL_CACHE_DIR
defaults to ~/.cache/ftlaunch); `data_key` hashes the data and tokenizer files, every dataset
setting that changes the result and VERSION without importing `datasets` or `transformers`
(validation computes it, the plan records it). Per user, not per output dir: keyed by
content, sharing is sound, and a new output dir does not pay 3-4 s for the bundled data.
Who builds it: docs/guide.md, "Data". Inside: train/ and eval/ (`save_to_disk`:
input_ids, labels and, packed, position_ids; format preference: prompt_ids, chosen_ids and
rejected_ids) and meta.json (`Prepared`, and who built it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config.compose import cache_home, local_or_as_is
from launcher.data import mixture
from launcher.data.encode import BUILTIN_CHAT_TEMPLATE, IGNORE_INDEX
from launcher.data.tokenizer import load_tokenizer
from launcher.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

    from launcher.config.schema import RunConfig

VERSION = 1
"""Bump when the encoding changes what a cached directory holds."""
META = "meta.json"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja",
    "chat_template.json",
)
"""The files of a local tokenizer dir that decide its ids (never the model weights)."""


@dataclass(frozen=True)
class Prepared:
    """One cached preprocessing result (`ftl preprocess --json` prints these fields): the
    train set's rows, its tokens, the trained ones among them, and how full its rows are
    (tokens / (rows x dataset.max_length)). Format preference: a row is a pair, run as two
    sequences (prompt + chosen, prompt + rejected), so its tokens are 2 x prompt + chosen +
    rejected (the estimator's D), the trained ones chosen + rejected, and the fill is
    tokens / (2 x rows x dataset.max_length)."""

    train: str
    eval: str | None
    rows: int
    tokens: int
    trained_tokens: int
    fill: float
    cached: bool
    sources: list[dict[str, Any]] = field(default_factory=list)
    """A mixture's sources, each: name, path, revision, weight, share (the weight's), rows
    and tokens (its own train split), drawn (its examples in the mixture) and drawn_share;
    empty for one dataset."""
    streamed: bool = False
    """dataset.streaming: no train set on disk (the ranks tokenize it as they read it); rows,
    tokens and fill are one pass's, estimated from the sources' sizes (stream.estimate)."""


# ---------------------------------------------------------------------------- the key


def data_dir(cfg: RunConfig) -> Path:
    """Where this config's tokenized data lives (whether built yet or not)."""
    root = Path(cfg.dataset.cache_dir) if cfg.dataset.cache_dir else cache_home() / "data"
    return root.resolve() / f"{cfg.dataset.name}-{data_key(cfg)[:16]}"


def data_key(cfg: RunConfig) -> str:
    """sha256 of everything that changes the tokenized result: of a mixture, its sources'
    keys and what draws from them (not their tokens again)."""
    data = cfg.dataset
    if data.sources:
        settings: dict[str, Any] = {
            "version": VERSION, "exhausted": data.exhausted, "seed": cfg.train.seed,
            "packing": data.packing, "max_length": data.max_length,
            "sources": [(name, data_key(one), source.weight) for name, one, source in
                        zip(mixture.labels(cfg), mixture.source_configs(cfg), data.sources,
                            strict=True)],
            "eval": data_key(mixture.eval_file_config(cfg)) if data.eval_path else None,
        }
        if data.streaming:
            settings["streaming"] = True
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    settings = {
        "version": VERSION, "format": data.format, "columns": asdict(data.columns),
        "template": data.template, "builtin": BUILTIN_CHAT_TEMPLATE,
        "max_length": data.max_length, "packing": data.packing, "mask_prompt": data.mask_prompt,
        "eval_fraction": data.eval_fraction if not data.eval_path else None,
        "seed": cfg.train.seed if not data.eval_path and data.eval_fraction else None,
        "train": (_stream_digest if data.streaming else _source_digest)(data.path),
        "eval": _source_digest(data.eval_path),
        "tokenizer": _tokenizer_digest(cfg.model.tokenizer or cfg.model.path),
    }
    if data.streaming:
        settings["streaming"] = {"shuffle_buffer": data.shuffle_buffer, "seed": cfg.train.seed}
    hub = {"subset": data.subset, "split": data.split, "revision": data.revision}
    if hub != {"subset": "", "split": "train", "revision": ""}:  # older keys stay as they were
        settings["hub"] = hub
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _source_digest(path: str) -> str:
    local = Path(local_or_as_is(path))
    # A hub id (or no file): its name, the hub has no content hash to read offline.
    return _file_digest(local) if path and local.is_file() else path


def _stream_digest(path: str) -> str:
    """A streamed file by size and modification time: hashing a corpus too large to
    tokenize up front would cost minutes at every plan."""
    local = Path(local_or_as_is(path))
    if not local.is_file():
        return path
    stat = local.stat()
    return f"{local.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _tokenizer_digest(source: str) -> str:
    local = Path(local_or_as_is(source))
    if not local.is_dir():
        return source
    files = sorted(p for p in local.iterdir() if p.name in TOKENIZER_FILES)
    return json.dumps({p.name: _file_digest(p) for p in files})


# ---------------------------------------------------------------------------- the cache


def read_prepared(directory: Path) -> Prepared | None:
    """The figures of a complete cache directory, None when it is not (yet) there."""
    meta = directory / META
    if not meta.is_file():
        return None
    fields = json.loads(meta.read_text())["prepared"]
    return Prepared(**{**fields, "cached": True})


def ensure_prepared(
    cfg: RunConfig, directory: Path, tokenizer: Any = None, progress: bool = True,
    builder: str = "ftl",
) -> Prepared:
    """The cached result, else built now (loading the tokenizer if not given) into a
    temporary sibling that is renamed into place: complete or absent. A mixture builds
    each source's own cache first (or finds it), then draws from them."""
    found = read_prepared(directory)
    if found is not None:
        return found
    # The key, not the root: a rank may see the user's cache under another HOME than the
    # `ftl` process that planned the directory; the plan's location is the one to build.
    if data_dir(cfg).name != directory.name:
        raise DataError(
            f"the data files or the tokenizer changed since this run was planned (expected "
            f"tokenized data in {directory}); plan the run again (`ftl train`/`ftl submit`)"
        )
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg)
    if cfg.dataset.streaming:
        return _staged(directory, builder,
                       lambda staging: _streamed(cfg, staging, directory, tokenizer, progress))
    if not cfg.dataset.sources:
        return _staged(directory, builder,
                       lambda staging: _encoded(cfg, staging, directory, tokenizer, progress))
    parts = [_source(one, tokenizer, progress, builder)
             for one in mixture.source_configs(cfg)]
    held = _source(mixture.eval_file_config(cfg), tokenizer, progress, builder
                   ) if cfg.dataset.eval_path else None
    return _staged(directory, builder,
                   lambda staging: _mixed(cfg, staging, directory, parts, held))


def _source(cfg: RunConfig, tokenizer: Any, progress: bool, builder: str) -> Prepared:
    """One source of a mixture, tokenized (unpacked) into its own cache directory."""
    directory = data_dir(cfg)
    return read_prepared(directory) or _staged(
        directory, builder,
        lambda staging: _encoded(cfg, staging, directory, tokenizer, progress, whole=False))


def _staged(directory: Path, builder: str, build: Callable[[Path], Prepared]) -> Prepared:
    """`build(staging)` writes the data into a temporary sibling of `directory` and returns
    its figures; meta.json is written and the sibling renamed into place (a concurrent
    build of the same key may win the rename: its result is then the one)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(f".{directory.name}.{socket.gethostname()}.{os.getpid()}")
    try:
        prepared = build(staging)
        meta = {"prepared": asdict(prepared),
                "built_by": f"{builder} ({socket.gethostname()} pid {os.getpid()})",
                "built_at": time.time()}
        (staging / META).write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(staging, directory)
    except OSError:
        if (directory / META).is_file():  # another process finished the same build first
            return read_prepared(directory)  # type: ignore[return-value]
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return prepared


def _encoded(cfg: RunConfig, staging: Path, directory: Path, tokenizer: Any, progress: bool,
             whole: bool = True) -> Prepared:
    """One dataset encoded into `staging`; `whole`: it is the training set (it must fill
    one global batch), not one source of a mixture."""
    from launcher.data.loading import encode_splits

    train, evaluation = encode_splits(cfg, tokenizer, progress, whole=whole)
    train.save_to_disk(str(staging / "train"))
    if evaluation is not None:
        evaluation.save_to_disk(str(staging / "eval"))
    return _figures(cfg, directory, train, evaluation is not None)


def _streamed(cfg: RunConfig, staging: Path, directory: Path, tokenizer: Any,
              progress: bool) -> Prepared:
    """A streaming run's cache: its eval set (dataset.eval_path, tokenized now) and a pass's
    figures, estimated."""
    from launcher.data import stream
    from launcher.data.loading import encode_splits, pack

    staging.mkdir()
    if cfg.dataset.eval_path:
        evaluation, _ = encode_splits(mixture.eval_file_config(cfg), tokenizer, progress,
                                      whole=False)
        if cfg.dataset.packing:
            evaluation = pack(evaluation, cfg.dataset.max_length)
        evaluation.save_to_disk(str(staging / "eval"))
    figures = stream.estimate(cfg, tokenizer)
    return Prepared(
        train="", eval=str(directory / "eval") if cfg.dataset.eval_path else None,
        rows=figures["rows"], tokens=figures["tokens"], trained_tokens=figures["trained_tokens"],
        fill=figures["fill"], cached=False, sources=figures["sources"], streamed=True)


def _mixed(cfg: RunConfig, staging: Path, directory: Path, parts: list[Prepared],
           held: Prepared | None) -> Prepared:
    """The mixture drawn from its sources' caches into `staging` (packed as a whole with
    dataset.packing), its index beside it; the figures name each source's draw."""
    from datasets import Dataset, concatenate_datasets, load_from_disk

    from launcher.data.loading import check_batch, pack

    data = cfg.dataset
    trains = [load_from_disk(part.train) for part in parts]
    drawn, rows = mixture.mixture_index([len(t) for t in trains],
                                        [s.weight for s in data.sources], cfg.train.seed,
                                        data.exhausted)
    starts = [sum(len(t) for t in trains[:index]) for index in range(len(trains))]
    train = concatenate_datasets(trains).select(
        [starts[source] + row for source, row in zip(drawn, rows, strict=True)])
    evals = [load_from_disk(p.eval) for p in parts if p.eval] if held is None else [
        load_from_disk(held.train)]
    evaluation = concatenate_datasets(evals) if evals else None
    if data.packing:
        train = pack(train, data.max_length)
        evaluation = pack(evaluation, data.max_length) if evaluation is not None else None
    check_batch(cfg, len(train), f"the mixture of {', '.join(mixture.labels(cfg))}")
    train.save_to_disk(str(staging / "train"))
    if evaluation is not None:
        evaluation.save_to_disk(str(staging / "eval"))
    Dataset.from_dict({"source": drawn, "row": rows}).save_to_disk(str(staging / "index"))
    figures = _figures(cfg, directory, train, evaluation is not None)
    return Prepared(**{**asdict(figures), "sources": _drawn(cfg, parts, drawn)})


def _drawn(cfg: RunConfig, parts: list[Prepared], drawn: list[int]) -> list[dict[str, Any]]:
    counts = [drawn.count(index) for index in range(len(parts))]
    return mixture.source_figures(cfg, [part.rows for part in parts],
                                  [part.tokens for part in parts], counts,
                                  [count / max(1, len(drawn)) for count in counts])


def _figures(cfg: RunConfig, directory: Path, train: Dataset, has_eval: bool) -> Prepared:
    import pyarrow.compute as pc

    table = train.with_format("arrow")[:]

    def count(column: str) -> int:
        return int(pc.sum(pc.list_value_length(table[column])).as_py() or 0)

    rows = len(train)
    if "prompt_ids" in table.column_names:  # preference pairs
        # tokens the model runs: prompt + chosen and prompt + rejected, the estimator's D
        trained = count("chosen_ids") + count("rejected_ids")
        tokens, sequences = 2 * count("prompt_ids") + trained, 2 * rows
    else:
        labels = pc.list_flatten(table["labels"])
        trained = int(pc.sum(pc.not_equal(labels, IGNORE_INDEX).cast("int64")).as_py() or 0)
        tokens, sequences = count("input_ids"), rows
    return Prepared(
        train=str(directory / "train"), eval=str(directory / "eval") if has_eval else None,
        rows=rows, tokens=tokens, trained_tokens=trained,
        fill=round(tokens / (sequences * cfg.dataset.max_length), 4), cached=False,
    )


def wait_for(directory: Path, timeout_s: float, failed: Callable[[], str | None]) -> Prepared:
    """Poll for another process's build; `failed()` names a failure that ends the wait."""
    deadline = time.monotonic() + timeout_s
    while (prepared := read_prepared(directory)) is None:
        if (reason := failed()) is not None:
            raise DataError(f"rank 0 failed while preparing the data: {reason}")
        if time.monotonic() > deadline:
            raise DataError(
                f"no tokenized data in {directory} after {timeout_s:.0f} s of waiting for "
                "rank 0. Fix: raise dataset.wait_timeout_s, or run `ftl preprocess` with the "
                "same overrides first (the directory must be on storage every node sees)"
            )
        time.sleep(1.0)
    return prepared


def rank_datasets(
    cfg: RunConfig, directory: Path, tokenizer: Any, rank: int, rank0_error: Path
) -> tuple[Dataset, Dataset | None]:
    """This rank's train and eval sets: rank 0 builds them when nobody has (before any
    process group exists), the others wait for rank 0's directory or its error file."""
    if rank == 0:
        prepared = ensure_prepared(cfg, directory, tokenizer, progress=False, builder="rank 0")
        done = "found" if prepared.cached else "tokenized"
        what = (f"streaming ~{prepared.rows} rows, ~{prepared.tokens} tokens a pass (estimated; "
                f"{done} {directory})" if prepared.streamed else
                f"{done} {prepared.rows} rows, {prepared.tokens} tokens in {directory}")
        print(f"[ftl] rank 0: {what}", flush=True)
    else:
        prepared = wait_for(directory, cfg.dataset.wait_timeout_s,
                            failed=lambda: _last_line(rank0_error))
    from datasets import load_from_disk  # mapped, not read: the ranks share the page cache

    evaluation = load_from_disk(prepared.eval) if prepared.eval else None
    if cfg.dataset.streaming:
        from launcher.data.stream import train_rows

        return train_rows(cfg, tokenizer), evaluation
    return load_from_disk(prepared.train), evaluation


def _last_line(path: Path) -> str | None:
    if not path.is_file():
        return None
    lines = path.read_text().strip().splitlines()
    return f"{lines[-1] if lines else 'unknown error'} (see {path})"
