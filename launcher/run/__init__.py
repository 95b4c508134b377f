"""From a validated config to a running job: the plan, the run dir written atomically,
the supervised local launch, `ftl submit/status/cancel` through a scheduler, and the
report of a run."""
