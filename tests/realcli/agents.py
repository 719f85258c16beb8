"""How to drive each real agent CLI offline: its model server, environment, argv and hooks.

Each driver knows one CLI's facts (learned from its docs and by running it, see docs/agents.md):
where its hook configuration lives in a project, which environment points it at a local model
server, and the flags for one non-interactive run with no approvals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.fixtures.model_servers import (
    AnthropicServer,
    GeminiServer,
    ResponsesServer,
    ScriptedServer,
    ScriptStep,
    ToolCall,
    shell_call,
)

RUN_TIMEOUT_S = 120.0


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.argv[:3])} ... exited {self.returncode} in {self.seconds:.1f}s\n"
            f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"
        )


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float = RUN_TIMEOUT_S) -> Run:
    """Run a CLI to completion in its own process group; on time-out kill the whole group."""
    started = time.monotonic()
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so a time-out also ends the CLI's children (shells, hooks)
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            took = time.monotonic() - started
            partial = Run(argv, -9, out, err, took).describe()
            raise AssertionError(f"timed out after {timeout_s:.0f}s\n{partial}") from None
    return Run(argv, proc.returncode, out, err, time.monotonic() - started)


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: a tmp HOME (and XDG dirs inside it) so no state leaks either way."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "USER": os.environ.get("USER", "root"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
    }
    for name, sub in (("CONFIG", ".config"), ("CACHE", ".cache"), ("DATA", ".local/share")):
        env[f"XDG_{name}_HOME"] = str(home / sub)
    env["XDG_STATE_HOME"] = str(home / ".local/state")
    return env


class Agent:
    """One CLI: subclasses fill in the facts."""

    name: ClassVar[str]
    server_class: ClassVar[type[ScriptedServer]]
    # our name for an event -> the CLI's hook event names
    hook_events: ClassVar[tuple[str, ...]]

    def __init__(self, exe: Path, home: Path, project: Path) -> None:
        self.exe = exe
        self.home = home
        self.project = project
        self.extra_args: list[str] = []  # more flags for one run (before the prompt)
        self.extra_env: dict[str, str] = {}  # more environment for one run

    def shell(self, command: str) -> ScriptStep:
        """A scripted turn that runs ``command`` with the CLI's shell tool."""
        raise NotImplementedError

    def setup(self, server: ScriptedServer) -> None:
        """Write whatever user-level configuration the CLI needs to use ``server``."""

    def env(self, server: ScriptedServer) -> dict[str, str]:
        raise NotImplementedError

    def argv(self, prompt: str) -> list[str]:
        raise NotImplementedError

    def install_hooks(self, command: Callable[[str], str]) -> Path:
        """Configure ``command(event)`` as a command hook for every event, in the project."""
        raise NotImplementedError

    def run(self, server: ScriptedServer, prompt: str, timeout_s: float = RUN_TIMEOUT_S) -> Run:
        self.setup(server)
        argv = self.argv(prompt)
        argv[-1:-1] = self.extra_args if argv[-1] == prompt else []
        if argv[-1] != prompt:
            argv += self.extra_args
        return run(argv, self.project, {**self.env(server), **self.extra_env}, timeout_s)


class ClaudeCode(Agent):
    name = "claude-code"
    server_class = AnthropicServer
    hook_events = (
        "SessionStart",
        "UserPromptSubmit",
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "Notification",
        "Stop",
        "SubagentStop",
        "PreCompact",
        "SessionEnd",
    )

    def shell(self, command: str) -> ScriptStep:
        return ToolCall("Bash", {"command": command, "description": "scripted command"})

    def env(self, server: ScriptedServer) -> dict[str, str]:
        return {
            **base_env(self.home),
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "sk-ant-offline-test",
            "IS_SANDBOX": "1",  # bypassPermissions is refused as root otherwise
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }

    def argv(self, prompt: str) -> list[str]:
        return [
            str(self.exe),
            "-p",
            prompt,
            "--output-format",
            "json",
            "--permission-mode",
            "bypassPermissions",
        ]

    def install_hooks(self, command: Callable[[str], str]) -> Path:
        path = self.project / ".claude" / "settings.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        hooks = {
            event: [{"matcher": "*", "hooks": [{"type": "command", "command": command(event)}]}]
            for event in self.hook_events
        }
        path.write_text(json.dumps({"hooks": hooks}, indent=2))
        return path


