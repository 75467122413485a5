#!/usr/bin/env python
"""Start a whole disttrain cluster on this machine; the console script disttrain-launch-local.

From a checkout: `python bin/launch_local.py --help`. Flags and behaviour: disttrain/scripts/launch_local.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.launch_local import run  # noqa: E402

if __name__ == "__main__":
    run()
