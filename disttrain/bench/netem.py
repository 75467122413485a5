"""Emulated hosts on one Linux machine: a network namespace per host, shaped links.

Each host gets its own network namespace with an interface `eth0` whose link into
a shared bridge is shaped with tc tbf in both directions (and optionally delayed
with tc netem), so separate processes (TF gRPC servers, workers) talk over a real
kernel TCP path with a bounded rate instead of loopback. Nothing is created in the
root namespace: the bridge lives in a namespace of its own and both ends of every
veth pair are created directly inside their namespaces, so the machine's real
network, routes and interfaces are never touched.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 (`ip`, `tc`) and a kernel
with veth, bridge, sch_tbf, sch_htb, bfifo and cls_u32; latency_ms > 0 also needs
sch_netem (which some kernels, e.g. this project's CI VMs, lack; check_permitted(
latency=True) tells). Stdlib only: this module must not import TensorFlow.

Namespaces are named `<prefix>-<pid>-<k>-<i>` (host i) and `<prefix>-<pid>-<k>-br`
(bridge), with the pid of the creating process and k counting its instances (so
one process may hold several at once), so `cleanup_stale(prefix)` can recognise
and remove the leftovers of a run that was killed with SIGKILL.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Self  # 3.11+, only for type checkers

HOST_IF = "eth0"  # the host's interface, inside its own namespace
_NETNS_DIR = "/run/netns"  # where `ip netns add` binds each namespace
_BRIDGE = "br0"
_SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # /24s are picked from here
_CMD_TIMEOUT = 30.0
_SMALL_LIMIT = 128 * 1024  # bytes queued in the small-packet band (~1000 ACKs)
_HINTS = (  # stderr fragment -> how to fix it
    ("Operation not permitted", "run as root (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"),
    ("Permission denied", "run as root (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"),
    ("qdisc kind is unknown", "the kernel lacks sch_tbf or sch_htb: modprobe sch_tbf sch_htb"),
    ("filter kind is unknown", "the kernel lacks cls_u32: modprobe cls_u32"),
    ("Unknown device type", "the kernel lacks veth/bridge: `modprobe veth bridge`"),
    ("File exists", "a leftover of an earlier run: call cleanup_stale(prefix)"),
)
# Checked first where netem is used: an unknown qdisc there is most likely netem.
_NETEM_HINTS = (
    (
        "qdisc kind is unknown",
        "latency_ms > 0 needs sch_netem, which this kernel lacks: "
        "modprobe sch_netem (CONFIG_NET_SCH_NETEM), or use latency_ms=0",
    ),
    *_HINTS,
)


class NetemError(RuntimeError):
    """Building or using emulated hosts failed; the message says what and how to fix."""


def _run(argv: list[str], what: str, stdin: str | None = None, hints=_HINTS) -> str:
    """Run an iproute2 command and return its stdout; one-line NetemError if it fails."""
    try:
        kw = {"capture_output": True, "text": True, "timeout": _CMD_TIMEOUT, "check": False}
        proc = subprocess.run(argv, input=stdin, **kw)
    except FileNotFoundError:
        raise NetemError(f"{what}: `{argv[0]}` not found; apt-get install -y iproute2") from None
    except subprocess.TimeoutExpired:
        raise NetemError(f"{what}: `{' '.join(argv)}` hung for {_CMD_TIMEOUT:.0f}s") from None
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        fix = next((h for frag, h in hints if frag in err), "see the error above")
        raise NetemError(f"{what}: `{' '.join(argv)}` failed: {err}; {fix}")
    return proc.stdout


class TbfParams(NamedTuple):
    """How one host link is shaped; see tbf_params for why these values."""

    rate_bit: int  # link rate in bit/s, counted on Ethernet frames (headers included)
    burst: int  # bytes of tokens an idle link may save up
    host_limit: int  # bytes queued on the host's egress, its "NIC queue"
    port_limit: int  # bytes queued on the bridge port towards the host, a switch port


def tbf_params(link_mbit: float, latency_ms: float = 0.0) -> TbfParams:
    """tbf settings for a link of link_mbit Mbit/s, and why.

    rate: tbf counts whole Ethernet frames, so TCP goodput is ~0.95 of link_mbit
    (1448 payload bytes per 1514-byte frame), as on a real link of that speed.

    burst: tokens that may accumulate while the link idles. It must cover the gap
    between two dequeues, or tokens are lost and the link runs below its rate: the
    classic rule is rate/HZ (4 ms at HZ=250; tbf sleeps on an hrtimer nowadays, but a
    shared VM can still be late by a few ms), so 5 ms of traffic, and at least
    32 KiB. Below ~100 Mbit/s that is less than a 64 KiB GSO super-packet, which tbf
    then splits into frames itself: delivery stays smooth (no 64 KiB lumps, 26 ms
    each at 20 Mbit/s) and TSO/GSO need not be switched off, so `ethtool` is not
    needed. Above that, super-packets pass whole, which saves CPU where it matters.
    The price of the burst is a line-rate spurt after idling: 32 KiB at 20 Mbit/s is
    13 ms, 0.6% of a 5 MB transfer.

    host_limit: the sender's own queue, its NIC. Local TCP is held back there by TCP
    Small Queues (up to a few 100 KiB per socket while a flow starts), not by drops,
    as with a real NIC: a queue smaller than that drops frames that TCP then
    retransmits for nothing. So at least 1 MiB (several sockets), or 20 ms of
    traffic plus the round trip that latency_ms adds (netem hides the queue from
    TCP Small Queues, so it must then hold the bandwidth-delay product).

    port_limit: the switch port's buffer, where senders converging on one receiver
    meet; drops here are real congestion, as on a switch. 20 ms of traffic, so TCP
    keeps the link busy without a bufferbloated queue, and at least 256 KiB (~170
    frames), so the initial windows of 16 senders starting at once (incast, e.g.
    workers pushing to one parameter server) fit, as in a real switch's buffer.
    """
    if not link_mbit > 0:
        raise NetemError(f"link_mbit must be > 0, got {link_mbit!r}")
    if not latency_ms >= 0:
        raise NetemError(f"latency_ms must be >= 0, got {latency_ms!r}")
    rate_bit = round(link_mbit * 1e6)
    per_s = rate_bit / 8  # bytes per second
    burst = max(32 * 1024, math.ceil(per_s * 0.005))
    queue = math.ceil(per_s * (0.020 + 2 * latency_ms / 1000))
    return TbfParams(
        rate_bit=rate_bit,
        burst=burst,
        host_limit=burst + max(queue, 1 << 20),
        port_limit=burst + max(math.ceil(per_s * 0.020), 256 * 1024),
    )


def _shape_cmds(dev: str, p: TbfParams, limit: int, latency_ms: float) -> list[str]:
    """tc batch lines shaping egress of `dev`: netem (if latency_ms > 0), tbf, priority.

    Under the tbf sits a two-band strict priority queue (htb with two leaves whose
    rates, 4x the link, never bind): IPv4 packets shorter than 128 bytes (pure TCP
    ACKs, SYNs, tiny RPCs) leave before bulk data, as with fq_codel's sparse-flow
    boost on real hosts. Without it the ACKs of a flow wait behind the opposite
    flow's data in the same queue (the few 100 KiB TCP Small Queues lets a socket
    keep there, ~100 ms at 20 Mbit/s), and a flow running against another one
    loses much of its rate.
    """
    hi = 4 * p.rate_bit
    leaf = f"htb rate {hi}bit burst {p.burst} cburst {p.burst} quantum 60000"
    tbf_parent = "root"
    cmds = []
    if latency_ms > 0:
        # netem first, tbf below it: the layout `man tc-netem` gives for rate control.
        # netem's limit counts packets and must hold everything in flight during the
        # delay; 1 packet per 500 bytes over-provisions for small frames.
        pkts = 1000 + math.ceil(p.rate_bit / 8 * (latency_ms / 1000 + 0.020) / 500)
        cmds.append(f"qdisc add dev {dev} root handle 5: netem delay {latency_ms}ms limit {pkts}")
        tbf_parent = "parent 5:1"
    return cmds + [
        f"qdisc add dev {dev} {tbf_parent} handle 1: tbf rate {p.rate_bit}bit burst {p.burst} limit {limit}",
        f"qdisc add dev {dev} parent 1:1 handle 2: htb default 20",
        f"class add dev {dev} parent 2: classid 2:10 {leaf} prio 0",
        f"class add dev {dev} parent 2: classid 2:20 {leaf} prio 1",
        f"qdisc add dev {dev} parent 2:10 handle 10: bfifo limit {_SMALL_LIMIT}",
        f"qdisc add dev {dev} parent 2:20 handle 20: bfifo limit {limit}",
        # IPv4 total length (bytes 2-3 of the header) below 128; all else is bulk.
        f"filter add dev {dev} parent 2: protocol ip prio 1 u32 match u16 0 0xff80 at 2 flowid 2:10",
    ]


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], "listing network namespaces")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks; PermissionError means it exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _delete_ns(name: str) -> None:
    """Kill whatever still runs inside namespace `name`, then delete it.

    Processes left inside would keep the namespace (and its veth ends) alive
    after `ip netns del` merely unmounts its name.
    """
    try:
        pids = _run(["ip", "netns", "pids", name], f"listing processes in {name}").split()
    except NetemError:
        pids = []
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _run(["ip", "netns", "del", name], f"deleting namespace {name}")


def cleanup_stale(prefix: str = "dt") -> list[str]:
    """Remove namespaces `<prefix>-<pid>-<k>-*` whose creating process no longer exists.

    For runs that died without cleaning up (SIGKILL, OOM killer, power loss of the
    session). Namespaces of live creators are left alone, so concurrent runs are
    safe. Caveat: if the dead creator's pid has been reused by a new process, its
    namespaces look alive and are kept. Returns the names removed.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-\d+-(?:br|\d+)$")
    removed = []
    for name in _netns_list():
        m = pattern.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _delete_ns(name)
            removed.append(name)
    return removed


