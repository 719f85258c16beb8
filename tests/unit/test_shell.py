"""The shell parser and the program normaliser: what a command line runs, word by word."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger_hook import programs, shell


def runs(command: str) -> list[list[str]]:
    """The simple commands' words, a dynamic word shown as <why>."""
    simples = [s for s in shell.parse(command).commands if s.words]
    return [[repr(w) if w.why else w.text for w in s.words] for s in simples]


def ran(command: str) -> list[tuple[str, list[str]]]:
    out = programs.run(command)
    assert not out.undecidable, out.undecidable
    return [(i.program, [w.text for w in i.args]) for i in out.invocations]


def undecidable(command: str) -> str:
    reasons = programs.run(command).undecidable
    assert reasons, f"{command!r} was decided"
    return reasons[0]


def test_lists_pipes_and_subshells_yield_every_command() -> None:
    assert runs("a && b || c; d | e |& f & (g; h) && { i; }") == [
        ["a"], ["b"], ["c"], ["d"], ["e"], ["f"], ["g"], ["h"], ["i"]
    ]  # fmt: skip


def test_quotes_and_escapes_are_removed() -> None:
    assert runs("""git 'pu'"sh" \\o$'r\\x69'gin "a b" 'c"d' "e'f" "\\$x" """) == [
        ["git", "push", "origin", "a b", 'c"d', "e'f", "$x"]
    ]


def test_substitutions_are_read_inside_quotes_arguments_and_assignments() -> None:
    substituted = "<a command substitution ($(...))>"
    assert runs('echo "x $(git push) y"') == [["git", "push"], ["echo", substituted]]
    assert ["git", "push"] in runs("X=`git push` ls")
    assert ["git", "push"] in runs("echo ${A:-$(git push)}")
    assert ["git", "push"] in runs("a=(1 $(git push)); echo $(( $(git push | wc -l) + 1 ))")
    assert ["git", "push"] in runs("diff <(git push) - > >(cat)")


def test_a_string_that_mentions_a_command_is_data() -> None:
    assert runs("echo \"git push\" 'kubectl apply' git\\ push") == [
        ["echo", "git push", "kubectl apply", "git push"]
    ]
    assert runs("ls # ; git push") == [["ls"]]


def test_here_docs_expand_only_when_their_delimiter_is_unquoted() -> None:
    expanded = runs("cat <<EOF\ngit push\n$(git status)\nEOF\nls")
    assert expanded == [["cat"], ["git", "status"], ["ls"]]
    assert runs("cat <<'EOF' >f\n$(git push)\nEOF") == [["cat"]]
    assert runs("cat <<-EOF\n\t$(id)\n\tEOF\necho") == [["cat"], ["id"], ["echo"]]


def test_compound_commands_yield_their_bodies_not_their_words() -> None:
    line = (
        "if a; then b; elif c; then d; else e; fi; while f; do g; done; "
        "for x in $(h) y; do i; done; case $v in (p|q) j ;; r) k ;; esac; [[ $(l) =~ ^(m|n)$ ]]"
    )
    assert [w[0] for w in runs(line)] == list("abcdefghijkl")


def test_assignments_are_not_the_program() -> None:
    assert runs("A=1 B=$(id) git push") == [["id"], ["git", "push"]]
    assert runs("x=1; y=$x") == []


def test_unreadable_lines_say_why() -> None:
    for line, why in (
        ("echo 'open", "unclosed '"), ("echo $(ls", "missing ')'"), ("f() { ls; }", "function"),
        ("function f { ls; }", "function"), ("cat <<EOF\nno end", "here-doc"),
        ("x" * (shell.MAX_LENGTH + 1), "characters"),
        ("$(" * (shell.MAX_DEPTH + 2) + ")" * (shell.MAX_DEPTH + 2), "deeper"),
    ):  # fmt: skip
        reasons = shell.parse(line).undecidable
        assert reasons and why in reasons[0], (line[:40], reasons)


