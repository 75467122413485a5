"""Command-line entry points (console scripts and bin/): absl flags in, library calls out.

Each module defines its flags and a `run()` for its console script; the
library below never reads flags.
"""
