"""What the user chose, typed: the schema, composing configs/ with overrides, the strategy
table, the GPU presets, parameter counts from the architecture numbers, tracker names. The
bottom of the stack above rundir/: it imports no other stage."""
