"""INT8 post-training quantization of a fine-tuned causal LM (`ftl quantize`, `ftl chat`).

Every nn.Linear weight becomes int8 codes with their scales and zero points
(`save_quantized`: model.safetensors plus quantization.json); embeddings and norms stay in
full precision, and so does a Linear tied to an embedding. The point is a smaller artifact
to ship and a measured error per layer, not speed: on CPU the int8 layers are dequantized on
load (no int8 kernels).

Conventions. The issue's scale S is "codes per unit" (S = 127 / max|x|); torch's `scale` is the
step 1/S. QuantizedTensor.scale stores S; torch is always handed step = 1/S computed from the
stored S (float32), so the int8 codes, `dequantize` and a torch dequantize of the same codes
agree bit for bit. Parameters come from torch's observers where one implements the scheme, and
the codes from `torch.quantize_per_tensor` / `torch.quantize_per_channel`; the MSE threshold
search is ours (HistogramObserver searches an asymmetric range on 2048 bins, per tensor only).

Only the quantize/chat verbs import this module; it imports torch at module level.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

from launcher.inference.schemes import GRANULARITIES, SCHEMES

FORMAT = "ftlaunch-int8-v1"
QUANT_CONFIG = "quantization.json"
WEIGHTS_FILE = "model.safetensors"
QMAX = 127
# MSE threshold search: a geometric grid of fractions of max|x| (2^-7 .. 1, 1.0 included so the
# result is never worse than absmax), then a linear grid around each row's best coarse fraction.
SEARCH_COARSE = 32
SEARCH_FINE = 16
SEARCH_MIN_EXP = -7.0
# torch >= 2.10 warns that quantized tensors are deprecated; we only use them transiently to get
# int8 codes, so the warning is noise for a user of `ftl quantize`.
_DEPRECATION = ".*quantized tensor creation functions.*"


@dataclass
class QuantizedTensor:
    """int8 codes of one weight and what it takes to map them back (issue conventions)."""

    q: torch.Tensor  # int8, same shape as the weight
    scale: torch.Tensor  # float32 S = 1/step, shape [] (tensor) or [out] (channel)
    zero_point: torch.Tensor  # int32, same shape as scale (0 for absmax/clip)
    threshold: torch.Tensor  # float32 clip T used (max|x| when nothing is clipped)


def _observer(symmetric: bool, per_channel: bool) -> MinMaxObserver | PerChannelMinMaxObserver:
    """The torch observer whose qparams are the issue's scheme.

    Symmetric observers compute step = max|x| / ((quant_max - quant_min) / 2), i.e. max|x|/127.5
    on the full int8 range; the issue's absmax is S = 127/max|x|, so the range is narrowed to
    [-127, 127] (which also keeps the grid symmetric: -128 is never used). Affine observers
    already compute step = (max - min)/255 and zero_point = -128 - round(min/step), the issue's
    Z = -round(S*min) - 128, with one difference: they widen [min, max] to include 0, so 0 stays
    exactly representable for a tensor of one sign (identical for any weight with both signs).
    Both clamp the step to >= float32 eps, so an all-zero row gets a huge S instead of inf.
    """
    if symmetric:
        qscheme = torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric
        kwargs: dict[str, Any] = {"quant_min": -QMAX, "quant_max": QMAX}
    else:
        qscheme = torch.per_channel_affine if per_channel else torch.per_tensor_affine
        kwargs = {}
    if per_channel:
        return PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=qscheme, **kwargs)
    return MinMaxObserver(dtype=torch.qint8, qscheme=qscheme, **kwargs)


def quantile_rows(a: torch.Tensor, q: float) -> torch.Tensor:
    """Per-row quantile of a [R, N] tensor, same interpolation as torch.quantile ('linear').

    Ours because torch.quantile refuses inputs above 2^24 elements (a 4096x11008 weight).
    """
    values = a.sort(dim=1).values
    rank = torch.tensor(q, dtype=a.dtype) * (a.shape[1] - 1)
    below = int(rank.floor().item())
    above = min(below + 1, a.shape[1] - 1)
    return torch.lerp(values[:, below], values[:, above], rank - below)


def _symmetric_mse(rows: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Per-row MSE of clip-at-T then absmax, with the issue's arithmetic (search only)."""
    s = (QMAX / threshold.clamp_min(torch.finfo(torch.float32).tiny))[:, None]
    q = (rows * s).round_().clamp_(-QMAX, QMAX)
    return (q.div_(s) - rows).square_().mean(dim=1)


def _best_fraction(rows: torch.Tensor, amax: torch.Tensor, fractions: torch.Tensor) -> torch.Tensor:
    """Per row, the candidate fraction of max|x| with the lowest MSE ([K] or [R, K] candidates)."""
    fractions = fractions.expand(rows.shape[0], -1)
    # One candidate at a time: all at once would hold K copies of the weight.
    errors = torch.stack([_symmetric_mse(rows, amax * f) for f in fractions.T], dim=1)
    return fractions.gather(1, errors.argmin(dim=1, keepdim=True))[:, 0]  # first on a tie


