"""ftlaunch: compose a fine-tuning run, check it, plan it, and launch it."""

__version__ = "0.1.0"
