"""The runtime: one task's life around the graph a strategy built.

Servers and peers (`peers`), a PS task's serving and the queues on the PS
tasks (`ps_serving`), the thread that ends a wait that cannot end
(`watchdog`), the chief's session and preemption (`recovery`), one
replica's graph and monitored session (`trainer`), throughput and its
TensorBoard scalars (`metrics`), the evaluator (`evaluation`) and export to
a SavedModel (`exporting`).

May import: base, graph and strategies.
"""
