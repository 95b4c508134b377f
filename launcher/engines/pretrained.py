"""What every model ftl reads with from_pretrained is read with: no hub kernels.

transformers 5.25 depends on `kernels` and turns its hub kernels on by default: a model
that from_pretrained places on a GPU (device_map: the harness's, QLoRA's), or that later
switches between train() and eval() there (the Trainer's first step), has layers swapped
for code fetched from the Hub (kernels-community: Liger's RMSNorm, rotary, activations).
Under HF_HUB_OFFLINE=1 (ftl eval sets it; compute nodes with no network) a kernel not in
the cache raises ValueError there: kernels 0.19 falls back to the model's own forward only
on FileNotFoundError. Where the Hub answers, the run's code becomes whatever the Hub holds
that day, and train.liger_kernel=false no longer means no Liger. ftl's fused kernels are
liger-kernel's pip package (train.liger_kernel), checked before launch. transformers 5.23
and 5.24 accept the same keyword (off by default there).
"""

from __future__ import annotations

NO_HUB_KERNELS: dict[str, bool] = {"use_kernels": False}
"""from_pretrained's keyword arguments (the harness's HFLM passes its own on)."""
