"""Kernels of the reference engine, each variant beside the naive reference it is tested against."""
