"""A network namespace whose only interface is a loopback: a local cluster nobody else can reach.

TensorFlow's gRPC server listens on every interface of its host (the address
in the cluster spec only tells the peers where to connect; TF 2.21 binds
the port on the wildcard address, with no setting to change it), and it
runs any graph it is sent, without authentication. A local cluster's tasks
started inside a namespace of their own, holding only `lo`, are reachable
from each other and from nothing else. Making one needs CAP_SYS_ADMIN
(root); elsewhere `open()` says why it could not, and the tasks share the
machine's network. Linux only; nothing here imports TensorFlow.
"""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import sys

from disttrain.edges.local import die_with_parent

CLONE_NEWNET = 0x40000000

# The holder: a process alone in a new namespace, with `lo` up, that lives until the launcher closes
# its stdin (or dies). Tasks join its namespace; the namespace goes when the last of them exits.
_HOLDER = r"""
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 15)  # PR_SET_PDEATHSIG: SIGTERM when the launcher dies
if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET
    print("cannot create a network namespace:", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # lo up: SIOCGIFFLAGS, then SIOCSIFFLAGS
    flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0)))[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
print("ready", flush=True)
sys.stdin.read()
"""


class PrivateNetwork:
    """A namespace with only a loopback, held open by a child process; `popen` starts tasks inside it.

    `open()` returns False, with the reason in `why_not`, where no namespace
    can be made (no root, a container without CAP_SYS_ADMIN, not Linux).
    """

    def __init__(self, wait_secs: float = 10.0):
        self._wait = wait_secs
        self.holder: subprocess.Popen | None = None
        self.why_not = ""

    def open(self) -> bool:
        try:
            self.holder = subprocess.Popen(
                [sys.executable, "-c", _HOLDER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=die_with_parent,
            )
        except OSError as e:
            self.why_not = str(e)
            return False
        ready, _, _ = select.select([self.holder.stdout], [], [], self._wait)
        line = self.holder.stdout.readline().strip() if ready else "no answer"
        if line != "ready":
            self.why_not = line or f"exit code {self.holder.wait()}"
            self.close()
            return False
        return True

    @property
    def path(self) -> str:
        """The namespace, as a file a process can join."""
        return f"/proc/{self.holder.pid}/ns/net"

    def popen(self, task, argv, env, log_file) -> subprocess.Popen:
        """LocalCluster's `popen`: the task's process, inside the namespace."""
        path = self.path

        def enter():
            die_with_parent()
            fd = os.open(path, os.O_RDONLY)
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"cannot join the network namespace {path}")
            os.close(fd)

        return subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=enter)

    def close(self) -> None:
        if self.holder is None:
            return
        holder, self.holder = self.holder, None
        holder.stdin.close()  # the holder's cue to exit
        try:
            holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()

    def __enter__(self) -> PrivateNetwork:
        if not self.open():
            raise RuntimeError(f"no private network namespace: {self.why_not}")
        return self

    def __exit__(self, *exc) -> None:
        self.close()
