"""The validation stage: every problem of a composed config (its rules, this machine's
sources and space, the scheduler's rules, the estimate's fit) collected into one
ConfigError before anything is written; `ftl keys` reads its allowed values. It sits above
the estimator, the engines and the schedulers, whose rules it asks."""
