#!/usr/bin/env python
"""Regenerate README's and docs/' tables from the report files; the console script disttrain-tables.

From a checkout: `python bin/tables.py --help`. Flags and behaviour: disttrain/scripts/tables.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's disttrain

from disttrain.scripts.tables import run  # noqa: E402

if __name__ == "__main__":
    run()
