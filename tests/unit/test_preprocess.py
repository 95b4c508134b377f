"""launcher/data/preprocess.py and `ftl preprocess`: tokenize once, cache by content, rank 0
builds while the others wait, bad data ends with exit 2 and nothing cached."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.data import preprocess
from launcher.errors import DataError
from tests.integration.runs import ftl_here

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "assets" / "tokenizer"
BUNDLED = ROOT / "data" / "arith"


class CountingTokenizer:
    """The bundled tokenizer, counting how many texts it encodes."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        self.inner = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
        self.texts = 0

    def __call__(self, texts: list[str], **kwargs: Any) -> Any:
        self.texts += len(texts)
        return self.inner(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def small_data(tmp_path: Path, rows: int = 64) -> Path:
    lines = (BUNDLED / "train.jsonl").read_text().splitlines()[:rows]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def config(tmp_path: Path, data: Path, *extra: str) -> Any:
    return compose_config([
        f"dataset.path={data}", "dataset.eval_path=", "dataset.eval_fraction=0.1",
        f"run.output_dir={tmp_path / 'out'}", "cluster.gpus_per_node=2", private_cache(tmp_path),
        *extra,
    ])


def private_cache(tmp_path: Path) -> str:
    """This test's own cache (the default one is shared by every run of the user, so a
    build a test expects would be found there from an earlier test run)."""
    return f"dataset.cache_dir={tmp_path / 'out' / '.data'}"


ftl = ftl_here  # `ftl ARGS` in this process (tests/integration/runs.py)


def test_second_run_tokenizes_nothing(tmp_path):
    cfg = config(tmp_path, small_data(tmp_path))
    directory = preprocess.data_dir(cfg)
    tokenizer = CountingTokenizer()
    first = preprocess.ensure_prepared(cfg, directory, tokenizer, progress=False)
    assert not first.cached and tokenizer.texts == 64  # 58 train rows + 6 held out
    again = CountingTokenizer()
    second = preprocess.ensure_prepared(cfg, directory, again, progress=False)
    assert second.cached and again.texts == 0
    assert (second.rows, second.tokens, second.train) == (first.rows, first.tokens, first.train)


def test_key_changes_with_a_data_line_the_tokenizer_and_the_settings(tmp_path):
    data = small_data(tmp_path)
    base = preprocess.data_dir(config(tmp_path, data))
    assert preprocess.data_dir(config(tmp_path, data)) == base  # deterministic
    assert preprocess.data_dir(config(tmp_path, data, "dataset.packing=true")) != base
    assert preprocess.data_dir(config(tmp_path, data, "dataset.max_length=48")) != base
    lines = data.read_text().splitlines()
    lines[10] = lines[10].replace('"output": "', '"output": "9')
    data.write_text("\n".join(lines) + "\n")
    assert preprocess.data_dir(config(tmp_path, data)) != base
    data.write_text("\n".join(lines[:10] + lines[11:]) + "\n")
    edited = preprocess.data_dir(config(tmp_path, data))
    tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER_DIR, tok)
    assert preprocess.data_dir(config(tmp_path, data, f"model.tokenizer={tok}")) == edited
    settings = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": "x"}))
    assert preprocess.data_dir(config(tmp_path, data, f"model.tokenizer={tok}")) != edited


def test_ftl_preprocess_json_twice(tmp_path):
    data = small_data(tmp_path)
    args = ["preprocess", "--json", f"dataset.path={data}", "dataset.eval_path=",
            "dataset.eval_fraction=0.1", f"run.output_dir={tmp_path}", "dataset.packing=true",
            f"dataset.cache_dir={tmp_path / '.data'}",
            "dataset.max_length=128", "train.micro_batch_size=2"]
    first = ftl(*args)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert set(result) == {"train", "eval", "rows", "tokens", "trained_tokens", "fill", "cached",
                           "sources", "streamed"}
    assert result["sources"] == []  # one dataset: no mixture
    assert result["cached"] is False and 0 < result["trained_tokens"] < result["tokens"]
    from datasets import load_from_disk

    train = load_from_disk(result["train"])
    assert set(train.column_names) == {"input_ids", "labels", "position_ids"}
    assert len(train) == result["rows"] < 58  # packed: several examples per row
    assert sum(len(r) for r in train["input_ids"]) == result["tokens"]
    assert set(load_from_disk(result["eval"]).column_names) >= {"input_ids", "labels"}
    meta = json.loads((Path(result["train"]).parent / "meta.json").read_text())
    second = ftl(*args)
    assert json.loads(second.stdout) == {**result, "cached": True}
    assert json.loads((Path(result["train"]).parent / "meta.json").read_text()) == meta


@pytest.mark.parametrize(("extra", "message"), [
    (["dataset.max_length=8"], "longer than dataset.max_length=8"),
    (["train.micro_batch_size=40"], "fewer than one global batch"),
])
def test_bad_data_exits_2_and_caches_nothing(tmp_path, extra, message):
    data = small_data(tmp_path)
    run = ftl("preprocess", f"dataset.path={data}", "dataset.eval_path=",
              "dataset.eval_fraction=0.1", f"run.output_dir={tmp_path / 'out'}",
              "cluster.gpus_per_node=2", private_cache(tmp_path), *extra)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and str(data) in run.stderr
    cache = tmp_path / "out" / ".data"
    assert not cache.exists() or not any(cache.iterdir())


