"""Command-line entry points (console scripts and bin/): absl flags in, library calls out.

Each module defines its flags and a `run()` for its console script; the
library below never reads flags.

May import: base, graph, strategies, runtime, launch, api, model_zoo, edges, plan and bench.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app, flags

from disttrain.base import logs


def run(main: Callable[[list[str]], int | None]) -> None:
    """`app.run(main)`, with `--help` showing the docstring and flags of main's module.

    absl's `--help` shows the main module's docstring and key flags; the main
    module is often not the one that defines the flags (a bin/ script, a
    console-script shim). The defining module's flags become the main
    module's key flags (absl names `__main__` by `sys.argv[0]`), and its
    docstring the help text. Under `python -m` both are the same module.
    """
    module = sys.modules[main.__module__]
    defined_by = sys.argv[0] if module.__name__ == "__main__" else module.__name__
    for flag in flags.FLAGS.get_key_flags_for_module(defined_by):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    entry = sys.modules["__main__"]
    if entry is not module:
        entry.__doc__ = module.__doc__
    logs.quiet_tensorflow()
    app.run(main)
