"""The node agent's settings: one pydantic-settings object, prefix FLEET_, `__` nesting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from fleetbus.http import loopback_host
from fleetbus.settings import FleetBaseSettings
from fleetledger_hook import policy
from fleetledger_hook.policy import SHELL_TOOLS

SHELL_TOOLS_PATTERN = SHELL_TOOLS


class ConsequentialRule(BaseModel):
    """A consequential rule (``fleetledger_hook.policy`` reads it): for shell commands a
    ``program``, its ``subcommand`` path and optional ``flags`` (any one of them); for other
    tools a ``tool`` name regex and a ``pattern`` on the input's JSON. ``person``: only a
    person may do it, refused from an agent's tool whatever its grant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    program: str | None = None  # the program's basename, e.g. "git"
    subcommand: tuple[str, ...] = ()  # e.g. ("push",), ("todo", "done")
    flags: tuple[str, ...] = ()  # consequential only with one of these, e.g. ("--check-cmd",)
    unless_flags: tuple[str, ...] = ()  # not consequential with one of these: ("--dry-run",)
    tool: str | None = None  # non-shell tools: regex on the tool name, e.g. "^mcp__deploy"
    pattern: str | None = None  # non-shell tools: regex searched in the input's JSON
    action: str  # the ledger action name, e.g. "git.push"
    cost: str = "0"  # currency units ("0.04"), stored as micros when asking
    person: bool = False

    @model_validator(mode="after")
    def _usable(self) -> ConsequentialRule:
        try:
            policy.Rule(self.policy_form())
        except policy.RuleError as exc:
            raise ValueError(exc.detail) from None
        return self

    def policy_form(self) -> dict[str, Any]:
        """The rule as the hook process reads it (``node-agent.hook.json``)."""
        return self.model_dump(exclude_none=True)


def compiled(rules: list[ConsequentialRule]) -> tuple[policy.Rule, ...]:
    """The node's rules as the one matcher takes them (checked when the settings loaded)."""
    return policy.compile_rules(r.policy_form() for r in rules)


# The one list of defaults, shared with the hook process (which needs it when we are down).
DEFAULT_RULES: tuple[ConsequentialRule, ...] = tuple(
    ConsequentialRule(**rule) for rule in policy.DEFAULT_RULES
)


class CacheRule(BaseModel):
    """A command whose result can be answered from the record while its inputs are unchanged.

    ``inputs`` are globs relative to the command's working directory (``**/*.py``); ``resources``
    are extra resource ids it reads (``svc:orders``); ``workspace``: it may read any file of the
    workspace (a test run reads data and config too), so its record holds only while the
    workspace fingerprint does (``node_agent.workspace``). Commands with pipes, redirections,
    chains or substitutions are never cached, whatever the pattern says.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str = SHELL_TOOLS_PATTERN
    pattern: str  # regex searched in the command
    inputs: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    workspace: bool = False

    def matches(self, tool: str, command: str) -> bool:
        return (
            re.search(self.tool, tool) is not None and re.search(self.pattern, command) is not None
        )


def cache_rule(rules: list[CacheRule], tool: str, command: str) -> CacheRule | None:
    """The first rule that declares this command cacheable, if any."""
    return next((r for r in rules if r.matches(tool, command)), None)


PY_INPUTS = (
    "**/*.py", "**/*.pyi", "pyproject.toml", "setup.cfg", "setup.py", "tox.ini", "pytest.ini",
    "mypy.ini", ".mypy.ini", "ruff.toml", ".ruff.toml", "requirements*.txt",
)  # fmt: skip

# Conservative: read-only checkers whose result depends on the Python sources and their config;
# a test run may read any file (data, fixtures, conftest), so it follows the whole workspace.
DEFAULT_CACHEABLE: tuple[CacheRule, ...] = (
    CacheRule(pattern=r"^\s*(python3? -m )?ruff (check|format --check)\b", inputs=PY_INPUTS),
    CacheRule(pattern=r"^\s*(python3? -m )?(mypy|pyright|flake8)\b", inputs=PY_INPUTS),
    CacheRule(pattern=r"^\s*(python3? -m )?pytest\b", workspace=True),
    CacheRule(pattern=r"^\s*python3? -m unittest\b", workspace=True),
)


class NodeSettings(FleetBaseSettings):
    """Everything a node agent (daemon, hooks, `todo`) reads from FLEET_* or fleet.env."""

    node_id: str = "node-local"
    mission: str = "local"  # node-local events need a mission; a session may name its own
    grant_id: str | None = None  # the grant consequential actions are authorised under
    nats_url: str | None = None
    socket: Path | None = None  # default: <state_dir>/node-agent.sock
    http_port: int | None = None  # loopback HTTP API when set (bearer token); 0: a free port
    http_host: Annotated[str, AfterValidator(loopback_host)] = "127.0.0.1"  # loopback only

    # the loopback judge (docs/judge.md); None: no model, the deterministic auditor only
    judge_url: str | None = None
    judge_api: Literal["ollama", "openai"] = "ollama"  # /api/generate or /v1/chat/completions
    judge_model: str = "gemma3:1b"
    judge_calls_per_run: int = Field(default=2, ge=0)
    judge_max_tokens: int = Field(default=64, ge=1, le=512)
    judge_timeout_s: float = Field(default=3.0, gt=0, le=30)
    judge_run_budget_tokens: int = Field(default=256, ge=0)  # run-level admission budget
    judge_cooldown_s: float = Field(default=300.0, ge=0)
    verdict_ttl_s: float = Field(default=600.0, gt=0)

    stop_block_cap: int = Field(default=3, ge=1)  # consecutive Stop blocks before letting go
    reminders_fail_open: bool = True  # node agent down: skip reminders (open) with a message
    consequential: list[ConsequentialRule] = Field(default_factory=lambda: list(DEFAULT_RULES))
    check_timeout_s: float = Field(default=30.0, gt=0)
    # a person's transitions (todo done/block/cancel --by, todo check, evidence) need a request
    # signed by a person's key; True runs this node explicitly without identity: an unsigned
    # --by is believed, so anyone on this account (an agent too) can act as anyone
    trust_unsigned_humans: bool = False
    # a TOML file of completion rules tried before the shipped ones (node_agent/todo/completion.py)
    completion_rules: Path | None = None

    # the execution state (docs/execution-state.md): cacheable commands, shared roots, the
    # fleet's modifications
    cacheable: list[CacheRule] = Field(default_factory=lambda: list(DEFAULT_CACHEABLE))
    cache_failures: bool = False  # answer a failed run from the record too (off: rerun it)
    cache_scan_limit: int = Field(default=5000, ge=1)  # more input files: uncertain, runs
    shared: dict[str, str] = Field(default_factory=dict)  # local root -> fleet id ("repo:app")
    follow_fleet: bool = True  # fold other nodes' resource.modified events from the stream
    hook_timeout_s: float = Field(default=10.0, gt=0)

    @property
    def db_path(self) -> Path:
        return self.state_dir / "node-agent.sqlite3"

    @property
    def socket_path(self) -> Path:
        return self.socket or self.state_dir / "node-agent.sock"