def check_permitted(latency: bool = False) -> str | None:
    """None if emulated hosts can be built here, else a one-line reason why not.

    Probes for real: builds and removes a throwaway namespace with a bridge and a
    veth pair shaped exactly as the hosts' links are, since root alone does not
    guarantee netns, veth or the qdiscs (containers, minimal kernels). With
    latency=True, also checks for sch_netem.
    """
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces and tc); run as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found; install iproute2 (apt-get install -y iproute2)"
    name = f"dtprobe-{os.getpid()}-{next(_serial)}-0"
    try:
        _run(["ip", "netns", "add", name], "creating a network namespace")
        try:
            links = "link add name pa type veth peer name pb\nlink add name pc type bridge"
            _run(["ip", "-n", name, "-batch", "-"], "creating veth and bridge", links)
            p = tbf_params(10, 1)
            tbf = "\n".join(_shape_cmds("pa", p, p.port_limit, 0))
            _run(["tc", "-n", name, "-batch", "-"], "adding tc tbf", tbf)
            if latency:
                netem = "\n".join(_shape_cmds("pb", p, p.host_limit, 1))
                _run(["tc", "-n", name, "-batch", "-"], "adding tc netem", netem, _NETEM_HINTS)
        finally:
            _delete_ns(name)
    except NetemError as exc:
        return str(exc)
    return None


