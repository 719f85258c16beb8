"""Error text is printed literally wherever it carries user values (issue 24, finding 7).

rich read ``[a-z0-9]`` in a message as markup and dropped it: `--action 'x.do '` showed the
pattern as ``'^{0,127}$'``. Each CLI module's error path (the action commands, `identity`,
`hooks install`) is run as a user runs it, with a value holding brackets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.events import ACTION_PATTERN


def fleetledger(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_STATE_DIR"] = str(state)  # no running fleet: each error comes before any I/O
    return subprocess.run([sys.executable, "-m", "fleetledger", *args], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_pattern_in_an_action_error_survives_literally(tmp_path: Path) -> None:
    done = fleetledger("action", "request", "a1", "-m", "m1", "--grant", "g", "--action",
                       "x.do ", "--cost", "0.05", state=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"'{ACTION_PATTERN}'" in done.stderr, done.stderr


def test_a_name_in_an_identity_error_survives_literally(tmp_path: Path) -> None:
    done = fleetledger("identity", "revoke", "[bold]nobody", "--dir", str(tmp_path / "keys"),
                       state=tmp_path)  # fmt: skip
    assert done.returncode != 0, done.stderr
    assert "no principal '[bold]nobody'" in done.stderr, done.stderr


@pytest.mark.parametrize("name", ["[red]p", "a [b] :x: c"])
def test_a_path_in_a_hooks_install_error_survives_literally(tmp_path: Path, name: str) -> None:
    project = tmp_path / name  # inside the state dir: refused, naming the project
    done = fleetledger("hooks", "install", "claude-code", "--project", str(project),
                       state=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"error [FL-INPUT] {project} is inside" in done.stderr, done.stderr


def rendered(*renderables: object) -> str:
    """What the CLI's own console prints of these."""
    from fleetledger._cli import console

    out = console()
    out.begin_capture()
    for r in renderables:
        out.print(r, soft_wrap=True)
    return out.end_capture()


HOSTILE = "fix the [/] parser, see [bold red]x :x: \\[y]"


@pytest.mark.parametrize(
    "module", ["fleetledger.cli", "fleetledger.cli_node", "fleetledger.cli_identity",
               "fleetledger.cli_roles", "fleetledger.cli_todo", "fleetledger.web",
               "fleetledger._cli"],
)  # fmt: skip
def test_every_cli_console_prints_what_it_is_given_literally(module: str) -> None:
    """`todo add 'fix the [/] parser'` added the item, then died in a MarkupError traceback;
    `todo add 'see [bold red]x'` printed 'see x': each module's consoles are literal."""
    import importlib

    mod = importlib.import_module(module)
    for name in ("out", "err"):
        printer = getattr(mod, name, None)
        if printer is None:
            continue
        printer.begin_capture()
        printer.print(HOSTILE, soft_wrap=True)
        assert printer.end_capture() == HOSTILE + "\n", (module, name)


def test_a_todo_item_text_and_a_project_path_print_literally() -> None:
    from rich.text import Text

    from fleetledger._cli import literal

    line = Text.assemble("added ", ("t1", "bold"), f" (s-t1): {HOSTILE}")
    assert rendered(line, literal(HOSTILE, "red")) == f"added t1 (s-t1): {HOSTILE}\n{HOSTILE}\n"


def test_a_denial_reason_in_the_receipt_survives_literally() -> None:
    from fleetledger.render import decision_table
    from ledger.kernel import Decision

    reason = "evidence [ev-1] is superseded by [bold]ev-2[/] :x:"
    decision = Decision(allowed=False, reason=reason, action_id="a1", action="credit.issue",
                        grant_id="g", cost=0, cut=3)  # fmt: skip
    assert reason in rendered(decision_table(decision))


def test_a_purpose_and_a_risk_summary_in_the_team_view_survive_literally() -> None:
    from fleetledger.render import team_view
    from ledger.views import MissionView

    risk = {"risk_id": "r1", "blocks": ["credit.issue"], "scope": "m1", "owner": "t",
            "status": "open", "summary": "covenant [b]breach[/b] :warning:", "risk_roles": [],
            "may_treat": []}  # fmt: skip
    view = MissionView.model_validate({
        "mission_id": "m1", "exists": True, "purpose": "credit [red]October[/]", "owner": "lead",
        "version": 1, "applied_seq": 0, "grants": [], "rejected_grants": {}, "risks": [risk],
        "open_blockers": [risk], "actions": [], "decisions": [],
        "progress": {"total": 0, "counts": {}, "agents": []},
    })  # fmt: skip
    text = rendered(*team_view(view))
    assert "credit [red]October[/]" in text and "covenant [b]breach[/b] :warning:" in text
