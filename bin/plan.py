#!/usr/bin/env python
"""Scaling planner: predicted bytes per link, step time, efficiency, bottleneck and what to change.

From a checkout: `python bin/plan.py --help`. Flags and behaviour: disttrain/scripts/plan.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.plan import run  # noqa: E402

if __name__ == "__main__":
    run()
