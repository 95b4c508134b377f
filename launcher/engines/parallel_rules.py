"""Rules for the model-parallel axes (parallel.tp, parallel.sp): the layout on its own
(config_problems) and what the chosen strategy's engine supports (strategy_problems), a
4-bit base among them; strategy=auto climbs only the rungs that support the run."""

from __future__ import annotations

from launcher.config.schema import RunConfig
from launcher.engines import engine_of
from launcher.errors import flagged


def model_parallel_problems(cfg: RunConfig) -> list[str]:
    tp, sp = cfg.parallel.tp, cfg.parallel.sp
    problems = []
    for key, size, name in (("parallel.tp", tp, "tensor"), ("parallel.sp", sp, "sequence")):
        if size < 1:
            problems.append(f"{key}={size}: a rank count. Fix: {key}=1 (no {name} parallelism).")
    if problems:
        return problems
    if tp > 1 and sp > 1:
        problems.append(
            f"parallel.tp={tp} with parallel.sp={sp}: AutoTP and Ulysses are not combined "
            "here (not measured on the pinned stack). Fix: parallel.tp=1 or parallel.sp=1.")
    return problems + _tensor_parallel(cfg) + _sequence_parallel(cfg)


def engine_support_problems(cfg: RunConfig) -> list[str]:
    """What cfg.strategy's engine does not support of cfg: the model-parallel axes, a
    4-bit base."""
    return parallel_engine_problems(cfg) + quantized_base_problems(cfg)


def quantized_base_problems(cfg: RunConfig) -> list[str]:
    if cfg.peft.name != "qlora" or engine_of(cfg.strategy).memory_stage(cfg.strategy) != 3:
        return []
    return [f"peft=qlora with strategy={cfg.strategy.name}: quantized base weights are not "
            "sharded here. Fix: strategy=ddp, zero1 or zero2 (the base model is small in "
            "4-bit)."]


def parallel_engine_problems(cfg: RunConfig) -> list[str]:
    engine, problems = engine_of(cfg.strategy), []
    if cfg.parallel.tp > 1:
        problems += engine.tensor_parallel_problems(cfg)
    if cfg.parallel.sp > 1:
        problems += engine.sequence_parallel_problems(cfg)
    return problems


def _tensor_parallel(cfg: RunConfig) -> list[str]:
    """parallel.tp: whole ranks of one node, heads that split evenly (AutoTP shards q/k/v
    by heads; with an uneven split it keeps attention whole and only warns)."""
    tp, cluster, model = cfg.parallel.tp, cfg.cluster, cfg.model
    if tp == 1:
        return []
    heads = {"model.num_heads": model.num_heads, "model.num_kv_heads": model.num_kv_heads}
    return flagged([
        (cluster.gpus_per_node % tp,
         f"parallel.tp={tp} with cluster.gpus_per_node={cluster.gpus_per_node}: a "
         "tensor-parallel group stays inside one node (it all-reduces every layer). "
         f"Fix: a parallel.tp that divides {cluster.gpus_per_node}."),
        *((count % tp,
           f"parallel.tp={tp} with {key}={count}: the heads are split over the "
           f"tensor-parallel ranks. Fix: a parallel.tp that divides {count}.")
          for key, count in heads.items()),
    ]) + _no_adapters(cfg, "parallel.tp", tp)


def _sequence_parallel(cfg: RunConfig) -> list[str]:
    """parallel.sp (Ulysses): each rank of a group attends with num_heads / sp heads over
    the whole sequence; KV heads are split or replicated to match (docs/evidence/stack.md)."""
    sp, model, kv = cfg.parallel.sp, cfg.model, cfg.model.num_kv_heads
    if sp == 1:
        return []
    return flagged([
        (cfg.world_size % sp,
         f"parallel.sp={sp} with {cfg.world_size} ranks (cluster.nodes x "
         f"cluster.gpus_per_node): every rank belongs to one sequence-parallel group. "
         f"Fix: a parallel.sp that divides {cfg.world_size}."),
        (model.num_heads % sp,
         f"parallel.sp={sp} with model.num_heads={model.num_heads}: each rank attends "
         f"with num_heads / sp heads. Fix: a parallel.sp that divides {model.num_heads}."),
        (kv % sp and sp % kv,
         f"parallel.sp={sp} with model.num_kv_heads={kv}: KV heads are split over the "
         f"group or repeated to fill it. Fix: a parallel.sp that divides {kv} or is a "
         f"multiple of it."),
        (cfg.dataset.packing,
         f"parallel.sp={sp} with dataset.packing=true: Ulysses drops the attention mask, "
         "so sdpa would attend across the packed documents (flash-attention varlen, which "
         "keeps them apart, needs a GPU build). Fix: dataset.packing=false."),
    ]) + _no_adapters(cfg, "parallel.sp", sp)


def _no_adapters(cfg: RunConfig, key: str, size: int) -> list[str]:
    if cfg.peft.name == "none":
        return []
    return [f"{key}={size} with peft={cfg.peft.name}: adapters with model parallelism are "
            f"not supported here. Fix: {key}=1, or peft=none."]
