"""`ftl VERB [options] [hydra overrides]`: one small registry of verbs (what each does:
docs/guide.md; the exit codes: docs/design.md, "Exit codes"). plan, ds-config and estimate
never import torch, transformers or deepspeed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError, DataError
from launcher.inference.schemes import GRANULARITIES, SCHEMES

Verb = Callable[[argparse.Namespace], int]
Arg = tuple[tuple[str, ...], dict[str, Any]]
VERBS: dict[str, tuple[str, Verb, tuple[Arg, ...]]] = {}


def arg(*flags: str, **options: Any) -> Arg:
    """One `add_argument` call, kept for the verb's parser."""
    return flags, options


OVERRIDES = arg("overrides", nargs="*", help="Hydra overrides, key=value")
JSON = arg("--json", action="store_true", help="machine-readable")
TARGET = arg("target", help="a run dir or a job id")


def verb(name: str, help_text: str, *args: Arg) -> Callable[[Verb], Verb]:
    def register(function: Verb) -> Verb:
        VERBS[name] = (help_text, function, args)
        return function

    return register


@verb("plan", "write the run dir and print config, estimate, settings and command; no launch",
      OVERRIDES)
def cmd_plan(args: argparse.Namespace) -> int:
    from launcher.run.launch import create_run
    from launcher.run.planner import render_plan

    built = create_run(args.overrides, "plan")
    print(render_plan(built.plan, built.launch, built.run_dir), end="")
    return 0


@verb("ds-config", "print (or write with -o FILE) the DeepSpeed config for the overrides",
      arg("-o", "--output", help="write the JSON to this file"), OVERRIDES)
def cmd_ds_config(args: argparse.Namespace) -> int:
    from launcher import rundir
    from launcher.engines.deepspeed.ds_config import deepspeed_strategies
    from launcher.run.launch import check
    from launcher.run.planner import make_plan

    plan = make_plan(check(args.overrides, "plan"))
    if plan.settings_file != rundir.DS_CONFIG or plan.settings is None:
        names = ", ".join(deepspeed_strategies())
        raise ConfigError(
            f"strategy={plan.cfg.strategy.name}: not a DeepSpeed strategy, so there is no "
            f"ds_config. Fix: strategy= one of {names}."
        )
    text = rundir.json_text(plan.settings)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


@verb("estimate", "per-strategy memory, fit and time table for the chosen model and cluster",
      JSON, arg("--count-tokens", action="store_true",
                help="count the dataset's tokens with the model's tokenizer (slower)"),
      OVERRIDES)
def cmd_estimate(args: argparse.Namespace) -> int:
    from launcher.config.strategies import is_auto
    from launcher.estimator.auto import pick, pick_notes
    from launcher.estimator.estimate import estimate
    from launcher.estimator.estimate_table import estimate_json, render_estimate_table
    from launcher.run.launch import check

    checked = check(args.overrides, "estimate", counts_tokens=args.count_tokens)
    cfg, est = checked.cfg, checked.estimate
    # the run's tokens unless train.max_steps sets the step count; tokenized and cached
    # now if not yet (this loads transformers, so only on request)
    if args.count_tokens and cfg.train.max_steps <= 0:
        from launcher.data.preprocess import data_dir, ensure_prepared

        prepared = ensure_prepared(cfg, data_dir(cfg), builder="ftl estimate")
        est = estimate(cfg, tokens=int(prepared.tokens * cfg.train.epochs))
    assert est is not None  # validation estimates every config it passes
    picked = pick(cfg, est) if is_auto(cfg.strategy) else None
    chosen = picked.cfg.strategy.name if picked else (
        None if is_auto(cfg.strategy) else cfg.strategy.name)
    if args.json:
        checkpointed = picked is not None and picked.checkpointed
        print(json.dumps(estimate_json(est, chosen, checkpointed), indent=2))
    else:
        notes = pick_notes(cfg, est, picked) if picked else []
        print(render_estimate_table(cfg, est, chosen, notes).rstrip("\n"))
    return 0


@verb("train", "write the run dir and train on this machine (torchrun or deepspeed)", OVERRIDES)
def cmd_train(args: argparse.Namespace) -> int:
    from launcher.data.preprocess import ensure_prepared
    from launcher.run.launch import check, run_local, write_run

    checked = check(args.overrides, "train")
    assert checked.data_dir is not None
    # Tokenized here, once, before any rank starts: a data problem ends with exit 2 and
    # nothing written, and the ranks only load the result.
    ensure_prepared(checked.cfg, checked.data_dir, builder="ftl train")
    return run_local(write_run(checked, args.overrides))


@verb("preprocess", "tokenize (and pack) the dataset once into the cache the runs read",
      JSON, OVERRIDES)
