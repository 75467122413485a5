"""disttrain's one logger, its console format, and TensorFlow kept quiet.

Library modules log through `logging.getLogger("disttrain")` with levels;
the entry points call `to_console()` once. The console format is defined
here and nowhere else, and `message_of` reads a line of it back (the
benchmark and `launch_local` read the tasks' log files).

`DISTTRAIN_TF_LOGS=1` keeps everything TensorFlow prints (its C++ start-up
lines are dropped by `disttrain/base/quiet.py`, its Python deprecation notices
here), for debugging.
"""

from __future__ import annotations

import logging
import re
import sys

from disttrain.base.quiet import tf_logs_wanted

NAME = "disttrain"
FORMAT = "%(asctime)s %(levelname)s %(message)s"
DATE_FORMAT = "%H:%M:%S"

# A line of FORMAT read back: the placeholders become patterns, the rest is literal.
_FIELDS = {
    "%(asctime)s": re.sub(r"%[a-zA-Z]", r"\\d+", re.escape(DATE_FORMAT)),
    "%(levelname)s": r"(?P<level>[A-Z]+)",
    "%(message)s": r"(?P<message>.*)",
}
_LINE = re.compile(
    "^" + "".join(_FIELDS.get(part, re.escape(part)) for part in re.split(r"(%\(\w+\)s)", FORMAT)) + "$"
)


def message_of(line: str) -> str | None:
    """The message of a console line disttrain wrote, or None for anything else."""
    m = _LINE.match(line.rstrip("\r\n"))
    return m["message"] if m else None


class _DeprecationNotices(logging.Filter):
    """Drops TensorFlow's "is deprecated and will be removed" notices (v1 APIs are the point here)."""

    def filter(self, record):
        return "deprecated" not in record.getMessage()


_QUIET = _DeprecationNotices()


def to_console(stream=None, level: int = logging.INFO) -> logging.Logger:
    """Show disttrain's messages on `stream` (stdout) in FORMAT; quiet TensorFlow's logger. Idempotent."""
    logger = logging.getLogger(NAME)
    logger.setLevel(level)
    if not any(getattr(h, "_disttrain", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stdout)
        handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        handler._disttrain = True
        logger.addHandler(handler)
        logger.propagate = False  # absl's root handler would print every line twice
    quiet_tensorflow()
    return logger


def quiet_tensorflow() -> None:
    """TensorFlow's Python logger without its INFO lines and deprecation notices. Idempotent.

    Every entry point calls it (`scripts.run`), so a command that builds a
    graph in its own process (the benchmark, the planner) prints no notices.
    """
    if tf_logs_wanted():
        return
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.setLevel(logging.WARNING)  # its INFO lines narrate every checkpoint
    if _QUIET not in tf_logger.filters:
        tf_logger.addFilter(_QUIET)
