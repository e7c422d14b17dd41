"""A slow link between two ranks on one machine: each rank in its own network namespace,
the two joined by a veth pair whose rate ``tc``'s token bucket filter limits. Needs root
and iproute2 (``ip``, ``tc``); ``Namespaces.unavailable()`` says why not where it cannot.
The addresses (10.77.x.1/2) exist only inside the two namespaces."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Namespaces:
    """Two namespaces ``<tag>a`` (rank 0, 10.77.N.1) and ``<tag>b`` (rank 1, 10.77.N.2)."""

    def __init__(self, rate: str = "1gbit") -> None:
        self.rate = rate
        self.tag = "sw" + uuid.uuid4().hex[:6]
        self.net = int(self.tag[2:4], 16) % 250 + 1
        self.names = (self.tag + "a", self.tag + "b")
        self.devs = (self.tag + "va", self.tag + "vb")
        self.addrs = (f"10.77.{self.net}.1", f"10.77.{self.net}.2")

    @staticmethod
    def unavailable() -> str | None:
        if os.geteuid() != 0:
            return "making network namespaces needs root"
        missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
        if missing:
            return f"{' and '.join(missing)} not installed (iproute2)"
        probe = "swprobe" + uuid.uuid4().hex[:4]
        try:
            _ip("netns", "add", probe)
            _ip("netns", "del", probe)
        except (subprocess.CalledProcessError, OSError) as e:
            return f"ip netns add failed ({getattr(e, 'stderr', b'') or e})"
        return None

    def __enter__(self) -> Namespaces:
        for ns in self.names:
            _ip("netns", "add", ns)
        _ip("link", "add", self.devs[0], "type", "veth", "peer", "name", self.devs[1])
        for ns, dev, addr in zip(self.names, self.devs, self.addrs, strict=True):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    self.rate,
                    "burst",
                    "1mb",
                    "latency",
                    "200ms",
                ],
                check=True,
                capture_output=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def run_ranks(self, cmd: list[str], env: dict[str, str]) -> str:
        """``cmd`` as rank 0 in the first namespace and rank 1 in the second (gloo over the
        veth pair); rank 0's last line of output."""
        procs = []
        for rank, (ns, dev) in enumerate(zip(self.names, self.devs, strict=True)):
            e = {**env, "RANK": str(rank), "MASTER_ADDR": self.addrs[0], "GLOO_SOCKET_IFNAME": dev}
            procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, *cmd],
                    env=e,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            if p.returncode:
                raise RuntimeError(err[-3000:])
        return outs[0][0].strip().splitlines()[-1]
