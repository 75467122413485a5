"""disttrain's tests: unit/ (no servers), cluster/ (real processes), netem/ (root), bench/, slow/."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout under test
