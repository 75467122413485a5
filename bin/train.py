#!/usr/bin/env python
"""Start any role of a disttrain cluster (ps, worker, chief, evaluator); the console script disttrain-train.

From a checkout: `python bin/train.py --help`. Flags and behaviour: disttrain/scripts/train.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.train import run  # noqa: E402

if __name__ == "__main__":
    run()
