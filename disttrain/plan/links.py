"""A link file: the transport constants measured on the user's own hosts, in place of the published ones.

`disttrain-link-probe` writes it (one task per host, `bench.link_hosts`);
`disttrain-plan --link_file=...` reads it. It holds, each as the lowest,
median and highest over the timed rounds and host pairs:

    tcp_share        plain TCP, both ways at once between two hosts, over the
                     nominal rate the user declared (`link_gbit`)
    latency_ms       one way, half a small message's round trip
    grpc_share       TF's gRPC moving a large tensor around a ring of every host
    grpc_cpu_s_per_byte    CPU seconds per byte at each end of those transfers
    grpc_per_message_s     CPU seconds per small tensor at each end

The planner's gRPC is then the measured one, and NCCL over TCP gets the
measured TCP share (NCCL's own cost per hop stays NCCL's: it is not
measured here). RDMA is not measured: a plan over RDMA with a link file is
refused. What the file cannot know: links other than those measured, and
how the rates change with many hosts talking at once beyond the ring.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Sequence

from disttrain.base.errors import ConfigError
from disttrain.plan import cost, transports

FORMAT, VERSION = "disttrain.plan.links", 1  # the module that reads it
_FIELDS = ("tcp_share", "latency_ms", "grpc_share", "grpc_cpu_s_per_byte", "grpc_per_message_s")


@dataclasses.dataclass(frozen=True)
class Measured:
    """One constant over the rounds (and host pairs) that measured it."""

    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Measured:
        if not values:
            raise ValueError("no measurement")
        return cls(min(values), statistics.median(values), max(values))


@dataclasses.dataclass(frozen=True)
class LinkFile:
    """What a link probe measured across `hosts`, whose links were declared as `link_gbit` each."""

    hosts: tuple[str, ...]
    link_gbit: float
    tcp_share: Measured
    latency_ms: Measured
    grpc_share: Measured
    grpc_cpu_s_per_byte: Measured
    grpc_per_message_s: Measured
    path: str = ""

    def _points(self, what: str, m: Measured) -> tuple[transports.Point, ...]:
        where = f"measured on your links ({self.path or 'link file'}, {len(self.hosts)} hosts)"
        return (
            transports.Point(m.low, f"{where}: lowest {what}"),
            transports.Point(m.high, f"{where}: highest {what}"),
        )

    def spreads(self) -> dict[str, transports.Spread]:
        """gRPC and NCCL over TCP as measured: the medians in the middle, the lowest and highest as ends."""
        grpc = cost.Transport(
            cost.GRPC,
            link_share=self.grpc_share.median,
            per_message_s=self.grpc_per_message_s.median,
            cpu_s_per_byte=self.grpc_cpu_s_per_byte.median,
        )
        tcp = dataclasses.replace(transports.NCCL_TCP, link_share=self.tcp_share.median)
        return {
            cost.GRPC: transports.Spread(
                grpc,
                {
                    transports.LINK_SHARE: self._points("gRPC share", self.grpc_share),
                    transports.PER_MESSAGE: self._points("gRPC CPU per message", self.grpc_per_message_s),
                    transports.CPU_PER_BYTE: self._points("gRPC CPU per byte", self.grpc_cpu_s_per_byte),
                    # The probe does not load one PS with many workers: its ceiling stays the published one.
                    transports.PS_CORES: transports.GRPC_SPREAD.points[transports.PS_CORES],
                },
            ),
            tcp.name: transports.Spread(
                tcp, {transports.LINK_SHARE: self._points("TCP share", self.tcp_share)}
            ),
        }

    def describe(self) -> str:
        return (
            f"measured on {len(self.hosts)} hosts at {self.link_gbit:g} Gbit/s ({self.path}): TCP share "
            f"{self.tcp_share.median:.2f}, gRPC share {self.grpc_share.median:.2f}, gRPC CPU "
            f"{self.grpc_cpu_s_per_byte.median * 1e9:.2f} ms/MB and "
            f"{self.grpc_per_message_s.median * 1e3:.3f} ms/message, "
            f"latency {self.latency_ms.median:.3f} ms one way"
        )

    def as_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "hosts": list(self.hosts),
            "link_gbit": self.link_gbit,
            **{f: dataclasses.asdict(getattr(self, f)) for f in _FIELDS},
        }


def write(link_file: LinkFile, path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(link_file.as_dict(), f, indent=2)
        f.write("\n")


def _measured(data: dict, field: str, path: str) -> Measured:
    entry = data.get(field)
    try:
        m = Measured(float(entry["low"]), float(entry["median"]), float(entry["high"]))
    except (TypeError, KeyError, ValueError):
        raise ConfigError(
            f"--link_file={path}: {field!r} missing or not {{low, median, high}}; "
            "write the file with disttrain-link-probe --out"
        ) from None
    if not (m.low <= m.median <= m.high) or m.low < 0:
        raise ConfigError(f"--link_file={path}: {field} must satisfy 0 <= low <= median <= high, got {m}")
    return m


def load(path: str) -> LinkFile:
    """The link file at `path`; ConfigError (one line) if it is missing or not one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"--link_file={path}: no such file; measure one with disttrain-link-probe --out"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--link_file={path}: not a readable JSON link file ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(
            f"--link_file={path}: not a {FORMAT} version {VERSION} (as disttrain-link-probe --out writes)"
        )
    link_gbit = data.get("link_gbit")
    if not isinstance(link_gbit, (int, float)) or not link_gbit > 0:
        raise ConfigError(f"--link_file={path}: link_gbit must be a rate > 0 in Gbit/s, got {link_gbit!r}")
    measured = {f: _measured(data, f, path) for f in _FIELDS}
    for share in ("tcp_share", "grpc_share"):
        if not 0 < measured[share].median <= 1.5:
            raise ConfigError(
                f"--link_file={path}: {share} {measured[share].median:.3f} is no share of a "
                f"{link_gbit:g} Gbit/s link: was link_gbit the links' real rate?"
            )
    return LinkFile(tuple(data.get("hosts", ())), float(link_gbit), path=path, **measured)


def spreads_with(link_file: LinkFile | None) -> dict[str, transports.Spread]:
    """The published spreads, with the link file's measured transports in place of theirs."""
    spreads = dict(transports.SPREADS)
    if link_file is not None:
        spreads.update(link_file.spreads())
    return spreads


def constants_with(link_file: LinkFile | None, constants: cost.Constants = cost.DEFAULTS) -> cost.Constants:
    """`constants` with the measured gRPC in place of the default (a strategy naming no transport uses it)."""
    if link_file is None:
        return constants
    return cost.with_transport(constants, link_file.spreads()[cost.GRPC].transport)


def transport_for(link_file: LinkFile, strategy: cost.Strategy) -> cost.Transport | None:
    """The measured transport the strategy names (None: gRPC, via `constants_with`).

    ConfigError if the file did not measure it.
    """
    if strategy.transport is None:
        return None
    measured = link_file.spreads()
    name = strategy.transport.name
    if name not in measured:
        raise ConfigError(
            f"the link file measured {' and '.join(measured)}, not {name}: plan {name} without --link_file "
            "(the published spread), or measure a transport the file holds"
        )
    return measured[name].transport
