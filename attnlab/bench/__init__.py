"""Benchmarks (apart from tests): ``python -m attnlab.bench.kernels`` compares attention backends."""
