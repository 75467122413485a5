#!/usr/bin/env python
"""Transport ceilings on emulated hosts; the console script disttrain-link-probe.

From a checkout: `python bin/link_probe.py --help`. Flags and behaviour: disttrain/scripts/link_probe.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.link_probe import run  # noqa: E402

if __name__ == "__main__":
    run()