def _pick_subnet() -> ipaddress.IPv4Network:
    """First 10.213.x.0/24 overlapping no route or address of the root namespace.

    The hosts are isolated from the root namespace anyway; avoiding overlap keeps
    addresses unambiguous in logs and safe should anyone bridge them outward.
    """
    used = []
    routes = json.loads(_run(["ip", "-j", "route", "show", "table", "all"], "reading routes") or "[]")
    for r in routes:
        dst = r.get("dst", "default")
        if dst != "default" and ":" not in dst:
            used.append(ipaddress.ip_network(dst, strict=False))
    addrs = json.loads(_run(["ip", "-j", "addr"], "reading addresses") or "[]")
    for link in addrs:
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for net in _SUBNETS.subnets(new_prefix=24):
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetemError(f"every /24 of {_SUBNETS} collides with a route here; free one")


# Instances not yet closed, for the atexit and signal handlers. A plain set, no
# lock: a signal handler runs in the main thread and would deadlock on one.
_live: set[EmulatedHosts] = set()
_prev_handlers: dict[int, object] = {}
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_serial = itertools.count()  # instance number within this process, for unique names


def _close_all() -> None:
    for hosts in list(_live):
        try:
            hosts.close()
        except Exception as exc:  # best effort at exit; cleanup_stale is the backup
            sys.stderr.write(f"netem: cleanup failed: {exc}\n")


