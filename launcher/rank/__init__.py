"""The rank side: what `python -m launcher.rank.worker RUN_DIR` runs on every process."""
