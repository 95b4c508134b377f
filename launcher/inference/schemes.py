"""The INT8 schemes `ftl quantize` offers, apart so that the CLI reads them without importing
torch (int8.py implements them and the file format; what each scheme does: docs/guide.md,
"After training: quantize and chat")."""

SCHEMES = ("absmax", "zeropoint", "clip")
GRANULARITIES = ("tensor", "channel")
