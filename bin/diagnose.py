#!/usr/bin/env python
"""Why is my training slow? A run's verdict and the changes ranked; the console script disttrain-diagnose.

From a checkout: `python bin/diagnose.py LOGDIR`. Behaviour: disttrain/scripts/diagnose.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.diagnose import run  # noqa: E402

if __name__ == "__main__":
    run()
