"""The doctor's verdicts, pure: every rank's facts and the bandwidth figures -> one row per
check (naming the node and rank of a failure and the fix), and the table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from launcher.rundir.records import Record

OK, FAIL, INFO = "ok", "FAIL", "info"
SLOW_FRACTION = 0.5
"""A bus bandwidth below this share of the preset's figure fails the check."""


@dataclass(frozen=True)
class Row(Record):
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Expectation:
    backend: str
    world_size: int
    nodes: int
    gpus_per_node: int
    on_gpu: bool
    intra_gb_s: float
    """Expected intra-node busbw (the GPU preset's); 0: none."""
    inter_gb_s: float
    """Expected inter-node busbw (cluster.network_gb_s); 0: none."""
    need_bytes: int
    """Free space the run needs in its output dir (estimator/disk.py)."""


def where(fact: dict[str, Any]) -> str:
    return f"rank {fact['rank']} (node {fact['node']}, {fact['host']})"


def process_group(facts: list[dict[str, Any]], exp: Expectation, join_s: float) -> Row:
    joined = len(facts)
    status = OK if joined == exp.world_size else FAIL
    return Row("process group", status,
               f"{joined}/{exp.world_size} ranks on {exp.nodes} node(s) joined "
               f"({exp.backend}) in {join_s:.1f} s")


def bandwidth(measured: list[dict[str, Any]], exp: Expectation) -> list[Row]:
    rows = []
    for scope, expected in (("intra-node", exp.intra_gb_s), ("inter-node", exp.inter_gb_s)):
        mine = [m for m in measured if m["scope"] == scope]
        if not mine:
            why = "one rank per node" if scope == "intra-node" else "one node"
            rows.append(Row(f"all-reduce {scope}", INFO, f"not measured: {why}"))
            continue
        by_node: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for m in mine:
            by_node[m["node"]].append(m)
        rows += [_bandwidth_row(scope, group, expected) for group in by_node.values()]
    return rows


def _bandwidth_row(scope: str, group: list[dict[str, Any]], expected: float) -> Row:
    group = sorted(group, key=lambda m: m["size_bytes"])
    sizes = ", ".join(f"{m['size_bytes'] // 2**20} MiB {m['busbw_gb_s']:.2f}" for m in group)
    top = group[-1]
    name = f"all-reduce {scope}" + (f" node {top['node']}" if top["node"] is not None else "")
    detail = f"busbw GB/s over {top['ranks']} ranks: {sizes}"
    if expected <= 0:
        return Row(name, INFO, detail + "; no expected figure to compare with")
    detail += f"; expected about {expected:g}"
    if top["busbw_gb_s"] >= SLOW_FRACTION * expected:
        return Row(name, OK, detail)
    fix = ("check NVLink/NVSwitch health (nvidia-smi topo -m) and that the ranks use NCCL "
           "on their own GPUs" if scope == "intra-node" else
           "check that NCCL uses the fast network (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, "
           "NCCL_DEBUG=INFO names the transport) and cluster.network_gb_s")
    return Row(name, FAIL, detail, fix)


def versions(facts: list[dict[str, Any]]) -> Row:
    seen: dict[str, list[str]] = defaultdict(list)  # the versions -> the nodes with them
    for f in facts:
        text = (f"torch {f['torch']}, CUDA {f['cuda'] or '-'}, NCCL {f['nccl'] or '-'}, "
                f"driver {f['driver'] or '-'}")
        seen[text].append(f"node {f['node']} ({f['host']})")
    if len(seen) == 1:
        return Row("versions", OK, f"{next(iter(seen))} on every node")
    detail = "; ".join(f"{text} on {', '.join(sorted(set(nodes)))}" for text, nodes in seen.items())
    return Row("versions", FAIL, detail,
               "install the same torch, CUDA, NCCL and driver on every node (one image or "
               "environment; cluster.setup for module loads)")


def gpus(facts: list[dict[str, Any]], exp: Expectation) -> Row:
    if not exp.on_gpu:
        return Row("gpus", INFO, "cluster.gpu=cpu: every rank is a CPU process")
    blind = [where(f) for f in facts if f["local_rank"] >= len(f["gpus"])]
    names = sorted({name for f in facts for name in f["gpus"]})
    counts = ", ".join(f"{where(f)}: {len(f['gpus'])} GPU(s), CUDA_VISIBLE_DEVICES="
                       f"{f['visible_devices'] or 'unset'}" for f in facts)
    detail = f"{', '.join(names) or 'none'}; {counts}"
    if not blind:
        return Row("gpus", OK, detail)
    return Row("gpus", FAIL, f"no GPU of its own for {', '.join(blind)}; {detail}",
               f"give each node {exp.gpus_per_node} GPUs (--gpus-per-node, "
               "CUDA_VISIBLE_DEVICES unset or listing them all)")


