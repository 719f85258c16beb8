"""Install the real agent CLIs from npm into a cache reused across runs.

Versions are pinned in clis.json beside this file (bump them there). Each CLI lives in its own
directory, ``$FLEET_AGENT_CLIS`` or ``$XDG_CACHE_HOME/fleetledger/agent-clis`` (default
``~/.cache/fleetledger/agent-clis``), named ``<package>@<version>``; a stamp file marks a
finished install and a lock file next to it keeps parallel sessions from installing at once.
Run as a script (``python -m tests.realcli.install``) to warm the cache ahead of a test run.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PINS = Path(__file__).with_name("clis.json")
INSTALL_TIMEOUT_S = 900


class NpmMissing(RuntimeError):
    """npm is not on PATH: the real-client tests cannot install the agent CLIs."""


@dataclass(frozen=True)
class Cli:
    name: str
    package: str
    version: str
    bin: str

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


def pinned() -> dict[str, Cli]:
    """The CLIs and versions pinned in clis.json, by our short name."""
    raw = json.loads(PINS.read_text())
    return {name: Cli(name=name, **entry) for name, entry in raw.items()}


def cache_root() -> Path:
    if explicit := os.environ.get("FLEET_AGENT_CLIS"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetledger" / "agent-clis"


def _say(message: str) -> None:
    print(f"[realcli] {message}", file=sys.stderr, flush=True)


def ensure(cli: Cli, root: Path | None = None) -> Path:
    """The path of ``cli``'s executable, installing the pinned version first if needed."""
    root = root or cache_root()
    prefix = root / cli.spec.lstrip("@").replace("/", "+")
    exe = prefix / "node_modules" / ".bin" / cli.bin
    stamp = prefix / ".installed"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions must not run npm into one prefix
        if stamp.is_file() and stamp.read_text() == cli.spec and exe.exists():
            return exe
        npm = shutil.which("npm")
        if npm is None:
            raise NpmMissing(
                f"npm is not on PATH: the real-client tests install {cli.spec} with it "
                "(install Node.js >= 20 with npm, or pre-populate "
                f"{prefix} with `npm install --prefix {prefix} {cli.spec}`)"
            )
        _say(f"installing {cli.spec} into {prefix} (first run only)")
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        done = subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", cli.spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        if done.returncode != 0 or not exe.exists():
            raise RuntimeError(
                f"npm install {cli.spec} failed (exit {done.returncode}):\n{done.stdout[-4000:]}"
            )
        stamp.write_text(cli.spec)
        _say(f"installed {cli.spec}")
    return exe


def ensure_all() -> dict[str, Path]:
    return {name: ensure(cli) for name, cli in pinned().items()}


if __name__ == "__main__":
    for name, path in ensure_all().items():
        print(f"{name}: {path}")
