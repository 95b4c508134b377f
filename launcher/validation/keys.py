"""`ftl keys [PREFIX]`: every config key with its type, defaults, allowed values and doc.

Each doc is the attribute docstring under the field in schema.py, read with ast, so a new
field needs no table here; allowed values come from where they are checked (rules.choices,
the strategy table, configs/<group>/*.yaml). Imports no torch.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import asdict, dataclass, fields, is_dataclass
from itertools import pairwise
from typing import Any

from omegaconf import MISSING, OmegaConf

from launcher.config import schema
from launcher.config.compose import compose_dict, config_dir
from launcher.config.report_to import CHOICES as TRACKER_CHOICES
from launcher.config.strategies import strategy_table
from launcher.errors import ConfigError
from launcher.validation import rules


@dataclass(frozen=True)
class Key:
    key: str
    """Dotted, as typed on the command line, e.g. cluster.slurm.signal_grace_s."""
    type: str
    """The annotation as written in schema.py; group or section for a nested dataclass."""
    default: Any
    """The schema's default; a group: the option configs/config.yaml chooses; a section:
    None."""
    required: bool
    """No schema default: the group's preset sets it (OmegaConf's ???)."""
    default_config: Any
    """What the default config sets (a group: the option chosen in its defaults list)."""
    choices: tuple[str, ...]
    """Allowed values where they are checked against a list; empty: see the doc."""
    doc: str


def field_docs() -> dict[str, dict[str, str]]:
    """class name -> field -> the string literal right below the field, from one parse of
    schema.py's source."""
    docs: dict[str, dict[str, str]] = {}
    for node in ast.parse(inspect.getsource(schema)).body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs[node.name] = {
            item.target.id: inspect.cleandoc(after.value.value)
            for item, after in pairwise(node.body)
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        }
    return docs


LIST_ITEMS: dict[str, type] = {"dataset.sources": schema.SourceConfig}
"""Keys holding a list of sections; an item's key is typed dataset.sources.0.weight=2."""


def all_keys() -> list[Key]:
    """Every field reached from RunConfig, in schema order, sections before their keys."""
    docs = field_docs()
    composed = OmegaConf.to_container(compose_dict([]), resolve=True)
    defaults = OmegaConf.to_container(OmegaConf.load(config_dir() / "config.yaml").defaults)
    groups = {k: v for entry in defaults or [] if isinstance(entry, dict) for k, v in entry.items()}
    choices = {**rules.choices(), "strategy.name": tuple(strategy_table()),
               "train.report_to": TRACKER_CHOICES,
               **{group: tuple(sorted(path.stem for path in (config_dir() / group).glob("*.yaml")))
                  for group in schema.GROUPS}}
    keys: list[Key] = []

    def walk(cls: type, prefix: str, values: Any) -> None:
        for f in fields(cls):
            name, value, default = prefix + f.name, (values or {}).get(f.name), f.default
            if f.default_factory is not NO_DEFAULT:
                default = f.default_factory()
            doc = docs.get(cls.__name__, {}).get(f.name, "")
            if name in LIST_ITEMS:  # a list of sections: each item's keys, as dotted
                keys.append(Key(name, str(f.type), default, False, value, (), doc))
                walk(LIST_ITEMS[name], name + ".N.", None)
            elif is_dataclass(default):
                kind = "group" if name in groups else "section"
                group = groups.get(name)
                keys.append(Key(name, kind, group, False, group, choices.get(name, ()), doc))
                walk(type(default), name + ".", value)
            else:
                required = default == MISSING
                keys.append(Key(name, str(f.type), None if required else default, required,
                                value, choices.get(name, ()), doc))

    walk(schema.RunConfig, "", composed)
    return keys


def select(keys: list[Key], prefix: str) -> list[Key]:
    """The keys starting with `prefix`; none: a ConfigError naming the closest keys."""
    chosen = [k for k in keys if k.key.startswith(prefix)]
    if chosen:
        return chosen
    names = [k.key for k in keys]
    close = [n for n in names if prefix.lower() in n]
    close += difflib.get_close_matches(prefix, names, n=5, cutoff=0.6)
    hint = f"Did you mean: {', '.join(list(dict.fromkeys(close))[:5])}? " if close else ""
    raise ConfigError(f"{prefix}: no config key starts with it. {hint}"
                      "Fix: `ftl keys` lists every key; `ftl keys train.` one section.")


def render(keys: list[Key]) -> str:
    lines = [
        "Each key as typed (KEY=VALUE; a group as GROUP=NAME): type, the schema's default and,\n"
        "where it differs, what the default config sets (configs/config.yaml's groups, no\n"
        "overrides: what `ftl train` runs), allowed values, doc.\n"
    ]
    for k in keys:
        head = f"{k.key}  ({k.type})"
        if k.required:
            head += "  required"
        elif k.type != "section":
            head += f"  default: {_show(k.default)}"
        if k.default_config is not None and k.default_config != k.default:
            head += f"; default config: {_show(k.default_config)}"
        lines.append(head)
        if k.choices:
            lines.append(f"    one of: {', '.join(k.choices)}")
        lines += [f"    {line}" for line in k.doc.splitlines()]
    return "\n".join(lines) + "\n"


def _show(value: Any) -> str:
    return value if isinstance(value, str) and value else json.dumps(value)


def keys_json(keys: list[Key]) -> str:
    return json.dumps([asdict(k) for k in keys], indent=2)
