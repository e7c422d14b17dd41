"""The links a job's collectives run over: what each costs, by the α–β model.

A collective of ``b`` payload bytes over ``n`` ranks takes ``α(n) + wire(b, n) / β``:
``wire`` is what each rank sends with ring algorithms (nccl-tests' ``doc/PERFORMANCE.md``:
all-reduce 2(n−1)/n × b; all-gather, reduce-scatter and all-to-all (n−1)/n × b, b being the
whole output, resp. input); ``β`` is the link's bus bandwidth, the figure nccl-tests prints as
``busbw``, which that definition keeps nearly constant over n; ``α(n)`` the latency, paid
once per ring hop: 2(n−1) hops for an all-reduce, n−1 for the others (so a link measured at
two ranks, one all-reduce = 2 hops, says α per hop).

Presets are what NCCL reaches, not line rates:
- ``nvlink4`` (H100 SXM, NVLink 4 through NVSwitch, 450 GB/s per direction): about 370 GB/s
  all-reduce bus bandwidth at large sizes (nccl-tests issue #212, 8 × H100 DGX);
- ``nvlink5`` (B200, 900 GB/s per direction): about 720 GB/s, the same 80 % of line rate;
- ``pcie4`` / ``pcie5``: one ×16 slot through the host, about 24 / 48 GB/s;
- ``ib-ndr``: one InfiniBand NDR NIC per GPU, 400 Gb/s = 50 GB/s, about 45 GB/s reached.
Hop latencies are the order nccl-tests shows for small messages (a few µs on NVLink, more
through PCIe and the network): they matter only for many small buckets.

A job across ``nodes``: the ring crosses the network, and the slowest link carries it
(``Link.across``). A measured link (``swift_nb.measure_link``) has its own α and β per kind of
collective, fitted to timed collectives of growing size on the backend that will run them
(gloo's reduce-scatter is not NCCL's), and how much of a collective's time compute can run
under (``overlap``, measured the same way): on a GPU the collectives run on their own
stream; on CPU gloo's threads need the cores the backward uses, and only the wait for a
network slower than the CPU hides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from swift_nb.core.errors import ConfigError

GB = 1e9
# A data-center GPU's device-to-device copy, bytes copied per second (H100 SXM: 3.35 TB/s of
# HBM3 read + write, about 1.5 TB/s copied): the presets' ranks are such GPUs.
HBM_COPY_BW = 1.5e12
KINDS = ("all_reduce", "all_gather", "reduce_scatter")
BF16 = "@bf16"  # a fit of a kind for bf16 payloads: "all_reduce@bf16"


def wire_bytes(kind: str, payload: float, n: int) -> float:
    """What each rank sends for a collective of ``payload`` bytes over ``n`` ranks (ring)."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * payload
    return (n - 1) / n * payload


def hops(kind: str, n: int) -> int:
    """Ring steps of a collective over ``n`` ranks (each pays the link's latency once)."""
    if n <= 1:
        return 0
    return 2 * (n - 1) if kind == "all_reduce" else n - 1


@dataclass(frozen=True)
class Fit:
    """One kind of collective on a link: latency per ring hop (s) and bus bandwidth (B/s)."""

    hop_s: float
    busbw: float

    def seconds(self, kind: str, payload: float, n: int) -> float:
        if n <= 1 or payload <= 0:
            return 0.0
        return hops(kind, n) * self.hop_s + wire_bytes(kind, payload, n) / self.busbw