@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), min_size=1))
def test_any_quoted_text_is_one_word_with_its_value(text: str) -> None:
    parsed = shell.parse(f"echo {shlex.quote(text)}")
    assert [[w.text for w in s.words] for s in parsed.commands] == [["echo", text]]


@given(st.text(max_size=200))
def test_the_parser_never_raises(text: str) -> None:
    parsed = shell.parse(text)
    assert isinstance(parsed.undecidable, list)


# --- programs ---------------------------------------------------------------------------------


def test_wrappers_are_unwrapped_with_their_options() -> None:
    line = "sudo -u x -H env -i -u HOME A=1 timeout -s KILL 5 nice -n 3 nohup stdbuf -oL git status"
    assert ran(line) == [("git", ["status"])]
    assert ran("command -v git") == []
    assert ran("time -p exec -a x /usr/bin/git log") == [("git", ["log"])]


def test_shell_strings_are_parsed_again() -> None:
    assert ran("bash -c 'sh -c \"git push\"'") == [("git", ["push"])]
    assert ran("bash -lc 'cd x && ls'") == [("cd", ["x"]), ("ls", [])]
    assert ran("bash scripts/test.sh") == [("bash", ["scripts/test.sh"])]


def test_find_exec_and_xargs_run_their_programs() -> None:
    found = ran("find . -name '*.py' -exec grep -l x {} \\; -execdir wc {} +")
    assert found[1:] == [("grep", ["-l", "x", "{}"]), ("wc", ["{}"])]
    out = programs.run("ls | xargs -n1 -I{} git")
    git = next(i for i in out.invocations if i.program == "git")
    assert (git.args[0].why, git.args[0].split) == ("what xargs reads from its input", True)


def test_python_runners_reach_the_program() -> None:
    for line in ("python -m fleetledger todo", "python3.11 -u -X dev -m fleetledger todo",
                 "/v/bin/python /v/bin/fleetledger todo", "uv run --with x fleetledger todo",
                 "poetry run fleetledger todo", "uvx fleetledger todo"):  # fmt: skip
        assert ran(line) == [("fleetledger", ["todo"])], line
    assert ran("python -m pytest -q") == [("pytest", ["-q"])]
    assert ran("python -c 'import os'") == [("python", ["-c", "import os"])]


def test_global_options_are_stripped_before_the_subcommand() -> None:
    assert ran("git -C a -c x=y --no-pager --git-dir=.git -P push") == [("git", ["push"])]
    assert ran("terraform -chdir=infra apply") == [("terraform", ["apply"])]
    assert ran("kubectl --context c -n ns --kubeconfig=k apply") == [("kubectl", ["apply"])]
    assert ran("helm --kube-context c -n ns upgrade") == [("helm", ["upgrade"])]
    assert ran("docker -H tcp://h --context c push") == [("docker", ["push"])]
    assert ran("gh -R o/r pr merge") == [("gh", ["pr", "merge"])]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("$X push", "the program is chosen at run time (a variable ($X))"),
        ("$(which git) push", "command substitution"),
        ("eval ls", "eval"),
        ("alias g=git", "alias"),
        ("echo ls | bash", "reads its commands from its input"),
        ('bash -c "$C"', "built at run time"),
        ("git -c alias.p=push p", "git alias"),
        ("strace ls", "does not model"),
        ("python -m $M", "module"),
        ("git config alias.p push && git p", "a git alias is defined"),
        ("sudo -u $U git status", "may be several words"),
    ],
)
def test_what_cannot_be_decided_says_why(line: str, why: str) -> None:
    assert why in undecidable(line)


def test_what_git_runs_for_you_is_read_as_commands() -> None:
    for line in (
        "git submodule foreach --recursive 'git push'", "git rebase -x 'git push' @~1",
        "git bisect run git push", "git filter-branch --tree-filter 'git push'",
    ):  # fmt: skip
        assert ("git", ["push"]) in ran(line), line
