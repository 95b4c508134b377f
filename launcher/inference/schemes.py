"""The INT8 schemes `ftl quantize` offers, apart so that the CLI reads them without importing
torch (int8.py implements them; the file format and what each scheme does: docs/design.md
"After training")."""

SCHEMES = ("absmax", "zeropoint", "clip")
GRANULARITIES = ("tensor", "channel")
