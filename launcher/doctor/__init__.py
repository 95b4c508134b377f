"""`ftl doctor`: what breaks multi-node jobs, checked on the run's own world before training.
verb.py launches DOCTOR_MODULE instead of the worker on every rank, rank.py joins and
measures, checks.py judges (pure); the flow and the checks: docs/design.md "The ranks".
"""

DOCTOR_MODULE = "launcher.doctor.rank"
