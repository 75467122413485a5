#!/usr/bin/env python
"""Time to a held-out accuracy target, one process beside each strategy; console script disttrain-accuracy.

From a checkout: `python bin/accuracy.py --help`. Flags and behaviour: disttrain/scripts/accuracy.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.accuracy import run  # noqa: E402

if __name__ == "__main__":
    run()
