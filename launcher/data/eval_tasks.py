"""The benchmark tasks of lm-evaluation-harness that `ftl eval` and `eval.tasks` name, loaded
offline: ftl's bundled tasks (eval_tasks/*.yaml, whose local data files are resolved from
the project root, so they run from any directory), the user's (`eval.include_path`) and the
harness's own. Loading a task reads its data, so a task whose data is not in the HF cache
fails here, before any model loads, and every such task is named in one ConfigError with
the command that fills the cache (`ftl eval --prefetch`). The validation stage and the
evaluation itself both load through `load_tasks`.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

from launcher.config.compose import PROJECT_ROOT
from launcher.errors import ConfigError

BUNDLED_DIR = PROJECT_ROOT / "eval_tasks"
INSTALL = "pip install 'ftlaunch[eval]'"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""What keeps the hub libraries from the network: set for every evaluation."""


def harness_missing(what: str) -> str | None:
    """The refusal for a missing lm-evaluation-harness (found without importing it)."""
    if importlib.util.find_spec("lm_eval") is not None:
        return None
    return (f"{what}: lm-evaluation-harness is not installed. Fix: {INSTALL} "
            "(in this repository: make venv).")


def bundled_tasks() -> dict[str, dict[str, Any]]:
    """name -> the harness config of each bundled task, its data files made absolute."""
    import yaml

    tasks = {}
    for path in sorted(BUNDLED_DIR.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        files = spec.get("dataset_kwargs", {}).get("data_files", {})
        spec.setdefault("dataset_kwargs", {})["data_files"] = {
            split: str(PROJECT_ROOT / name) for split, name in files.items()}
        tasks[spec["task"]] = spec
    return tasks


@contextlib.contextmanager
def hub_offline(offline: bool = True) -> Iterator[None]:
    """The HF hub libraries offline (or left as they are) for the block. The environment
    is set for what imports them later; datasets and huggingface_hub read it at import, so
    their loaded flags are set too, and everything is restored after."""
    if not offline:
        yield
        return
    saved_env = {key: os.environ.get(key) for key in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    flags = [(sys.modules.get("huggingface_hub.constants"), "HF_HUB_OFFLINE"),
             (sys.modules.get("datasets.config"), "HF_HUB_OFFLINE"),
             (sys.modules.get("datasets.config"), "HF_DATASETS_OFFLINE")]
    saved = [(module, name, getattr(module, name)) for module, name in flags
             if module is not None and hasattr(module, name)]
    for module, name, _ in saved:
        setattr(module, name, True)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_tasks(names: list[str], include_path: str = "", *,
               offline: bool = True) -> list[Any]:
    """The harness's Task/Group objects for `names`, in order, their data loaded (from the
    HF cache when offline). Raises one ConfigError naming every unknown task and every
    task whose data could not be read, with the fix."""
    import logging

    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its index logs every folder
    bundled = bundled_tasks()
    manager = _task_manager(names, bundled, include_path)
    loaded, problems = [], []
    with hub_offline(offline):
        for name in names:
            spec: Any = bundled.get(name, name)
            if not isinstance(spec, dict) and name not in manager.all_tasks:
                problems.append(_unknown(name, manager.all_tasks + list(bundled)))
                continue
            try:
                result = manager.load([spec])
            except Exception as error:  # noqa: BLE001 - datasets raises many kinds
                problems.append(_unreadable(name, error, offline))
                continue
            loaded.append(result["groups"].get(name) or result["tasks"].get(name)
                          or list(result["tasks"].values()))  # a tag: its tasks
    if problems:
        raise ConfigError(problems)
    return [item for entry in loaded for item in (entry if isinstance(entry, list) else [entry])]


def _task_manager(names: list[str], bundled: dict[str, Any], include_path: str) -> Any:
    """The harness's index of task YAMLs; its own ~200 folders (a few seconds to scan) only
    when a name is not one of ftl's bundled tasks."""
    from lm_eval.tasks import TaskManager

    own = any(name not in bundled for name in names)
    return TaskManager(include_path=include_path or None, include_defaults=own)


def _unknown(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return (f"eval.tasks: {name!r} is not a task of lm-evaluation-harness, of ftl "
            f"({', '.join(bundled_tasks())}) or of eval.include_path.{hint} Fix: a task name "
            "(`lm-eval ls tasks` lists them), or eval.include_path=DIR with your task YAML.")


def _unreadable(name: str, error: Exception, offline: bool) -> str:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if not offline:
        return f"eval.tasks: {name!r}: its data could not be downloaded ({reason})."
    return (f"eval.tasks: {name!r}: its data is not in the HF cache "
            f"({os.environ.get('HF_HOME') or '~/.cache/huggingface'}), and evaluation runs "
            f"offline ({reason}). Fix: on a machine with a network and the same HF_HOME, "
            f"`ftl eval --prefetch --tasks {name}`, then run this again.")
