"""Weight-only quantized weights on CPU: GGUF blocks kept as stored (weights.py, gguf.py)
and the projections and embedding lookup that run on them (linear.py)."""
