"""The Trainer callbacks the worker installs, one job per module. They run on every rank;
only rank 0 writes the shared files, but every rank must reach the same barriers, so
nothing here returns early before a collective.
"""
