"""`ftl eval` and `eval.tasks`: benchmarks on lm-evaluation-harness, offline, written into
the run dir (RUN_DIR/eval/<timestamp>/). models.py: what can be evaluated and how the
harness gets it; harness.py: one evaluation and its files; verb.py: the verb, a run's
evaluation after training, `--prefetch`; processes.py and worker.py: data-parallel
evaluation (eval.processes) under `accelerate launch`; trackers.py: the scores in the run's
trackers.
The tasks and their offline loading:
launcher/data/eval_tasks.py; the rules: launcher/validation/evaluation.py."""
