"""Benchmarks. ``graphattn bench`` (:mod:`graphattn.bench.decode`) is the decode workload
through a chosen backend in eager, full-graph and breakable-graph modes;
:mod:`graphattn.bench.kernels` times the raw kernel paths. Performance lives here, never in
timed tests.
"""
