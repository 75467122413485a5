"""The base layer: what every other layer stands on, and no TensorFlow graph of its own.

The errors that end a task and their exit codes (`errors`), the cluster as
one task sees it (`cluster`), how a run goes (`config`: `RunSettings`,
`TrainConfig`), every wait's bound derived from the settings (`deadlines`),
the SIGTERM notice (`preemption`), this machine's cores and their load
(`machine`), TensorFlow's error texts read for who was lost (`tf_errors`),
the one logger (`logs`), TensorFlow's start-up lines kept off the console
(`quiet`) and every private TensorFlow name disttrain uses (`tf_internals`).

May import: nothing of disttrain's.
"""
