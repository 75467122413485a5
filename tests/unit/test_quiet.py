"""TensorFlow's start-up lines stay off stderr on any CPU; every other line gets through.

On a CPU where TensorFlow prints nothing at start-up, a quiet import proves
nothing, so the subprocess below writes such lines to fd 2 itself while
disttrain imports TensorFlow, as TensorFlow does on AVX512_VNNI/BF16 machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

from disttrain.base import quiet
from tests import REPO

# Written by TensorFlow 2.21 on an AMD EPYC with AVX512_VNNI/AVX512_BF16 (import, then server start).
TF_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795555830.127336   10677 port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors from different "
    "computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795555830.187200   10677 cpu_feature_guard.cc:227] This TensorFlow binary is optimized "
    "to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI FMA, in other "
    "operations, rebuild TensorFlow with the appropriate compiler flags.",
    "I0000 00:00:1795555834.612592   10906 mlir_graph_optimization_pass.cc:437] MLIR V1 optimization pass "
    "is not enabled",
    "I0000 00:00:1795555834.490960   10677 grpc_server_lib.cc:467] Started server with target: "
    "grpc://127.0.0.1:54787",
    "I1124 21:30:42.123456   10677 external/local_xla/xla/tsl/port.cc:153] oneDNN custom operations "
    "are on. You may see slightly different numerical results.",
]

# Lines that must get through: real errors, TF lines not in the list, a user's own output.
KEPT_LINES = [
    "F0000 00:00:1795555830.187200   10677 cpu_feature_guard.cc:100] The TensorFlow library was compiled "
    "to use AVX512F instructions, but these aren't available on your machine.",
    "E0000 00:00:1795555834.490960   10677 grpc_server_lib.cc:467] Could not start gRPC server",
    "I0000 00:00:1795555834.612291   10906 master.cc:243] Scanning workers for devices: 1 total workers",
    "WARNING: something else before absl::InitializeLog()",
    "Traceback (most recent call last):",
    "UserWarning: oneDNN custom operations are on. (a user's line that quotes TensorFlow)",
    "",
]


def test_the_list_drops_tf_start_up_lines_and_nothing_else():
    assert [line for line in TF_LINES if not quiet.is_start_up_line(line.encode())] == []
    assert [line for line in KEPT_LINES if quiet.is_start_up_line(line.encode())] == []


def test_forward_keeps_every_other_line_in_order_and_a_last_line_without_newline():
    text = "\n".join(TF_LINES[:2] + KEPT_LINES[:3] + TF_LINES[2:] + ["no newline at the end"])
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()

    def feed():  # in pieces that cut lines, as C++ writes can
        data = text.encode()
        for i in range(0, len(data), 37):
            os.write(write_end, data[i : i + 37])
        os.close(write_end)

    feeder = threading.Thread(target=feed)
    feeder.start()
    forward = threading.Thread(target=lambda: (quiet.forward(read_end, out_write), os.close(out_write)))
    forward.start()
    with os.fdopen(out_read, "rb") as f:
        got = f.read().decode()
    feeder.join()
    forward.join()
    os.close(read_end)
    assert got == "\n".join(KEPT_LINES[:3]) + "\nno newline at the end"


# Writes TF_LINES and other lines to fd 2 while disttrain imports TensorFlow (and only then).
NOISY_IMPORT = textwrap.dedent(
    """
    import os, sys, warnings
    LINES = {lines!r}

    class Noisy:
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow":
                sys.meta_path.remove(self)
                {during}
            return None

    sys.meta_path.insert(0, Noisy())
    os.write(2, b"before the import\\n")
    import disttrain
    os.write(2, b"after the import\\n")
    """
)


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("DISTTRAIN_TF_LOGS", "TF_CPP_MIN_LOG_LEVEL")
    } | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def noisy_import(**env) -> subprocess.CompletedProcess:
    during = textwrap.indent(
        textwrap.dedent(
            """
            for line in LINES[:3]:
                os.write(2, line.encode() + b"\\n")
            os.write(2, b"a normal line from C\\n")
            warnings.warn("a Python warning during the import")
            for line in LINES[3:]:
                os.write(2, line.encode() + b"\\n")
            """
        ),
        " " * 12,
    ).strip()
    return run_python(NOISY_IMPORT.format(lines=TF_LINES, during=during), **env)


def test_tf_start_up_lines_written_during_the_import_are_dropped_and_the_rest_kept():
    r = noisy_import()
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert not [line for line in lines if line in TF_LINES], r.stderr
    assert lines[0] == "before the import" and lines[1] == "a normal line from C", r.stderr
    assert any("UserWarning: a Python warning during the import" in line for line in lines), r.stderr
    assert lines[-1] == "after the import", r.stderr


def test_with_disttrain_tf_logs_nothing_is_dropped():
    r = noisy_import(DISTTRAIN_TF_LOGS="1")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert [line for line in TF_LINES if line not in lines] == [], r.stderr  # (TF's own may come too)
    assert "a normal line from C" in lines and lines[-1] == "after the import", r.stderr


def test_an_error_inside_the_window_reaches_stderr_and_fd_2_is_restored():
    during = 'os.write(2, b"F0000 00:00:1.2 7 cpu_feature_guard.cc:1] fatal\\\\n"); raise ImportError("boom")'
    r = run_python(NOISY_IMPORT.format(lines=TF_LINES, during=during))
    assert r.returncode == 1
    assert "F0000 00:00:1.2 7 cpu_feature_guard.cc:1] fatal" in r.stderr, r.stderr
    assert "Traceback" in r.stderr and "ImportError: boom" in r.stderr, r.stderr


def test_import_disttrain_prints_nothing():
    r = run_python("import disttrain")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (r.stdout, r.stderr) == ("", ""), r.stderr