@dataclass(frozen=True)
class Link:
    """A link: a fit per kind of collective (``all_reduce`` stands in for a kind not
    measured), the share of a collective's time compute can run under (``overlap``: 1 on a
    GPU's own stream, measured for a measured link), where its figures come from, and how
    fast the ranks' device copies memory (``copy_bw``, bytes/s: the passes a layout makes
    over the gradients besides the collectives, such as DDP's copies into its buckets)."""

    name: str
    fits: Mapping[str, Fit]
    overlap: float = 1.0
    source: str = ""
    backend: str = "nccl"
    copy_bw: float = HBM_COPY_BW
    measured: dict[str, Any] = field(default_factory=dict, compare=False)

    def copy_s(self, nbytes: float) -> float:
        """One pass over ``nbytes`` on the ranks' device (a copy, a cast, an in-place divide)."""
        return nbytes / self.copy_bw if nbytes > 0 else 0.0

    def seconds(self, kind: str, payload: float, n: int, bf16: bool = False) -> float:
        """One collective of ``payload`` bytes over ``n`` ranks on this link (``bf16``: of
        bf16 elements, at the kind's bf16 fit where the link has one). A measured link
        answers from its own timings where it has them: between two measured sizes, their
        times interpolated; beyond them, the nearest one scaled by the fit; at another
        number of ranks than it was measured at, scaled by the fit's ratio of the two."""
        key = self._key(kind, bf16)
        fit = self.fits[key]
        timed = sorted(
            (p["bytes"], p["seconds"]) for p in self.measured.get("points", ()) if p["kind"] == key
        )
        at = int(self.measured.get("world_size") or 0)
        if len(timed) < 2 or at < 2 or n <= 1 or payload <= 0:
            return fit.seconds(kind, payload, n)
        sizes, times = zip(*timed, strict=True)
        edge = min(max(payload, sizes[0]), sizes[-1])
        t = float(np.interp(edge, sizes, times))
        if edge != payload:
            t *= fit.seconds(kind, payload, at) / fit.seconds(kind, edge, at)
        if n != at:
            t *= fit.seconds(kind, payload, n) / fit.seconds(kind, payload, at)
        return t

    def _key(self, kind: str, bf16: bool) -> str:
        for key in ((kind + BF16) if bf16 else "", kind, "all_reduce"):
            if key in self.fits:
                return key
        raise KeyError(kind)

    def fit(self, kind: str, bf16: bool = False) -> Fit:
        """The kind's fit (its bf16 one with ``bf16``, where measured); all-reduce's for a
        kind not measured."""
        return self.fits[self._key(kind, bf16)]

    @property
    def overlaps(self) -> bool:
        """Whether compute runs under any of a collective's time."""
        return self.overlap > 0

    def exposed(self, comm: float, scheduled: float) -> float:
        """What a step waits for of ``comm`` seconds of collectives that a schedule of the
        step would leave ``scheduled`` of exposed if they ran beside compute: the share that
        cannot (``1 − overlap``) is waited for whole."""
        return self.overlap * scheduled + (1.0 - self.overlap) * comm

    @property
    def busbw(self) -> float:
        return self.fits["all_reduce"].busbw

    def across(self, network: Link) -> Link:
        """This link inside each node and ``network`` between them: every ring crosses the
        network, so each kind runs at the slower bandwidth and pays the larger latency."""
        keys = {*KINDS, *self.fits, *network.fits}
        fits = {}
        for key in keys:
            kind, bf16 = key.removesuffix(BF16), key.endswith(BF16)
            mine, theirs = self.fit(kind, bf16), network.fit(kind, bf16)
            fits[key] = Fit(max(mine.hop_s, theirs.hop_s), min(mine.busbw, theirs.busbw))
        return replace(
            self,
            name=f"{self.name} + {network.name}",
            fits=fits,
            overlap=min(self.overlap, network.overlap),
            copy_bw=min(self.copy_bw, network.copy_bw),
            measured={},  # timings inside a node say nothing of the rings across nodes
            source=f"{self.source}; between nodes {network.source}",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fits": {k: {"hop_s": f.hop_s, "busbw": f.busbw} for k, f in self.fits.items()},
            "overlap": self.overlap,
            "source": self.source,
            "backend": self.backend,
            "copy_bw": self.copy_bw,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Link:
        fits = {k: Fit(float(f["hop_s"]), float(f["busbw"])) for k, f in d["fits"].items()}
        return cls(
            name=str(d["name"]),
            fits=fits,
            overlap=float(d["overlap"] if "overlap" in d else bool(d.get("overlaps", True))),
            source=str(d.get("source", "")),
            backend=str(d.get("backend", "nccl")),
            copy_bw=float(d.get("copy_bw") or HBM_COPY_BW),
            measured=dict(d.get("measured") or {}),
        )


def _preset(name: str, busbw_gb: float, hop_us: float, source: str) -> Link:
    fit = Fit(hop_us * 1e-6, busbw_gb * GB)
    return Link(name=name, fits={k: fit for k in KINDS}, overlap=1.0, source=source)


PRESETS: dict[str, Link] = {
    link.name: link
    for link in (
        _preset(
            "nvlink4",
            370,
            4,
            "NVLink 4 via NVSwitch (H100 SXM): ~370 GB/s NCCL bus bandwidth, nccl-tests #212",
        ),
        _preset("nvlink5", 720, 4, "NVLink 5 (B200): ~720 GB/s NCCL bus bandwidth, 80 % of 900 GB/s"),
        _preset("pcie4", 24, 10, "PCIe 4.0 ×16 through the host: ~24 GB/s bus bandwidth"),
        _preset("pcie5", 48, 10, "PCIe 5.0 ×16 through the host: ~48 GB/s bus bandwidth"),
        _preset("ib-ndr", 45, 15, "InfiniBand NDR, one 400 Gb/s NIC per GPU: ~45 GB/s bus bandwidth"),
    )
}


def link_of(value: Any, param: str = "link") -> Link:
    """A ``Link`` from a preset's name, a ``Link``, or a link's dict (as a run saves it);
    a ``ConfigError`` naming the presets otherwise."""
    if isinstance(value, Link):
        return value
    if isinstance(value, Mapping) and "fits" in value:
        try:
            return Link.from_dict(value)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(param, f"a link's dict needs 'name' and 'fits' ({e})", value) from None
    if isinstance(value, str) and value.lower() in PRESETS:
        return PRESETS[value.lower()]
    raise ConfigError(
        param,
        f"must be one of {', '.join(PRESETS)}, or a Link (swift_nb.measure_link())",
        value,
    )


def check_link(link: Link, param: str = "link") -> Link:
    """A link whose every fit is a finite latency ≥ 0 and a bandwidth > 0."""
    for kind, f in link.fits.items():
        if not (math.isfinite(f.hop_s) and f.hop_s >= 0 and math.isfinite(f.busbw) and f.busbw > 0):
            raise ConfigError(param, f"its {kind} fit must have a latency ≥ 0 and a bandwidth > 0", f)
    if not 0.0 <= link.overlap <= 1.0:
        raise ConfigError(param, "its overlap is a share of a collective's time, from 0 to 1", link.overlap)
    if not (math.isfinite(link.copy_bw) and link.copy_bw > 0):
        raise ConfigError(param, "its copy bandwidth must be above 0", link.copy_bw)
    return link
