"""Hydra compose: typos and wrong types fail at compose, every bad override at once."""

from __future__ import annotations

import json

import pytest

from launcher.config.compose import compose_config
from launcher.errors import ConfigError


def compose_problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        compose_config(overrides)
    return caught.value.problems


def test_unknown_group_option_lists_available_ones() -> None:
    (message,) = compose_problems(["model=llama-8b"])
    assert "model=llama-8b: no such model" in message
    for option in ("llama-7b", "llama-13b", "llama-70b", "mistral-7b", "qwen2.5-7b", "tiny-llama"):
        assert option in message


def test_unknown_key_names_the_section_and_known_keys() -> None:
    (message,) = compose_problems(["train.lrr=1e-5"])
    assert "train.lrr=1e-5: unknown key 'lrr' in train" in message
    assert "micro_batch_size" in message


def test_added_key_is_refused_too() -> None:
    (message,) = compose_problems(["+train.extra=1"])
    assert "unknown key 'extra' in train" in message
    (nested,) = compose_problems(["+cluster.slurm.zzz=1"])
    assert "unknown key 'zzz' in cluster.slurm" in nested


def test_wrong_type_names_key_and_type() -> None:
    (message,) = compose_problems(["train.micro_batch_size=1.5"])
    assert "train.micro_batch_size=1.5" in message and "integer" in message


def test_all_bad_overrides_are_collected() -> None:
    problems = compose_problems(["train.lrr=1", "strategy=zero9", "train.lr=abc", "model=llama-7b"])
    assert len(problems) == 3
    text = "\n".join(problems)
    assert "train.lrr=1" in text and "strategy=zero9" in text and "train.lr=abc" in text


def test_overrides_reach_the_typed_config() -> None:
    cfg = compose_config(["model=llama-7b", "strategy=zero3", "train.lr=1e-5", "cluster.nodes=2",
                          "cluster.gpus_per_node=8"])
    assert cfg.model.hidden_size == 4096
    assert cfg.strategy.zero_stage == 3
    assert cfg.train.lr == pytest.approx(1e-5)
    assert cfg.world_size == 16


def test_local_paths_become_absolute() -> None:
    cfg = compose_config([])
    assert cfg.dataset.path.startswith("/") and cfg.dataset.path.endswith("train.jsonl")
    assert cfg.run.output_dir.startswith("/")


def test_own_data_is_evaluated_on_a_share_of_itself_not_on_the_groups_eval_file(
    tmp_path, capsys
) -> None:
    from launcher.data.loading import split_records

    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(40)]
    mine = tmp_path / "my.jsonl"
    mine.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = compose_config([f"dataset.path={mine}"])  # the default group arith has an eval file
    assert cfg.dataset.eval_path == "" and cfg.dataset.eval_fraction == 0.05
    notice = capsys.readouterr().err
    assert "evaluating on 5% of my.jsonl (dataset.eval_fraction=0.05)" in notice
    assert "data/arith/eval.jsonl" in notice and "dataset.eval_path=FILE" in notice
    # Not overridden, or an eval file given too: that eval file stays, and nothing is said.
    assert compose_config([]).dataset.eval_path.endswith("data/arith/eval.jsonl")
    both = compose_config([f"dataset.path={mine}", f"dataset.eval_path={mine}"])
    assert both.dataset.eval_path == str(mine)
    assert capsys.readouterr().err == ""
    train, held_out, _ = split_records(cfg)
    assert held_out is not None and len(held_out) == 2 and len(train) == 38
    assert set(held_out["instruction"]) < {row["instruction"] for row in rows}


def test_a_presets_evaluation_turns_off_with_one_line_when_there_is_no_eval_set(
    tmp_path, capsys
) -> None:
    """tiny-llama's demo evaluates (eval_steps=50, eval_on_start, show_examples=200); with
    dataset.eval_fraction=0 and no eval file that is a preset's choice not fitting the data:
    off, one line naming each and why. A typed value stays (rules._eval refuses it)."""
    mine = tmp_path / "my.jsonl"
    mine.write_text('{"instruction": "1+1", "output": "2"}\n')
    cfg = compose_config([f"dataset.path={mine}", "dataset.eval_fraction=0"])
    train = cfg.train
    assert (train.eval_steps, train.eval_on_start, train.show_examples) == (0, False, 0)
    lines = [line for line in capsys.readouterr().err.splitlines() if "turned off" in line]
    assert lines == [
        "ftl: no eval set (dataset.eval_fraction=0 and no dataset.eval_path): the preset's "
        "train.eval_steps=50, train.eval_on_start=true, train.show_examples=200 turned off, "
        "with nothing to evaluate on. To evaluate, set dataset.eval_fraction (e.g. 0.05) or "
        "dataset.eval_path=FILE."]
    typed = compose_config(["dataset.eval_path=", "dataset.eval_fraction=0",
                            "train.show_examples=5", "++train.eval_on_start=true"])
    assert (typed.train.eval_steps, typed.train.eval_on_start,
            typed.train.show_examples) == (0, True, 5)
    assert "the preset's train.eval_steps=50 turned off" in capsys.readouterr().err
    # With an eval set (the default's file, or a share of the data) nothing changes.
    for overrides in ([], ["dataset.eval_path=", "dataset.eval_fraction=0.1"]):
        kept = compose_config(overrides).train
        assert (kept.eval_steps, kept.eval_on_start, kept.show_examples) == (50, True, 200)
    assert "turned off" not in capsys.readouterr().err
