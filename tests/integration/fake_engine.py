"""An engine ftlaunch does not ship: DDP under another name, with a settings file, a rule,
moments and a rank-side hook of its own. A strategy YAML names it as
`backend: tests.integration.fake_engine:FakeEngine` (test_fake_engine.py)."""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines.ddp import DdpEngine
from launcher.engines.peak_terms import PeakInputs, Split
from launcher.rundir import PROBES, RunDir

EXTRA_BYTES = 12345.0
"""What its moments add to DDP's at every moment, so the estimate shows they are its own."""
SETTINGS_FILE = "fake.json"


class FakeEngine(DdpEngine):
    name: ClassVar[str] = "fake"
    launchers: ClassVar[tuple[str, ...]] = ("torchrun",)
    settings_file: ClassVar[str | None] = SETTINGS_FILE

    def problems(self, cfg: RunConfig) -> list[str]:
        problems = super().problems(cfg)
        if cfg.strategy.bucket_size == 13:
            problems.append("strategy.bucket_size=13: the fake engine refuses 13. "
                            "Fix: any other value.")
        return problems

    def settings(self, cfg: RunConfig) -> dict[str, Any]:
        return {"engine": self.name, "world_size": cfg.world_size}

    def moments(self, x: PeakInputs, strategy: StrategyConfig) -> dict[str, Split]:
        return {m: (d + EXTRA_BYTES, h) for m, (d, h) in super().moments(x, strategy).items()}

    def trainer_kwargs(self, cfg: RunConfig, run_dir: RunDir, on_cpu: bool,
                       load_universal: bool) -> dict[str, Any]:
        settings = json.loads((run_dir.path / SETTINGS_FILE).read_text())
        probes = run_dir.path / PROBES
        probes.mkdir(exist_ok=True)
        rank = os.environ.get("RANK", "0")
        (probes / f"fake-engine-rank{rank}.json").write_text(json.dumps(settings))
        return {}
