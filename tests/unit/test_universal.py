"""launcher/engines/deepspeed/universal.py: what DeepSpeed's ZeRO-3 universal load leaves
behind (one step tensor shared by every parameter state) and the fix."""

from __future__ import annotations

import torch

from launcher.engines.deepspeed.universal import untie_optimizer_steps


class Wrapper:
    """Like DeepSpeed's ZeRO optimizer and accelerate's wrapper: `.optimizer` inside."""

    def __init__(self, optimizer: object) -> None:
        self.optimizer = optimizer


def adamw_after_a_shared_step_load() -> torch.optim.AdamW:
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.AdamW([{"params": [params[0]]}, {"params": [params[1]]}])
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    shared = torch.tensor(4.0)  # as stage3.py assigns the checkpoint's step
    for p in params:
        optimizer.state[p]["step"] = shared
    return optimizer


def test_untied_steps_count_one_per_optimizer_step() -> None:
    """Left shared, torch's AdamW adds 1 to the one tensor once per parameter: 4 -> 6."""
    optimizer = adamw_after_a_shared_step_load()
    assert untie_optimizer_steps(Wrapper(Wrapper(optimizer))) == 1
    optimizer.step()
    assert [float(s["step"]) for s in optimizer.state.values()] == [5.0, 5.0]
    assert untie_optimizer_steps(optimizer) == 0
