"""`ftl doctor`: what breaks multi-node jobs, checked on the run's own world before training.

The run's own launch command starts `python -m launcher.doctor.rank RUN_DIR` on every rank
instead of the worker; verb.py launches, rank.py joins and measures (facts.py,
bandwidth.py), checks.py judges (pure). The flow and the checks: docs/design.md "The ranks".
"""

DOCTOR_MODULE = "launcher.doctor.rank"
