"""Every config key has a doc, and `ftl keys` shows it with type, defaults and choices."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields, is_dataclass

import pytest

from launcher.cli import main
from launcher.config import schema
from launcher.config.hardware import GPU_PRESETS
from launcher.validation.keys import field_docs


def reached_fields(cls: type = schema.RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, class name, field name) of every field reached from RunConfig, walked
    here independently of launcher/validation/keys.py."""
    found = []
    for f in fields(cls):
        found.append((prefix + f.name, cls.__name__, f.name))
        nested = f.default_factory() if callable(f.default_factory) else None
        item = re.fullmatch(r"list\[(\w+)\]", str(f.type))  # a list of sections
        if is_dataclass(nested):
            found += reached_fields(type(nested), prefix + f.name + ".")
        elif item and is_dataclass(getattr(schema, item.group(1), None)):
            found += reached_fields(getattr(schema, item.group(1)), prefix + f.name + ".N.")
    return found


def ftl_keys(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["keys", *args]) == 0
    return capsys.readouterr().out


def test_every_field_reached_from_run_config_has_a_doc() -> None:
    docs = field_docs()
    reached = reached_fields()
    # The walk descends into nested sections, not only RunConfig's own eight.
    assert {"cluster.slurm.signal_grace_s", "dataset.columns.text",
            "dataset.sources.N.weight"} <= {k for k, _, _ in reached}
    undocumented = [key for key, cls, name in reached if not docs.get(cls, {}).get(name)]
    assert undocumented == [], f"add a docstring under each field in schema.py: {undocumented}"


def test_json_lists_every_key_with_its_doc_defaults_and_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = {k["key"]: k for k in json.loads(ftl_keys(capsys, "--json"))}
    assert list(listed) == [key for key, _, _ in reached_fields()]
    assert all(k["doc"] for k in listed.values())
    assert listed["cluster.gpu"]["choices"] == list(GPU_PRESETS)
    assert listed["cluster.scheduler"]["choices"] == ["none", "slurm"]
    assert "zero3_offload" in listed["strategy"]["choices"]
    assert listed["strategy"]["type"] == "group" and listed["strategy"]["default"] == "ddp"
    assert listed["train"]["type"] == "section"
    hidden = listed["model.hidden_size"]
    assert hidden["required"] and hidden["default"] is None and hidden["default_config"] == 64
    assert listed["cluster.slurm.signal_grace_s"]["default"] == 120
    assert listed["peft.target_modules"]["type"] == "list[str]"
    # the speed switches: docs/guide.md, "Speed switches"
    attention = listed["model.attn_implementation"]
    assert attention["default"] == "sdpa" and "flash_attention_2" in attention["choices"]
    assert listed["train.liger_kernel"]["default"] is False
    assert listed["train.compile"]["default"] is False


def test_one_key_shows_type_defaults_and_doc(capsys: pytest.CaptureFixture[str]) -> None:
    out = ftl_keys(capsys, "train.lr")
    # The schema's default, and the tiny-llama preset's own learning rate beside it.
    assert "train.lr  (float)  default: 2e-05; default config: 0.004" in out
    assert field_docs()["TrainConfig"]["lr"] in out
    assert "one of: cosine, linear" in out  # train.lr_scheduler starts with train.lr too


def test_a_prefix_filters(capsys: pytest.CaptureFixture[str]) -> None:
    out = ftl_keys(capsys, "strategy")
    listed = [line.split()[0] for line in out.splitlines() if line and line[0] != " "][3:]
    expected = [k for k, _, _ in reached_fields() if k.split(".")[0] == "strategy"]
    assert listed == expected
    assert "train.lr" not in out and "cluster." not in out


def test_keys_imports_no_heavy_library() -> None:
    code = ("import sys, io, contextlib\nfrom launcher.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['keys']) == 0\n"
            "print(sorted({'torch', 'transformers', 'deepspeed', 'datasets'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_unknown_prefix_exits_2_naming_close_keys() -> None:
    done = subprocess.run([sys.executable, "-m", "launcher", "keys", "trian.lr"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "trian.lr: no config key starts with it" in done.stderr
    assert "Did you mean: train.lr" in done.stderr
