"""After training: INT8 quantization and chat."""
