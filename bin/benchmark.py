#!/usr/bin/env python
"""Scaling benchmark against TF's default layout and the bound; the console script disttrain-benchmark.

From a checkout: `python bin/benchmark.py --help`. Flags and behaviour: disttrain/scripts/benchmark.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.benchmark import run  # noqa: E402

if __name__ == "__main__":
    run()
