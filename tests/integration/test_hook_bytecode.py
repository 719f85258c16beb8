"""Each hook call is a new process: it must load the hook package's bytecode, not compile its
source again. Python writes no bytecode where PYTHONDONTWRITEBYTECODE is set (our image and
chart set it, so does this machine), and compiling the adapters cost a hook call about 7 ms at
load 5 (import of the hot path 4.2 -> 11.7 ms after the adapters moved in; 2.4 ms from
bytecode). A real node agent writes it at start; `compile_hooks` rewrites only what is stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from node_agent.daemon import NodeAgent
from node_agent.hooks import HOOK_PACKAGE, compile_hooks
from node_agent.settings import NodeSettings

LS = {"session_id": "s1", "tool_name": "Bash", "tool_input": {"command": "ls"},
      "hook_event_name": "PreToolUse"}  # fmt: skip


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-hbc-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def loaded(package: Path, sock: Path) -> tuple[set[str], set[str]]:
    """One hook call as installed, under PYTHONDONTWRITEBYTECODE=1: the package's modules it
    loaded from bytecode, and those it compiled from source (``python -v`` says which)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-S", "-v", str(package / "__main__.py"), "claude-code", "PreToolUse",
         "--socket", str(sock)],
        input=json.dumps(LS), capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    code = [
        line.removeprefix("# code object from ").strip("'")
        for line in done.stderr.splitlines() if line.startswith("# code object from ")
    ]  # fmt: skip
    ours = [c for c in code if c.startswith(str(package))]
    from_bytecode = {c for c in ours if c.endswith(".pyc")}
    compiled = {c for c in ours if c.endswith(".py")}
    return from_bytecode, compiled


@pytest.fixture
async def node(tmp: Path) -> AsyncIterator[NodeAgent]:
    for cache in HOOK_PACKAGE.rglob("__pycache__"):  # as a fresh installation has it
        shutil.rmtree(cache, ignore_errors=True)
    agent = NodeAgent(NodeSettings(state_dir=tmp / "n", node_id="node-bc"))
    await agent.start()
    yield agent
    await agent.stop()


async def test_after_a_node_agent_starts_a_hook_call_loads_bytecode_only(node: NodeAgent) -> None:
    from_bytecode, compiled = loaded(HOOK_PACKAGE, node.settings.socket_path)
    assert compiled == set()
    assert any("adapter" in p for p in from_bytecode), from_bytecode
    assert any("forward" in p for p in from_bytecode), from_bytecode


async def test_compile_hooks_writes_what_is_missing_or_stale(node: NodeAgent, tmp: Path) -> None:
    package = tmp / "fleetledger_hook"
    shutil.copytree(HOOK_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    sock = node.settings.socket_path
    _, compiled = loaded(package, sock)
    assert compiled, "a package without bytecode is compiled on every call"
    assert compile_hooks(package)
    from_bytecode, compiled = loaded(package, sock)
    assert compiled == set() and from_bytecode
    forward = package / "forward.py"
    forward.write_text(forward.read_text() + "\n# changed\n")  # stale bytecode: compiled again
    os.utime(forward, (forward.stat().st_atime, forward.stat().st_mtime + 5))
    _, compiled = loaded(package, sock)
    assert any(p.endswith("forward.py") for p in compiled), compiled
    assert compile_hooks(package)
    assert loaded(package, sock)[1] == set()


def test_a_read_only_package_is_not_an_error(tmp: Path) -> None:
    package = tmp / "ro" / "fleetledger_hook"
    shutil.copytree(HOOK_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    for d in (package, *(p for p in package.rglob("*") if p.is_dir())):
        d.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anywhere: nothing to show here but no traceback
            assert compile_hooks(package) in (True, False)
        else:
            assert compile_hooks(package) is False
    finally:
        for d in (package, *(p for p in package.rglob("*") if p.is_dir())):
            d.chmod(0o755)
