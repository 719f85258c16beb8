"""`hooks install codex --trust` and `doctor` against a Codex trust file they cannot use.

Found (review of the adapters' trust step): a config.toml whose tables are not tables
(``projects = 5``) raised AttributeError out of both commands; a CODEX_HOME that is a file, or
a config.toml that is a directory, raised OSError out of the install; a config.toml that is not
TOML was FL-INTERNAL (exit 1) without naming the file, and the hooks file was written before the
trust step failed. Now each is a clear error naming the trust file, exit 2, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetledger.cli import app
from fleetledger.doctor_agent import check_trust
from fleetledger_hook.adapters import ADAPTERS

TRUST_FILES = {
    "not TOML": "this is = = not toml",
    "projects not a table": "projects = 5\n",
    "the project not a table": '[projects]\n"{project}" = "x"\n',
    "hooks not a table": "hooks = [1]\n",
    "a hook's state not a table": '[hooks.state]\n"{hooks}:stop:0:0" = "x"\n',
    "not UTF-8": b"\xff\xfe = 1",
    "CODEX_HOME a file": None,
    "config.toml a directory": None,
}


def codex_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> tuple[Path, Path]:
    project, home = (tmp_path / "project").resolve(), tmp_path / "codex-home"
    project.mkdir()
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CODEX_HOME", str(home))
    body = TRUST_FILES[case]
    if case == "CODEX_HOME a file":
        home.write_text("x")
        return project, home
    home.mkdir()
    config = home / "config.toml"
    if case == "config.toml a directory":
        config.mkdir()
    elif isinstance(body, bytes):
        config.write_bytes(body)
    else:
        hooks = project / ADAPTERS["codex"].settings_file
        config.write_text(str(body).format(project=project, hooks=hooks))
    return project, home


@pytest.mark.parametrize("case", sorted(TRUST_FILES))
def test_an_unusable_trust_file_is_a_clear_refusal(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, home = codex_home(tmp_path, monkeypatch, case)
    before = sorted((p, p.read_bytes() if p.is_file() else None) for p in home.rglob("*"))
    done = CliRunner().invoke(app, ["hooks", "install", "codex", "--project", str(project),
                                    "--trust"])  # fmt: skip
    assert done.exit_code == 2, (repr(done.exception), done.output)
    assert "config.toml" in done.output or str(home) in done.output, done.output
    assert not (project / ADAPTERS["codex"].settings_file).exists()  # nothing half-written
    assert sorted((p, p.read_bytes() if p.is_file() else None) for p in home.rglob("*")) == before
    found = check_trust("codex", project)  # doctor: a failed check, not a traceback
    assert not found.ok and found.fix is not None


def test_the_trust_step_writes_through_a_symlinked_config_and_leaves_no_staged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trust file is replaced whole (never left half-written), through a symlink as a
    dotfile manager keeps it, as a plain write did."""
    project, home = (tmp_path / "project").resolve(), tmp_path / "codex-home"
    project.mkdir()
    (home / "dotfiles").mkdir(parents=True)
    real = home / "dotfiles" / "config.toml"
    real.write_text('model = "o3"\n')
    (home / "config.toml").symlink_to(real)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CODEX_HOME", str(home))
    done = CliRunner().invoke(app, ["hooks", "install", "codex", "--project", str(project),
                                    "--trust"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert (home / "config.toml").is_symlink() and 'model = "o3"' in real.read_text()
    assert check_trust("codex", project).ok
    assert sorted(p.name for p in home.rglob("*")) == ["config.toml", "config.toml", "dotfiles"]


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
@pytest.mark.parametrize("shape", ["settings a directory", "its directory a file"])
def test_a_project_settings_path_the_agent_made_unusable_is_a_clear_refusal(
    agent: str, shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found (review): the agent owns its project; a settings file it made a directory (or a
    settings directory it made a file) had `hooks install` end in an OSError traceback, after
    --trust staged the trust file. Now exit 2 naming the path, the trust file untouched."""
    project, home = codex_home(tmp_path, monkeypatch, "not TOML")
    (home / "config.toml").write_text("")  # a usable trust file
    settings = project / ADAPTERS[agent].settings_file
    if shape == "settings a directory":
        settings.mkdir(parents=True)
    else:
        settings.parent.write_text("x")
    done = CliRunner().invoke(app, ["hooks", "install", agent, "--project", str(project),
                                    "--trust"])  # fmt: skip
    assert done.exit_code == 2, (repr(done.exception), done.output)
    assert "not written" in done.output and str(project) in done.output, done.output
    assert sorted(p.name for p in home.iterdir()) == ["config.toml"]
    assert (home / "config.toml").read_text() == ""


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
def test_hooks_install_writes_through_no_link_the_agent_left_in_its_project(
    agent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found (review): the project is the agent's (a sandboxed one writes only there). A
    symlink it left at the installer's temporary name had the person's `hooks install` write
    the settings JSON over the link's target outside the project; a settings directory
    linked out of the project had the hooks merged into whatever it names (the user's own
    global settings). The one is written beside, never through; the other is refused."""
    project, _ = codex_home(tmp_path, monkeypatch, "not TOML")
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me\n")
    settings = project / ADAPTERS[agent].settings_file
    settings.parent.mkdir(parents=True)
    settings.with_suffix(settings.suffix + ".tmp").symlink_to(victim)
    done = CliRunner().invoke(app, ["hooks", "install", agent, "--project", str(project)])
    assert done.exit_code == 0, done.output
    assert victim.read_text() == "keep me\n" and settings.is_file()
    settings.unlink()
    settings.parent.rmdir()
    settings.parent.symlink_to(outside)
    done = CliRunner().invoke(app, ["hooks", "install", agent, "--project", str(project)])
    assert done.exit_code == 2 and "leads out of" in done.output, done.output
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
