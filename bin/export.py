#!/usr/bin/env python
"""Export a model_zoo run's checkpoint as a SavedModel; the console script disttrain-export.

From a checkout: `python bin/export.py --help`. Flags and behaviour: disttrain/scripts/export.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.export import run  # noqa: E402

if __name__ == "__main__":
    run()