def cmd_preprocess(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from launcher.data.preprocess import ensure_prepared
    from launcher.run.launch import check

    checked = check(args.overrides, "preprocess")
    assert checked.data_dir is not None
    prepared = ensure_prepared(checked.cfg, checked.data_dir, builder="ftl preprocess")
    if args.json:
        print(json.dumps(asdict(prepared)))
    else:
        print(prepared_lines(prepared, checked.cfg))
    return 0


def prepared_lines(prepared: Any, cfg: Any) -> str:
    """`ftl preprocess`'s figures; a stream's are one pass's, estimated (marked ~)."""
    from launcher.estimator.flops import global_batch_size

    state = "already cached" if prepared.cached else "tokenized"
    about = "~" if prepared.streamed else ""
    lines = [f"ftl preprocess: {'streamed, estimated' if prepared.streamed else state}: "
             f"{about}{prepared.rows} rows, {about}{prepared.tokens} tokens "
             f"({about}{prepared.trained_tokens} trained), fill {prepared.fill:.3f}"]
    lines += [f"  {line}" for line in source_table(prepared.sources, about)]
    if prepared.streamed:
        batch = global_batch_size(cfg)
        lines.append(f"  train: streamed (tokenized as the ranks read it); one pass ~"
                     f"{-(-prepared.rows // batch)} steps of {batch} rows")
    else:
        lines.append(f"  train: {prepared.train}")
    lines.append(f"  eval:  {prepared.eval}")
    return "\n".join(lines)


def source_table(sources: list[dict[str, Any]], about: str = "") -> list[str]:
    """A mixture's sources: their own rows and tokens, the share their weight asks for and
    the examples the mixture drew from each (before packing); `about`: "~" when these are
    estimated (a stream's)."""
    if not sources:
        return []
    width = max(6, *(len(s["name"]) for s in sources))
    lines = [f"{'source':<{width}} {'rows':>8} {'tokens':>10} {'weight':>7} {'share':>6} "
             f"{'drawn':>8} {'drawn %':>7}"]
    lines += [f"{s['name']:<{width}} {about + str(s['rows']):>8} {about + str(s['tokens']):>10} "
              f"{s['weight']:>7g} {s['share']:>6.1%} {about + str(s['drawn']):>8} "
              f"{s['drawn_share']:>7.1%}" for s in sources]
    return lines


@verb("report", "plot loss, learning rate and tokens/s of a run; compare estimate and measurement",
      arg("run_dir", help="outputs/<run.name>/<timestamp>"))
def cmd_report(args: argparse.Namespace) -> int:
    from launcher.run.report import report

    text, png = report(Path(args.run_dir))
    print(text)
    print(f"plot: {png}")
    return 0


@verb("quantize", "INT8 post-training quantization of a model dir: error, perplexity, size",
      arg("model_dir", help="outputs/<run.name>/<timestamp>/model"),
      arg("-o", "--output", required=True, help="directory to write"),
      arg("--scheme", choices=SCHEMES, default="absmax"),
      arg("--granularity", choices=GRANULARITIES, default="channel"),
      arg("--clip-percentile", type=float, default=None,
          help="clip: keep this share of |weights| unclipped, in (50, 100); "
          "default: the threshold with the least error"),
      arg("--compare", action="store_true",
          help="every scheme x granularity, ranked; writes the best"),
      arg("--json", action="store_true", help="machine-readable summary"),
      arg("--force", action="store_true", help="replace an existing -o dir"),
      OVERRIDES)
def cmd_quantize(args: argparse.Namespace) -> int:
    from launcher.inference.quantize import Request, quantize

    request = Request(
        model_dir=Path(args.model_dir), out_dir=Path(args.output), scheme=args.scheme,
        granularity=args.granularity, clip_percentile=args.clip_percentile,
        compare=args.compare, force=args.force, overrides=args.overrides,
    )
    return quantize(request, as_json=args.json)


@verb("chat", "talk to a trained (or quantized) model: ftl chat MODEL_DIR [--prompt TEXT]",
      arg("model_dir", help="a model/ dir, a LoRA adapter (model/adapter) or an ftl quantize "
          "output"),
      arg("--prompt", help="one message; without it: a loop on stdin"),
      arg("--system", help="a system message"),
      arg("--max-new-tokens", type=int, default=128))
def cmd_chat(args: argparse.Namespace) -> int:
    from launcher.evaluation.models import load_model_dir
    from launcher.inference.chat import chat

    return chat(Path(args.model_dir), args.prompt, args.system, args.max_new_tokens,
                load=load_model_dir)


@verb("eval", "benchmark a model on lm-evaluation-harness tasks, offline: ftl eval "
      "MODEL_DIR|RUN_DIR --tasks T1,T2",
      arg("target", nargs="?", help="a model dir (run's model/, checkpoint, LoRA adapter, "
          "ftl quantize output) or a run dir (as ftl train's eval.tasks does)"),
      arg("--tasks", help="comma-separated task names; arith: the bundled demo task"),
      arg("--num-fewshot", type=int), arg("--limit", type=float,
                                          help="examples per task (or a share in (0, 1))"),
      arg("--batch-size", type=int),
      arg("--apply-chat-template", action=argparse.BooleanOptionalAction, default=None,
          help="render prompts with the model's chat template (default: on)"),
      arg("--include-path", help="a directory of your own task YAMLs"),
      arg("--gen-kwargs", help="generation settings, e.g. temperature=0,max_gen_toks=256"),
      arg("--before", action="store_true", default=None,
          help="with a RUN_DIR: also score the weights the run started from"),
      arg("--shard", action="store_true", default=None,
          help="split the model over this node's GPUs"),
      arg("--processes", type=int, metavar="N",
          help="data parallel: N processes on N of this node's GPUs (eval.processes)"),
      arg("--output", help="the dir whose eval/ gets the results (default: the model's run "
          "dir, else run.output_dir/<model dir name>)"),
      arg("--prefetch", action="store_true",
          help="download the tasks' data into the HF cache (needs a network), then exit"))
def cmd_eval(args: argparse.Namespace) -> int:
    from launcher.evaluation.verb import Request, ftl_eval, prefetch

    tasks = [t for t in (args.tasks or "").split(",") if t] or None
    if args.prefetch:
        return prefetch(tasks or [], args.include_path or "")
    if not args.target:
        raise ConfigError("ftl eval: no MODEL_DIR. Fix: ftl eval outputs/<run>/<time>/model "
                          "--tasks arith")
    settings = {"tasks": tasks, "num_fewshot": args.num_fewshot, "limit": args.limit,
                "batch_size": args.batch_size, "apply_chat_template": args.apply_chat_template,
                "include_path": args.include_path, "gen_kwargs": args.gen_kwargs,
                "shard": args.shard, "before": args.before, "processes": args.processes}
    return ftl_eval(Request(Path(args.target), settings,
                            Path(args.output) if args.output else None))


@verb("submit", "write the run dir and job script and submit it (--dry-run: print it)",
      arg("--dry-run", action="store_true", help="write the run dir and print the job script only"),
      arg("-m", "--multirun", action="store_true",
          help="sweep: one job per combination of comma lists"),
      arg("--doctor", action="store_true",
          help="run ftl doctor's checks first; train if they pass"),
      arg("--eval", metavar="T1,T2",
          help="evaluate the model on these tasks as the job's last step (eval.tasks)"),
      OVERRIDES)
def cmd_submit(args: argparse.Namespace) -> int:
    from launcher.run.submit import submit

    # --doctor: `ftl doctor`'s checks as the job's first step (the key cluster.doctor);
    # --eval: `ftl eval RUN_DIR` as its last (the key eval.tasks).
    overrides = [*args.overrides, "cluster.doctor=true"] if args.doctor else args.overrides
    if args.eval:
        overrides = [*overrides, f"eval.tasks=[{args.eval}]"]
    return submit(overrides, dry_run=args.dry_run, multirun=args.multirun)


@verb("doctor", "start the run's ranks and check what breaks multi-node jobs; one table",
      JSON, OVERRIDES)
def cmd_doctor(args: argparse.Namespace) -> int:
    from launcher.doctor import doctor

    return doctor(args.overrides, as_json=args.json)


@verb("status", "state of a batch job and its run: ftl status RUN_DIR|JOBID", TARGET)
def cmd_status(args: argparse.Namespace) -> int:
    from launcher.run.submit import status

    return status(args.target)


@verb("cancel", "cancel a batch job: ftl cancel RUN_DIR|JOBID", TARGET)
def cmd_cancel(args: argparse.Namespace) -> int:
    from launcher.run.submit import cancel

    return cancel(args.target)


@verb("keys", "every config key with type, default, allowed values and doc: ftl keys [PREFIX]",
      JSON, arg("prefix", nargs="?", default="",
                help="only keys starting with it, e.g. train. or strategy"))
def cmd_keys(args: argparse.Namespace) -> int:
    from launcher.validation.keys import all_keys, keys_json, render, select

    keys = select(all_keys(), args.prefix)
    print(keys_json(keys) if args.json else render(keys), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftl",
        description="Fine-tuning launcher. Overrides are Hydra syntax: model=llama-7b "
        "strategy=zero3 precision=bf16 cluster.nodes=2 train.lr=1e-5",
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, (help_text, _, args) in VERBS.items():
        verb_parser = sub.add_parser(name, help=help_text, description=help_text)
        for flags, options in args:
            verb_parser.add_argument(*flags, **options)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # argparse fills a verb's positionals in one go, so overrides after an option
    # (`ftl quantize DIR -o OUT dataset=chat`) come back unmatched: they are overrides too.
    args, extra = parser.parse_known_args(argv)
    if extra and (not hasattr(args, "overrides") or any(a.startswith("-") for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return VERBS[args.verb][1](args)
    except (ConfigError, DataError) as error:
        print(f"ftl {args.verb}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
