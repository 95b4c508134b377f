"""From a validated config to a running job on this machine: the plan, the command,
the run dir written atomically, the supervised launch, and the report of a run."""
