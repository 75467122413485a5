"""TensorFlow's start-up lines kept off the console and the task logs.

Some of what TensorFlow's C++ side writes while it loads and while a gRPC
server starts comes before absl's logging is initialised, so
`TF_CPP_MIN_LOG_LEVEL` does not reach it; whether it appears at all depends
on the CPU (oneDNN is turned on for AVX512_VNNI/BF16 machines). `tf_start_up()`
filters file descriptor 2 itself for the length of a block: a small helper
process reads what the block writes and forwards every line except those in
START_UP_LINES. The helper is a process, not a thread, so it never waits for
the GIL that TensorFlow's import holds, and it forwards everything it has
read even if this process aborts inside the block.

It does not change what TensorFlow does (oneDNN stays as TensorFlow chose),
and it drops nothing outside the blocks or outside the list.
`DISTTRAIN_TF_LOGS=1` turns it off. This file is also the helper: run by path
with `python -I -S`, it needs nothing beyond the standard library.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

# absl's prefix of a C++ log line: level (only INFO and WARNING are ever dropped), date, time, thread, file.
_ABSL = r"[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ (?:\S+/)?"

# Every line dropped, whole (checked on TensorFlow 2.21); any other line passes.
START_UP_LINES = (
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    _ABSL + r"port\.cc:\d+\] oneDNN custom operations are on\. .*",
    _ABSL + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU "
    r"instructions in performance-critical operations\.",
    # The second line of the cpu_feature_guard message above.
    r"To enable the following instructions: [A-Za-z0-9_ ]+, in other operations, "
    r"rebuild TensorFlow with the appropriate compiler flags\.",
    _ABSL + r"mlir_graph_optimization_pass\.cc:\d+\] MLIR V1 optimization pass is not enabled",
    _ABSL + r"\S+\.cc:\d+\] disabling MLIR crash reproducer, set env var "
    r"`MLIR_CRASH_REPRODUCER_DIRECTORY` to enable\.",
    _ABSL + r"grpc_server_lib\.cc:\d+\] Started server with target: grpc://\S+",
)
_DROPPED = re.compile("|".join(f"(?:{p})" for p in START_UP_LINES))
_WAIT_SECS = 5.0  # for the helper to forward what is left; longer only if a child holds the pipe


def tf_logs_wanted() -> bool:
    return os.environ.get("DISTTRAIN_TF_LOGS", "0") not in ("", "0")


def is_start_up_line(line: bytes) -> bool:
    """True for a line (without its newline) that is one of TensorFlow's START_UP_LINES."""
    return _DROPPED.fullmatch(line.rstrip(b"\r").decode("utf-8", "replace")) is not None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def forward(source: int = 0, sink: int = 1) -> None:
    """Copy `source` to `sink` until end of file, line by line, without START_UP_LINES."""
    pending = b""
    while chunk := os.read(source, 1 << 16):
        *lines, pending = (pending + chunk).split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not is_start_up_line(line))
        if kept:
            _write_all(sink, kept)
    if pending and not is_start_up_line(pending):
        _write_all(sink, pending)


def _flush_stderr() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()


@contextlib.contextmanager
def tf_start_up():
    """Drop TensorFlow's START_UP_LINES from file descriptor 2 while the block runs.

    Everything else written to fd 2 in the block, by Python or C++, reaches
    the real fd 2 in order before the block ends. Does nothing with
    DISTTRAIN_TF_LOGS=1, or if the helper cannot start (then nothing is dropped).
    """
    helper_script = os.path.abspath(__file__)
    if tf_logs_wanted() or not sys.executable or not os.path.isfile(helper_script):  # (a zipped install)
        yield
        return
    _flush_stderr()
    try:
        read_end, write_end = os.pipe()
    except OSError:
        yield
        return
    try:
        # Its own session: a Ctrl-C meant for this process must not end the helper first.
        helper = subprocess.Popen(
            [sys.executable, "-I", "-S", helper_script],
            stdin=read_end,
            stdout=2,
            stderr=2,
            start_new_session=True,
        )
        saved = os.dup(2)
    except OSError:
        os.close(read_end)
        os.close(write_end)
        yield
        return
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)  # closes the pipe's last write end here: the helper reads to its end and exits
        os.close(saved)
        with contextlib.suppress(subprocess.TimeoutExpired):
            helper.wait(timeout=_WAIT_SECS)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    forward()
