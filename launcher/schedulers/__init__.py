"""Batch schedulers behind one seam (base.py): `ftl submit`, `ftl status`, `ftl cancel`."""