def test_ftl_train_with_bad_data_writes_no_run_dir(tmp_path):
    data = small_data(tmp_path)
    run = ftl("train", f"dataset.path={data}", "dataset.eval_path=",
              "dataset.eval_fraction=0.1", f"run.output_dir={tmp_path / 'out'}",
              "dataset.max_length=8", private_cache(tmp_path))
    assert run.returncode == 2 and "dataset.max_length=8" in run.stderr, run.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] in ([], [".data"])
    assert not any((tmp_path / "out" / ".data").glob("*"))


def test_waiting_rank_gets_rank_0s_build(tmp_path):
    cfg = config(tmp_path, small_data(tmp_path))
    directory = preprocess.data_dir(cfg)
    error_file = tmp_path / "rank0.error"
    got: dict[str, Any] = {}

    def rank_1() -> None:
        try:
            got["sets"] = preprocess.rank_datasets(cfg, directory, None, 1, error_file)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            got["error"] = error

    waiter = threading.Thread(target=rank_1)
    waiter.start()
    train, evaluation = preprocess.rank_datasets(cfg, directory, CountingTokenizer(), 0,
                                                 error_file)
    waiter.join(timeout=600)
    assert "sets" in got, got.get("error", "rank 1 still waiting")
    other_train, other_eval = got["sets"]
    assert len(other_train) == len(train) and len(other_eval) == len(evaluation)
    assert all(other_train[i] == train[i] for i in range(len(train)))
    assert "rank 0" in json.loads((directory / "meta.json").read_text())["built_by"]


def test_wait_ends_on_rank_0_failure_and_on_timeout(tmp_path):
    error_file = tmp_path / "rank0.error"
    error_file.write_text("Traceback ...\nDataError: bad row 7\n")
    with pytest.raises(DataError, match="rank 0 failed .*bad row 7"):
        preprocess.wait_for(tmp_path / "never", 60, lambda: preprocess._last_line(error_file))
    with pytest.raises(DataError, match="dataset.wait_timeout_s"):
        preprocess.wait_for(tmp_path / "never", 0.0, lambda: None)


def test_a_run_planned_on_other_data_is_refused(tmp_path):
    data = small_data(tmp_path)
    cfg = config(tmp_path, data)
    planned = preprocess.data_dir(cfg)
    data.write_text(data.read_text().replace('"output": "', '"output": "0', 1))
    with pytest.raises(DataError, match="changed since this run was planned"):
        preprocess.ensure_prepared(cfg, planned, CountingTokenizer(), progress=False)


def test_default_cache_is_one_per_user_not_per_output_dir(tmp_path, monkeypatch):
    """A new output dir finds the data another output dir tokenized (the key is the content)."""
    monkeypatch.setenv("FTL_CACHE_DIR", str(tmp_path / "user-cache"))
    data = small_data(tmp_path)
    one, two = (compose_config([f"dataset.path={data}", f"run.output_dir={tmp_path / out}"])
                for out in ("a", "b"))
    assert preprocess.data_dir(one) == preprocess.data_dir(two)
    assert preprocess.data_dir(one).parent == tmp_path / "user-cache" / "data"


def test_a_rank_builds_where_the_plan_says_under_another_root(tmp_path):
    """The planned location stands when the rank's own default root differs (another HOME
    on a compute node): only a different key means the data changed."""
    cfg = config(tmp_path, small_data(tmp_path))
    planned = tmp_path / "elsewhere" / preprocess.data_dir(cfg).name
    built = preprocess.ensure_prepared(cfg, planned, CountingTokenizer(), progress=False)
    assert not built.cached and built.train == str(planned / "train")


def test_several_tokenizing_processes_give_the_same_data(tmp_path):
    data = small_data(tmp_path)
    one = config(tmp_path, data, f"dataset.cache_dir={tmp_path / 'one'}", "dataset.num_proc=1")
    two = config(tmp_path, data, f"dataset.cache_dir={tmp_path / 'two'}", "dataset.num_proc=2")
    from datasets import load_from_disk

    built = [preprocess.ensure_prepared(c, preprocess.data_dir(c), progress=False)
             for c in (one, two)]
    assert Path(built[0].train).parent.name == Path(built[1].train).parent.name  # same key
    first, second = (load_from_disk(b.train) for b in built)
    assert first["input_ids"] == second["input_ids"] and first["labels"] == second["labels"]


def test_ftl_preprocess_without_an_eval_set_turns_the_presets_evaluation_off(tmp_path):
    """The issue's command: the default model's preset evaluates every 50 steps and shows
    200 examples, keys the user never typed; preprocessing evaluates nothing."""
    data = small_data(tmp_path)
    run = ftl("preprocess", "--json", f"dataset.path={data}", "dataset.eval_fraction=0",
              private_cache(tmp_path))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["eval"] is None
    notices = [line for line in run.stderr.splitlines() if "turned off" in line]
    assert len(notices) == 1, run.stderr
    assert "train.eval_steps=50" in notices[0] and "train.show_examples=200" in notices[0]
