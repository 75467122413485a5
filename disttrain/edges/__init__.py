"""The edges: where flags, gin files, the model zoo and local processes meet the library.

Flags and gin files to library calls, errors to one line and an exit code
(`cli`), the gin registrations (`configurables`), a model_zoo run of each
role over `disttrain.launch` (`zoo_run`), a whole cluster as local
processes (`local`) and a private network namespace for one
(`private_network`). Only the edges and the console scripts
(`disttrain.scripts`) import gin or absl.

May import: base, graph, strategies, runtime, launch, api and model_zoo.
"""
