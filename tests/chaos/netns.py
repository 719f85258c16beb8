"""Hosts of a test's own: Linux network namespaces joined by one bridge, and partitions of them.

Each host is a network namespace with one veth pair into a bridge in the test's namespace and one
address of the test's own subnet (``10.213.N.0/24``, N from the process id); nothing else is
routed, so a process started in a host (``popen``) reaches only the other hosts and the test
itself (the bridge's own address, ``.254``, which no partition cuts: the test watches both sides).

A partition is drop rules, not a dead link: in every host, a ``blackhole`` route to each host on
the other side, so packets between them vanish (as on a real network, a peer finds out by timing
out) while the hosts of one side still reach each other. ``isolate``, ``partition``
(majority/minority) and ``bridge_cut`` (A and C cut, B still reaches both) are the shapes the
nemesis uses; ``heal`` removes every rule. The kernel here has no netem (no delay or loss), and
none is needed: loss is total or nothing.

Everything is removed on ``close`` (namespaces, links, the bridge), and a namespace left by an
earlier run killed before it could remove its own (its process id no longer runs) is removed on
the next start. Needs root (``ip netns``); without it the test fails naming what is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PREFIX = "flt"  # every namespace and link of these tests starts with it


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available() -> str | None:
    """None when namespaces can be made here; else why not."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Remove what runs that were killed left behind (their process is gone)."""
    listed = _ip("netns", "list", check=False).stdout.split()
    links = _ip("-o", "link", "show", check=False).stdout
    for name in {*listed, *(w.split("@")[0].rstrip(":") for w in links.split())}:
        parts = name.split("-")
        stale = len(parts) >= 2 and parts[0] == PREFIX and parts[1].isdigit()
        if stale and not _alive(int(parts[1])):
            _ip("netns", "delete", name, check=False)
            _ip("link", "delete", name, check=False)


@dataclass
class Host:
    name: str
    namespace: str
    address: str


@dataclass
class Network:
    """Hosts on one bridge; ``partition`` and friends cut them apart, ``heal`` joins them."""

    names: Sequence[str]
    hosts: dict[str, Host] = field(default_factory=dict)
    _tag: str = ""
    _cuts: set[tuple[str, str]] = field(default_factory=set)

    def start(self) -> Network:
        missing = available()
        if missing is not None:
            raise RuntimeError(f"the cluster fault checker cannot run here: {missing}")
        remove_stale()
        pid = os.getpid()
        self._tag = f"{PREFIX}-{pid}"
        subnet = f"10.213.{pid % 250}"
        bridge = f"{self._tag}-br"
        try:
            _ip("link", "add", bridge, "type", "bridge")
            _ip("link", "set", bridge, "up")
            # the test's own namespace reaches every host through the bridge (never cut)
            _ip("addr", "add", f"{subnet}.254/24", "dev", bridge)
            for i, name in enumerate(self.names, start=1):
                ns, outer, inner = f"{self._tag}-{name}", f"{self._tag}-v{i}", f"{self._tag}-p{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", bridge)
                _ip("link", "set", outer, "up")
                address = f"{subnet}.{i}"
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.hosts[name] = Host(name, ns, address)
        except subprocess.CalledProcessError as exc:
            self.close()
            raise RuntimeError(
                f"`ip {' '.join(exc.cmd[1:])}` failed: {exc.stderr.strip()}"
            ) from None
        return self

    def popen(self, host: str, argv: Sequence[str], **kw: object) -> subprocess.Popen[bytes]:
        """``argv`` run inside ``host``'s namespace (it sees only the test's hosts)."""
        ns = self.hosts[host].namespace
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kw)  # type: ignore[call-overload,no-any-return]

    def address(self, host: str) -> str:
        return self.hosts[host].address

    # --- faults ---------------------------------------------------------------------------

    def _cut(self, a: str, b: str) -> None:
        for src, dst in ((a, b), (b, a)):
            if (src, dst) not in self._cuts:
                _ip("-n", self.hosts[src].namespace, "route", "add", "blackhole",
                    f"{self.hosts[dst].address}/32")  # fmt: skip
                self._cuts.add((src, dst))

    def partition(self, *sides: Iterable[str]) -> None:
        """No packet between hosts of different sides; each side whole."""
        groups = [set(side) for side in sides]
        for i, left in enumerate(groups):
            for right in groups[i + 1 :]:
                for a in left:
                    for b in right:
                        self._cut(a, b)

    def isolate(self, host: str) -> None:
        self.partition([host], [h for h in self.hosts if h != host])

    def bridge_cut(self, a: str, c: str) -> None:
        """``a`` and ``c`` cannot reach each other; every other pair still can."""
        self._cut(a, c)

    def heal(self) -> None:
        for src, dst in list(self._cuts):
            _ip("-n", self.hosts[src].namespace, "route", "del", "blackhole",
                f"{self.hosts[dst].address}/32", check=False)  # fmt: skip
        self._cuts.clear()

    @property
    def cuts(self) -> set[tuple[str, str]]:
        return set(self._cuts)

    def close(self) -> None:
        for host in self.hosts.values():
            _ip("netns", "delete", host.namespace, check=False)  # its veth end goes with it
        with contextlib.suppress(Exception):
            for i in range(1, len(self.names) + 1):
                _ip("link", "delete", f"{self._tag}-v{i}", check=False)
        _ip("link", "delete", f"{self._tag}-br", check=False)
        self.hosts.clear()

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
