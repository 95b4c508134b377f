"""The Trainer callbacks the worker installs, one job per module: metrics.py (log events,
start-up and finish phases, the launch record), tokens.py (tokens seen without a
collective per micro-batch), checkpoint_marker.py (COMPLETE markers, save times),
memory.py (peak memory per rank). An engine adds its own (Engine.callbacks).

Callbacks run on every rank; only rank 0 writes the shared files, but every rank must
reach the same barriers, so nothing here returns early before a collective.
"""
