"""Config and validation: the schema, composing configs/ with overrides, the rules, the
strategy table, the one validation stage and its checks of this machine."""
