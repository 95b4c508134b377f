"""`ftl doctor`: what breaks multi-node jobs, checked on the run's own world before training.

The run's config is composed and validated like `ftl train` (or `ftl submit`), its run dir
written, and its own launch command (same launcher, nodes and ranks) starts
`python -m launcher.doctor.rank RUN_DIR` on every rank instead of the worker. Each rank
joins the process group with the run's backend within `cluster.startup_timeout_s`
(launcher/rank/startup.py), reports what it sees (facts.py) and takes part in the
all-reduce timings (bandwidth.py: collectives, every rank in them). Rank 0 judges the
reports (checks.py, pure), writes RUN_DIR/doctor.json and the ranks end; then
`ftl doctor` (verb.py) or, in a batch job, `python -m launcher.doctor RUN_DIR` prints the
one table (or `--json`) and exits non-zero when a check failed.

The checks: every rank joined; all-reduce bus bandwidth from 1 MiB to 256 MiB within each
node and across nodes against the preset's figure; the same torch / CUDA / NCCL / driver
versions on every node; the GPUs each rank sees; the output directory is the same
directory on every node (rank 0 writes a random token there, every rank reads it back);
free space there for the run's checkpoints and final model (estimator/disk.py); the
tokenized-data cache visible from every node (the same token in its cache root).
"""

DOCTOR_MODULE = "launcher.doctor.rank"