def _on_signal(signum, frame) -> None:
    """Remove all hosts, then do what the signal would have done without us."""
    prev = _prev_handlers.get(signum, signal.SIG_DFL)
    _close_all()  # restores the previous handlers via close()
    if callable(prev):
        prev(signum, frame)
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Hook SIGTERM/SIGHUP so a terminated parent still removes its hosts.

    Only from the main thread (Python's rule) and only over SIG_DFL or a Python
    handler, which is then called after the cleanup; an ignored signal stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        cur = signal.getsignal(sig)
        if cur is _on_signal or cur is None or cur == signal.SIG_IGN:
            continue
        _prev_handlers[sig] = cur
        signal.signal(sig, _on_signal)


def _restore_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, prev in list(_prev_handlers.items()):
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, prev)
        del _prev_handlers[sig]


atexit.register(_close_all)


class EmulatedHosts:
    """N emulated hosts on one bridge, each link shaped both ways; a context manager.

    Host i lives in namespace `namespace(i)` with interface `eth0` at `address(i)`
    (a /24 of 10.213.0.0/16), loopback up. Its veth pair ends in bridge port `p<i>`
    in the bridge namespace. Egress of `eth0` (host -> bridge) and egress of `p<i>`
    (bridge -> host) each get a tbf at link_mbit over a small-packets-first queue
    (see tbf_params, _shape_cmds), so a host can send and receive link_mbit at once
    (full duplex), and N senders into one host share its link_mbit. latency_ms is
    added once on the host's egress, so a host-to-host round trip takes
    2 * latency_ms more.

    Removed on close(), on leaving the with-block (also by exception or Ctrl-C), at
    interpreter exit, and on SIGTERM/SIGHUP of this process; after SIGKILL,
    cleanup_stale() (also run on entry) removes the remains. Does not route to the
    outside world: processes inside reach only the other hosts.
    """

    def __init__(self, num_hosts: int, link_mbit: float, latency_ms: float = 0.0, prefix: str = "dt"):
        if not 1 <= num_hosts <= 250:
            raise NetemError(f"num_hosts must be in 1..250, got {num_hosts}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            raise NetemError(f"prefix must be 1-8 lowercase letters/digits, got {prefix!r}")
        self._tbf = tbf_params(link_mbit, latency_ms)  # also validates both
        self.num_hosts = num_hosts
        self.link_mbit = link_mbit
        self.latency_ms = latency_ms
        self.prefix = prefix
        self._stem = f"{prefix}-{os.getpid()}-{next(_serial)}"
        self._bridge_ns = f"{self._stem}-br"
        self._created: list[str] = []  # namespaces, in creation order
        self._procs: list[subprocess.Popen] = []
        self._addrs: list[str] = []
        self._closed = False
        self._entered = False

    def namespace(self, i: int) -> str:
        """Name of host i's network namespace (for `ip -n`, `tc -n`, debugging)."""
        self._check_index(i)
        return f"{self._stem}-{i}"

    @property
    def bridge_namespace(self) -> str:
        """Name of the namespace holding the bridge and the host-facing ports `p<i>`."""
        return self._bridge_ns

    def __enter__(self) -> Self:
        if self._entered:
            raise NetemError("an EmulatedHosts can be entered only once; create a new one")
        self._entered = True
        _live.add(self)
        _install_handlers()
        try:
            cleanup_stale(self.prefix)
            cleanup_stale("dtprobe")  # from a check_permitted() that was killed
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except NetemError:
            if exc_type is None:
                raise
            # Do not hide the exception that ended the block behind a cleanup error.

    def _build(self) -> None:
        net = _pick_subnet()
        br = self._bridge_ns
        _run(["ip", "netns", "add", br], "creating the bridge namespace")
        self._created.append(br)
        br_ip = [f"link add name {_BRIDGE} type bridge"]
        br_tc = []
        p = self._tbf
        for i in range(self.num_hosts):
            ns, port = self.namespace(i), f"p{i}"
            addr = str(net.network_address + i + 1)
            _run(["ip", "netns", "add", ns], f"creating namespace for host {i}")
            self._created.append(ns)
            # addrgenmode none: no IPv6 link-local address, so no background
            # neighbour discovery traffic pollutes the byte counters.
            host_ip = [
                # Both ends are created straight in their namespaces (`ip -n ns`
                # for this end, `netns br` for the peer): none in the root one.
                f"link add name {HOST_IF} type veth peer name {port} netns {br}",
                "link set lo up",
                f"link set {HOST_IF} addrgenmode none",
                f"addr add {addr}/{net.prefixlen} dev {HOST_IF}",
                f"link set {HOST_IF} up",
            ]
            host_tc = _shape_cmds(HOST_IF, p, p.host_limit, self.latency_ms)
            self._batch("ip", ns, host_ip, f"configuring host {i}")
            hints = _NETEM_HINTS if self.latency_ms > 0 else _HINTS
            self._batch("tc", ns, host_tc, f"shaping host {i} egress", hints)
            br_ip.append(f"link set {port} addrgenmode none master {_BRIDGE} up")
            br_tc += _shape_cmds(port, p, p.port_limit, 0.0)
            self._addrs.append(addr)
        br_ip.append(f"link set {_BRIDGE} addrgenmode none up")
        self._batch("ip", br, br_ip, "configuring the bridge")
        self._batch("tc", br, br_tc, "shaping host ingress (bridge egress)")
        self._wait_links_up()

    def _wait_links_up(self, timeout: float = 10.0) -> None:
        """Return once every link reports operstate UP; NetemError after timeout.

        The kernel applies a carrier change (and attaches the qdiscs, dropping every
        packet until then) from its linkwatch worker, up to a second later. Without
        this wait the first ARP request is lost and the first connection stalls ~1 s.
        """
        pending = {ns: [HOST_IF] for ns in map(self.namespace, range(self.num_hosts))}
        pending[self._bridge_ns] = [_BRIDGE, *(f"p{i}" for i in range(self.num_hosts))]
        deadline = time.monotonic() + timeout
        while pending:
            for ns in list(pending):
                links = json.loads(_run(["ip", "-n", ns, "-j", "link", "show"], "reading link state"))
                up = {link["ifname"] for link in links if link.get("operstate") == "UP"}
                if set(pending[ns]) <= up:
                    del pending[ns]
            if pending and time.monotonic() > deadline:
                raise NetemError(
                    f"links in {sorted(pending)} not up after {timeout:.0f}s; see `ip -n NS link`"
                )
            if pending:
                time.sleep(0.05)

    @staticmethod
    def _batch(tool: str, ns: str, lines: list[str], what: str, hints=_HINTS) -> None:
        """Run `ip`/`tc` commands in namespace ns, one process for all of them."""
        _run([tool, "-n", ns, "-batch", "-"], what, "\n".join(lines), hints)

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.num_hosts:
            raise IndexError(f"host index {i} out of range 0..{self.num_hosts - 1}")

    def _check_ready(self, i: int) -> None:
        self._check_index(i)
        if self._closed or not self._entered:
            raise NetemError("emulated hosts are not up: use them inside `with EmulatedHosts(...)`")

    def address(self, i: int) -> str:
        """Host i's IPv4 address: reachable from the other hosts, not from the root netns."""
        self._check_ready(i)
        return self._addrs[i]

    def popen(self, i: int, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start argv inside host i's network namespace via `nsenter --net`; kwargs go to Popen.

        The returned process is argv itself (nsenter execs it), so its pid, signals and
        exit code are argv's. Only the network namespace changes: unlike `ip netns exec`,
        which remounts /sys for the namespace, nsenter leaves the mounts alone, so the
        process still sees /sys/fs/cgroup (its CPU budget, bench.budget). Processes still
        running at close() are terminated; a process should therefore not outlive the
        `with` block. Servers may bind 0.0.0.0 and
        use the same port on every host: each host has its own port space.
        """
        self._check_ready(i)
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of strings, not a shell string")
        if shutil.which("nsenter") is None:
            raise NetemError("`nsenter` not found: apt-get install -y util-linux")
        netns = os.path.join(_NETNS_DIR, self.namespace(i))
        proc = subprocess.Popen(["nsenter", f"--net={netns}", "--", *argv], **popen_kwargs)
        self._procs.append(proc)
        return proc

    def link_bytes(self, i: int) -> tuple[int, int]:
        """(bytes sent, bytes received) by host i's eth0 since it was created.

        Kernel interface counters after shaping: bytes that actually crossed the link
        (frames dropped by tbf are not counted), Ethernet/IP/TCP headers and
        retransmissions included, not what the application thinks it sent. Above
        ~100 Mbit/s GSO super-packets cross whole and count their headers once, so
        headers are then under-counted by up to ~4%; the payload is always covered.
        """
        self._check_ready(i)
        out = _run(
            ["ip", "-n", self.namespace(i), "-s", "-j", "link", "show", "dev", HOST_IF],
            "reading counters",
        )
        stats = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def close(self) -> None:
        """Terminate processes started by popen, delete every namespace; idempotent.

        Tries every step even if one fails, then raises NetemError naming the first
        failure (cleanup_stale can retry leftover namespaces from another process).
        """
        # Re-entrant rather than guarded: SIGTERM may arrive while close() runs, and
        # the handler's call must finish the job before the process dies. Both
        # calls pop from the same lists, so nothing is deleted twice.
        self._closed = True
        errors: list[str] = []
        try:
            procs, self._procs = self._procs, []
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()  # a chance to exit cleanly; _delete_ns kills
            for proc in procs:
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass  # killed below with everything else in its namespace
            while self._created:
                name = self._created.pop()  # hosts first, the bridge last
                try:
                    _delete_ns(name)
                except NetemError as exc:
                    errors.append(str(exc))
        finally:
            _live.discard(self)
            if not _live:
                _restore_handlers()
        for proc in procs:
            if proc.poll() is None:  # survived SIGTERM and was not found by _delete_ns
                proc.kill()
            try:
                proc.wait(timeout=3)  # reap, so no zombie is left behind
            except subprocess.TimeoutExpired:
                errors.append(f"process {proc.pid} ({proc.args[3:]}) did not die")
        if errors:
            raise NetemError(f"{len(errors)} cleanup step(s) failed; first: {errors[0]}")

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("up" if self._entered else "new")
        return (
            f"EmulatedHosts({self.num_hosts} hosts, {self.link_mbit} Mbit/s, "
            f"{self.latency_ms} ms, ns {self._stem}-*, {state})"
        )
