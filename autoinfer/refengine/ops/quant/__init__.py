"""Dequantization of GGUF blocks in torch (multi-threaded, or on the GPU), checked against gguf.quants."""