def output_dir(facts: list[dict[str, Any]]) -> Row:
    path = facts[0]["output_dir"]
    blind = [f for f in facts if not f["output_shared"]]
    if not blind:
        return Row("output dir", OK, f"every rank read rank 0's file in {path}")
    named = ", ".join(f"{where(f)} in {f['output_dir']}" for f in blind)
    return Row("output dir", FAIL,
               f"rank 0's file in {path} is missing for {named}: not the same directory",
               "put run.output_dir on a filesystem every node mounts at the same path (a "
               "node-local output dir loses checkpoints and breaks resume)")


def free_space(facts: list[dict[str, Any]], exp: Expectation) -> Row:
    low: dict[str, int] = {}
    for fact in facts:
        node = f"node {fact['node']} ({fact['host']})"
        low[node] = min(low.get(node, fact["free_bytes"]), fact["free_bytes"])
    gib = 2**30
    texts = ", ".join(f"{node}: {free / gib:.1f} GiB" for node, free in low.items())
    detail = f"free: {texts}; the run needs {exp.need_bytes / gib:.2f} GiB"
    short = [node for node, free in low.items() if free < exp.need_bytes]
    if not short:
        return Row("free space", OK, detail)
    return Row("free space", FAIL, f"too little on {', '.join(short)}; {detail}",
               "free space there, another run.output_dir, or fewer kept checkpoints "
               "(train.save_total_limit=2)")


def data_cache(facts: list[dict[str, Any]]) -> Row:
    root = facts[0]["cache_root"]
    blind = [where(f) for f in facts if not f["cache_shared"]]
    built_on_0 = facts[0]["data_built"]
    missing = [where(f) for f in facts if built_on_0 and not f["data_built"]]
    if blind or missing:
        return Row("data cache", FAIL,
                   f"{root}: not the same directory for {', '.join(blind or missing)}",
                   "set dataset.cache_dir to a directory every node shares (rank 0 "
                   "tokenizes; the others wait for its result there)")
    state = "tokenized data present" if built_on_0 else "not tokenized yet (rank 0 will)"
    return Row("data cache", OK, f"{root}: the same directory on every rank; {state}")


def optimizer_build(facts: list[dict[str, Any]]) -> Row:
    """DeepSpeed's FusedAdam, compiled by every rank at the first step: each node's toolkit
    as the ranks see it (validation/preflight.fused_adam_problems, run on the node)."""
    seen: dict[str, list[str]] = defaultdict(list)  # a problem -> the nodes with it
    for f in facts:
        for problem in f["build_problems"]:
            seen[problem].append(f"node {f['node']} ({f['host']})")
    if not seen:
        return Row("optimizer build", OK, "nothing to compile at the first step, or a CUDA "
                   "toolkit DeepSpeed builds FusedAdam with on every node")
    split = {problem: problem.partition(" Fix: ") for problem in seen}
    detail = "; ".join(f"on {', '.join(sorted(set(nodes)))}: {split[problem][0]}"
                       for problem, nodes in seen.items())
    fix = split[next(iter(seen))][2]  # the same fix whatever the node lacks
    return Row("optimizer build", FAIL, detail, fix.rstrip("."))


def judge(facts: list[dict[str, Any]], measured: list[dict[str, Any]], exp: Expectation,
          join_s: float) -> list[Row]:
    facts = sorted(facts, key=lambda f: f["rank"])
    return [process_group(facts, exp, join_s), *bandwidth(measured, exp), versions(facts),
            gpus(facts, exp), optimizer_build(facts), output_dir(facts),
            free_space(facts, exp), data_cache(facts)]


def passed(rows: list[dict[str, Any]]) -> bool:
    return all(row["status"] != FAIL for row in rows)


def render(report: dict[str, Any]) -> str:
    """The one table: check, result, what was seen (and under a failure, its fix)."""
    rows = report["rows"]
    width = max(len(row["check"]) for row in rows)
    lines = [f"ftl doctor: {report['world_size']} rank(s) on {report['nodes']} node(s), "
             f"backend {report['backend']}, run dir {report['run_dir']}",
             f"{'check'.ljust(width)}  result  detail"]
    for row in rows:
        lines.append(f"{row['check'].ljust(width)}  {row['status'].ljust(6)}  {row['detail']}")
        if row["fix"]:
            lines.append(f"{''.ljust(width)}          fix: {row['fix']}")
    verdict = "every check passed" if passed(rows) else "a check FAILED (fix above)"
    lines.append(f"ftl doctor: {verdict}")
    return "\n".join(lines)
