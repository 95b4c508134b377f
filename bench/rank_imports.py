"""Per-rank import phase: CPU seconds (user+sys) and wall of imports.import_stack, as a rank
that does not tokenize runs it, and which heavy modules it loaded (any checkout: the
builds_data argument existed while the ranks hid unused libraries).
Usage (from a checkout): python bench/rank_imports.py [overrides...]"""

import os
import resource
import sys
import time

sys.path.insert(0, os.getcwd())  # the checkout's launcher (main or a worktree)
import launcher.rank.worker  # noqa: E402,F401 - what a rank has imported before import_stack
from launcher.config.compose import compose_config  # noqa: E402
from launcher.rank import imports  # noqa: E402

WATCH = ("datasets", "pandas", "peft", "bitsandbytes", "deepspeed", "torch._dynamo",
         "torch.distributed.tensor", "torch._inductor.compile_fx")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


cfg = compose_config(sys.argv[1:])
cpu0, wall0 = cpu_s(), time.time()
try:  # since the engine is handed down the rank's recipe
    from launcher.engines import engine_of

    imports.import_stack(cfg, engine_of(cfg.strategy))
except TypeError:  # older revisions, measured side by side
    try:
        imports.import_stack(cfg, builds_data=False)
    except TypeError:
        imports.import_stack(cfg)
loaded = [m for m in WATCH if sys.modules.get(m)]
print(f"cpu {cpu_s() - cpu0:.2f} wall {time.time() - wall0:.2f} {loaded}")
