"""Scaling benchmark: local or emulated hosts, TF's default side by side, the physical bound.

May import: base, graph, strategies, runtime, launch, api, model_zoo, edges and plan.
The core never imports the benchmark.
"""
