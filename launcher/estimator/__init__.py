"""The cost of a run before it starts: FLOPs and time, per-rank memory (states and
peak moments), disk, strategy=auto's ladder and choice, the estimate table."""