def mse_thresholds(rows: torch.Tensor) -> torch.Tensor:
    """Per-row clip threshold T minimising reconstruction MSE (coarse grid, then refined).

    A grid search because MSE(T) has no closed form for real weights: clipping trades the error
    on the few outliers against a finer step for all the others. 1.0 * max|x| is a candidate, so
    the result is at least as good as absmax on the same rows.
    """
    amax = rows.abs().amax(dim=1)
    coarse = torch.logspace(SEARCH_MIN_EXP, 0.0, SEARCH_COARSE, base=2.0)
    best = _best_fraction(rows, amax, coarse)
    ratio = float(coarse[1] / coarse[0])
    low, high = best / ratio, (best * ratio).clamp(max=1.0)
    fine = low[:, None] + (high - low)[:, None] * torch.linspace(0.0, 1.0, SEARCH_FINE)
    return amax * _best_fraction(rows, amax, torch.cat([fine, best[:, None]], dim=1))


def _codes(x: torch.Tensor, step: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """int8 codes from torch's quantizer: q = clamp(round(x/step) + Z, -128, 127)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATION)
        if step.dim() == 0:
            qx = torch.quantize_per_tensor(x, float(step), int(zero_point), torch.qint8)
        else:
            qx = torch.quantize_per_channel(x, step, zero_point, 0, torch.qint8)
    return qx.int_repr()


def _broadcast(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-tensor ([]) or per-row ([out]) parameter shaped to broadcast over axis 0."""
    return v if v.dim() == 0 else v.reshape(-1, *([1] * (ndim - 1)))


def quantize_tensor(
    x: torch.Tensor, scheme: str, granularity: str, clip_percentile: float | None = None
) -> QuantizedTensor:
    """int8-quantize one tensor; per channel means per slice along axis 0 (a Linear's rows)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; expected one of {GRANULARITIES}")
    if clip_percentile is not None and scheme != "clip":
        raise ValueError(f"clip_percentile only applies to scheme 'clip', not {scheme!r}")
    if clip_percentile is not None and not 50.0 < clip_percentile < 100.0:
        raise ValueError(f"clip_percentile must be in (50, 100), got {clip_percentile}")
    per_channel = granularity == "channel"
    x = x.detach().to("cpu", torch.float32).contiguous()
    if per_channel and x.dim() < 1:
        raise ValueError("per-channel quantization needs a tensor with at least one dimension")
    rows = x.reshape(x.shape[0], -1) if per_channel else x.reshape(1, -1)
    threshold = rows.abs().amax(dim=1)
    if scheme == "clip":
        threshold = (mse_thresholds(rows) if clip_percentile is None
                     else quantile_rows(rows.abs(), clip_percentile / 100.0))
        x = rows.clamp(-threshold[:, None], threshold[:, None]).reshape(x.shape)
    observer = _observer(symmetric=scheme != "zeropoint", per_channel=per_channel)
    observer(x)
    step, zero_point = observer.calculate_qparams()
    if not per_channel:
        step, zero_point, threshold = step.reshape(()), zero_point.reshape(()), threshold[0]
    scale = torch.reciprocal(step.float())
    zero_point = zero_point.to(torch.int32)
    q = _codes(x, torch.reciprocal(scale), zero_point)
    return QuantizedTensor(q=q, scale=scale, zero_point=zero_point, threshold=threshold.float())


def dequantize(qt: QuantizedTensor) -> torch.Tensor:
    """x' = (q - Z)/S as float32, computed as (q - Z) * (1/S) like torch's dequantize.

    The same expression as torch's kernel so the loaded weights equal a torch dequantize of the
    same codes exactly; q - Z is exact in int32, so a code equal to Z gives exactly 0.0.
    """
    ndim = qt.q.dim()
    centered = qt.q.to(torch.int32) - _broadcast(qt.zero_point.to(torch.int32), ndim)
    step = torch.reciprocal(qt.scale.to(torch.float32))
    return centered.to(torch.float32) * _broadcast(step, ndim)


def error_stats(x: torch.Tensor, qt: QuantizedTensor) -> dict[str, float]:
    """Reconstruction error of one quantized tensor, the numbers `ftl quantize` reports."""
    x = x.detach().to("cpu", torch.float32)
    err = dequantize(qt) - x
    threshold = _broadcast(qt.threshold, x.dim())
    return {
        "mse": float(err.square().mean()),
        "max_abs_error": float(err.abs().max()),
        "clipped_share": float((x.abs() > threshold).float().mean()),
        "scale": float(qt.scale.float().mean()),
        "zero_point": float(qt.zero_point.float().mean()),
    }


def _embedding_weights(model: nn.Module) -> list[torch.Tensor]:
    """Every embedding matrix, to recognise a Linear tied to one."""
    found = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    get_input = getattr(model, "get_input_embeddings", None)
    embedding = get_input() if callable(get_input) else None
    if embedding is not None and getattr(embedding, "weight", None) is not None:
        found.append(embedding.weight)
    return found


def _is_tied(weight: torch.Tensor, embeddings: list[torch.Tensor]) -> bool:
    """The same Parameter (HF ties that way), or the same memory (a tie made by hand)."""
    return any(
        weight is e or (weight.data_ptr() != 0 and weight.data_ptr() == e.data_ptr())
        for e in embeddings
    )


def quantizable_layers(model: nn.Module) -> list[str]:
    """Parameter names "<module>.weight" of every nn.Linear not tied to (sharing the memory
    of) an embedding.

    A tied lm_head shares its matrix with embed_tokens, which is never quantized (a lookup table
    whose rows are read one at a time gains little and loses the rare tokens' precision), so
    quantizing the head would either break the tie or quantize the embedding behind our back.
    """
    embeddings = _embedding_weights(model)
    return [f"{name}.weight" for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not _is_tied(module.weight, embeddings)]


def quantize_model(
    model: nn.Module, scheme: str, granularity: str, clip_percentile: float | None = None
) -> tuple[dict[str, QuantizedTensor], list[dict[str, Any]]]:
    """Quantize every quantizable Linear; returns the codes and one report row per layer."""
    quantized: dict[str, QuantizedTensor] = {}
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for name in quantizable_layers(model):
            weight = model.get_parameter(name)
            qt = quantize_tensor(weight, scheme, granularity, clip_percentile)
            quantized[name] = qt
            rows.append({"layer": name, "shape": list(weight.shape), **error_stats(weight, qt)})
    return quantized, rows


def _plain_tensors(model: nn.Module, skip: set[str]) -> dict[str, torch.Tensor]:
    """State-dict tensors to save as they are: not quantized, and each storage only once.

    safetensors refuses two names for one storage; a tied lm_head is rebuilt by the model's own
    tie when it is loaded, as `save_pretrained` does.
    """
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if name in skip or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().to("cpu").contiguous()
    return tensors


def save_quantized(
    model: nn.Module,
    tokenizer: Any,
    quantized: dict[str, QuantizedTensor],
    out_dir: Path,
    meta: dict[str, Any],
) -> None:
    """Write a quantized model directory that `load_quantized` (and only it) can read.

    meta must carry "scheme", "granularity" and "clip_percentile" (plus anything to record);
    the int8 tensors are stored as "<name>.qweight", "<name>.scale", "<name>.zero_point".
    """
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    tensors = _plain_tensors(model, skip=set(quantized))
    for name, qt in quantized.items():
        tensors[f"{name}.qweight"] = qt.q.contiguous()
        tensors[f"{name}.scale"] = qt.scale.to(torch.float32).contiguous()
        tensors[f"{name}.zero_point"] = qt.zero_point.to(torch.int32).contiguous()
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {"format": FORMAT, "scheme": None, "granularity": None, "clip_percentile": None,
              "layers": list(quantized)}
    # meta cannot overwrite what the loader relies on
    config.update({k: v for k, v in meta.items() if k not in ("format", "layers")})
    (out_dir / QUANT_CONFIG).write_text(json.dumps(config, indent=2, default=str) + "\n")


def is_quantized_dir(path: Path) -> bool:
    """True for a directory written by `save_quantized` (quantization.json with our FORMAT)."""
    config = path / QUANT_CONFIG
    try:
        return json.loads(config.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _read_state(path: Path, layers: list[str]) -> dict[str, torch.Tensor]:
    """The weight file as a plain state dict, int8 layers dequantized to float32."""
    from safetensors import safe_open

    suffixes = (".qweight", ".scale", ".zero_point")
    quantized_keys = {f"{name}{suffix}" for name in layers for suffix in suffixes}
    state: dict[str, torch.Tensor] = {}
    with safe_open(str(path / WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():
            if key not in quantized_keys:
                state[key] = f.get_tensor(key)
        for name in layers:
            q, scale, zero_point = (f.get_tensor(f"{name}{suffix}") for suffix in suffixes)
            qt = QuantizedTensor(q, scale, zero_point, threshold=QMAX / scale)
            state[name] = dequantize(qt)
    return state


def load_quantized(path: Path) -> nn.Module:
    """The model of a `save_quantized` directory, float32 (every int8 layer dequantized:
    the CPU path, see the module docstring), in eval() mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not is_quantized_dir(path):
        raise ValueError(f"{path} is not a quantized model directory ({QUANT_CONFIG}, {FORMAT})")
    layers = json.loads((path / QUANT_CONFIG).read_text())["layers"]
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = _read_state(path, layers)
    result = model.load_state_dict(state, strict=False)
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in state if k in current}
    untied = [k for k in result.missing_keys if current[k].data_ptr() not in loaded]
    if result.unexpected_keys or untied:
        raise ValueError(
            f"{path}: weights do not match the config's model "
            f"(missing {untied[:5]}, unexpected {result.unexpected_keys[:5]})"
        )
    return model.eval()


def dir_size_bytes(path: Path) -> int:
    """Bytes of the weight files (*.safetensors, *.bin) in a model directory, for the report."""
    files = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    return sum(f.stat().st_size for f in files if f.is_file())
