"""The README's path from `make demo` to a governed Claude Code session, run as written (issue 24).

The two code blocks of "Point Claude Code, Codex or Gemini at it" are read from README.md and
run by bash in a fresh HOME, line for line: terminal 1 starts `fleetledger up`; terminal 2
exports the fleet's settings, installs the hooks into a project of its own, runs `fleetledger
doctor` (which must pass every check), starts `claude` (the real Claude Code CLI from the cache;
on PATH a wrapper runs it in `-p` mode against a local server speaking the Anthropic API, the
only stand-in) and lists the to-do the node captured from the session's prompt.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.fixtures.model_servers import AnthropicServer, Text
from tests.realcli.agents import base_env

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Please do: 1. write hello.txt 2. update the changelog"


def readme_block(label: str) -> str:
    """The code block after ``<!-- readme-path: LABEL -->`` in README.md."""
    text = (ROOT / "README.md").read_text()
    marker = f"<!-- readme-path: {label} -->\n```\n"
    start = text.index(marker) + len(marker)
    return text[start : text.index("```", start)]


def claude_wrapper(directory: Path, exe: Path, server: AnthropicServer) -> None:
    """`claude` on PATH: the real CLI, one non-interactive run against ``server``."""
    env = {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-ant-offline-test",
           "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1"}  # fmt: skip
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), str(exe), "-p", PROMPT,
            "--output-format", "json", "--permission-mode", "bypassPermissions"]  # fmt: skip
    script = directory / "claude"
    script.write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
    script.chmod(0o755)


def test_the_readme_path_ends_in_a_governed_claude_code_session(
    agent_clis: dict[str, Path], tmp_path: Path
) -> None:
    work = Path(tempfile.mkdtemp(prefix="fl-rd-", dir="/tmp"))  # short: ./state holds sockets
    (work / ".venv").symlink_to(ROOT / ".venv")  # the checkout after `make demo`
    home = tmp_path / "home"
    project = home / "my-project"
    project.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = base_env(home)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    steps = [Text("All done."), Text("Still done."), Text("Done, really.")]
    with AnthropicServer(steps) as server:
        claude_wrapper(bin_dir, agent_clis["claude-code"], server)
        fleet = subprocess.Popen(
            ["bash", "-c", readme_block("terminal 1")], cwd=work, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (work / "state" / "fleet.env").exists():
                assert fleet.poll() is None, fleet.communicate()
                assert time.monotonic() < deadline, "fleetledger up did not start"
                time.sleep(0.1)
            second = subprocess.run(
                ["bash", "-e", "-c", readme_block("terminal 2")], cwd=work, env=env,
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        finally:
            if fleet.poll() is None:
                os.killpg(fleet.pid, signal.SIGINT)
            fleet.communicate(timeout=60)
            shutil.rmtree(work, ignore_errors=True)
        first_request = json.dumps(server.main_requests[0].body) if server.main_requests else ""

    said = second.stdout + second.stderr
    print(said)  # the doctor's output on a healthy set-up, for the record
    assert second.returncode == 0, said[-6000:]
    doctor = [line for line in second.stdout.splitlines() if line[:4] in ("ok  ", "FAIL")]
    assert "FAIL" not in " ".join(line[:4] for line in doctor), said[-6000:]
    names = {line[5:].split("  ")[0].strip() for line in doctor}
    assert {"settings", "NATS", "coordinator ready", "Redis", "node agent", "claude-code hooks",
            "agent environment", "judge"} <= names, doctor  # fmt: skip
    # governed: the prompt's to-do reached the model with it, and the node holds the items
    assert "fleetledger to-do (open, in order)" in first_request
    listed = second.stdout[second.stdout.rindex("to-do (node-local ledger)") :]
    assert "write hello.txt" in listed and "update the changelog" in listed, listed