class Codex(Agent):
    name = "codex"
    server_class = ResponsesServer
    hook_events = (
        "SessionStart",
        "UserPromptSubmit",
        "PreToolUse",
        "PermissionRequest",
        "PostToolUse",
        "Stop",
        "SubagentStart",
        "SubagentStop",
        "PreCompact",
        "PostCompact",
        "SessionEnd",
    )

    bypass_trust = True  # False: Codex checks each hook's trusted_hash, as for a user
    extra_config = ""  # appended to config.toml (e.g. the trust `hooks install --trust` wrote)

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    def shell(self, command: str) -> ScriptStep:
        return shell_call(command)

    def setup(self, server: ScriptedServer) -> None:
        # A provider of our own (wire_api = "responses"), no retries so failures show at once,
        # and the tmp project trusted: Codex loads a project's .codex/ layer only then.
        self.codex_home.mkdir(parents=True, exist_ok=True)
        if (self.codex_home / "config.toml").exists():
            return  # written already (by an earlier setup and then, say, `hooks install --trust`)
        (self.codex_home / "config.toml").write_text(
            f'model = "gpt-5.5"\n'
            f'model_provider = "offline"\n'
            f"[model_providers.offline]\n"
            f'name = "offline"\n'
            f'base_url = "{server.url}/v1"\n'
            f'wire_api = "responses"\n'
            f'env_key = "OFFLINE_API_KEY"\n'
            f"request_max_retries = 0\n"
            f"stream_max_retries = 0\n"
            f'[projects."{self.project}"]\n'
            f'trust_level = "trusted"\n' + self.extra_config
        )

    def env(self, server: ScriptedServer) -> dict[str, str]:
        return {**base_env(self.home), "CODEX_HOME": str(self.codex_home), "OFFLINE_API_KEY": "x"}

    def argv(self, prompt: str) -> list[str]:
        return [
            str(self.exe),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            # hook trust is a per-hook hash Codex records from its TUI; the harness vets its
            # own recorder, so it bypasses trust for this run (trust itself is tested apart)
            *(["--dangerously-bypass-hook-trust"] if self.bypass_trust else []),
            prompt,
        ]

    def install_hooks(self, command: Callable[[str], str]) -> Path:
        path = self.project / ".codex" / "hooks.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        hooks = {
            event: [{"hooks": [{"type": "command", "command": command(event)}]}]
            for event in self.hook_events
        }
        path.write_text(json.dumps({"hooks": hooks}, indent=2))
        return path


class Gemini(Agent):
    name = "gemini"
    server_class = GeminiServer
    hook_events = (
        "SessionStart",
        "BeforeAgent",
        "BeforeModel",
        "AfterModel",
        "BeforeToolSelection",
        "BeforeTool",
        "AfterTool",
        "AfterAgent",
        "Notification",
        "PreCompress",
        "SessionEnd",
    )

    def shell(self, command: str) -> ScriptStep:
        return ToolCall("run_shell_command", {"command": command, "description": "scripted"})

    def setup(self, server: ScriptedServer) -> None:
        settings = self.home / ".gemini" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        user: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }
        settings.write_text(json.dumps(user, indent=2))

    def env(self, server: ScriptedServer) -> dict[str, str]:
        return {
            **base_env(self.home),
            "GEMINI_API_KEY": "offline-test",
            "GOOGLE_GEMINI_BASE_URL": server.url,  # plain http is accepted for 127.0.0.1
            "GEMINI_CLI_TRUST_WORKSPACE": "true",  # else the project's .gemini/ is not loaded
        }

    def argv(self, prompt: str) -> list[str]:
        return [str(self.exe), "-p", prompt, "--yolo", "--output-format", "json"]

    def install_hooks(self, command: Callable[[str], str]) -> Path:
        path = self.project / ".gemini" / "settings.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        hooks = {
            event: [
                {
                    **({"matcher": ".*"} if event in ("BeforeTool", "AfterTool") else {}),
                    "hooks": [
                        {
                            "name": f"record-{event}",
                            "type": "command",
                            "command": command(event),
                            "timeout": 10_000,  # milliseconds
                        }
                    ],
                }
            ]
            for event in self.hook_events
        }
        path.write_text(json.dumps({"hooks": hooks}, indent=2))
        return path


AGENTS: dict[str, type[Agent]] = {cls.name: cls for cls in (ClaudeCode, Codex, Gemini)}
