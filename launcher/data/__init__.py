"""Data: row formats, the streaming scan, encoding and packing, the tokenized cache."""
