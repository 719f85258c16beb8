"""The options of the programs the normaliser (``programs``) reads through: wrappers, runners,
shells, Python, and each consequential program's global options before its subcommand.

An option missing here is read both ways by ``programs`` (with and without a value), so a
table that lags a program's new option costs a second reading, never a miss. Stdlib only.
"""

from __future__ import annotations

import re


class Spec:
    """A program's options before what it runs: those taking a value, flags, and whether a
    plain word ends them (``-``-options mixed with operands stop at the first operand)."""

    __slots__ = ("flags", "values")

    def __init__(self, values: str = "", flags: str = "") -> None:
        self.values, self.flags = frozenset(values.split()), frozenset(flags.split())


# Wrappers: options, then the command they run.
WRAPPERS: dict[str, Spec] = {
    "env": Spec("-u --unset -C --chdir -S --split-string", "-i --ignore-environment -0 --null "
                 "-v --debug -"),
    "command": Spec("", "-p"),
    "exec": Spec("-a", "-c -l"),
    "nohup": Spec(),
    "builtin": Spec(),
    "nice": Spec("-n --adjustment"),
    "timeout": Spec("-k --kill-after -s --signal", "--preserve-status --foreground -v "
                     "--verbose"),
    "sudo": Spec("-u --user -g --group -h --host -p --prompt -C --close-from -D --chdir -r "
                  "--role -t --type -U --other-user -T --command-timeout", "-E "
                  "--preserve-env -H --set-home -n --non-interactive -P --preserve-groups -S "
                  "--stdin -b --background -k --reset-timestamp -K -A --askpass -B --bell -i "
                  "--login -s --shell"),
    "doas": Spec("-u -C", "-n -s"),
    "time": Spec("-f --format -o --output", "-p --portability -v --verbose -a --append -q "
                  "--quiet"),
    "stdbuf": Spec("-i --input -o --output -e --error"),
    "setsid": Spec("", "-c --ctty -f --fork -w --wait"),
    "ionice": Spec("-c --class -n --classdata", "-t --ignore"),
    "chronic": Spec("", "-e -v"),
    "caffeinate": Spec("-t -w", "-d -i -m -s -u"),
    "unbuffer": Spec("", "-p"),
    "busybox": Spec(),  # busybox APPLET ARGS
}  # fmt: skip
XARGS = Spec("-n --max-args -L --max-lines -P --max-procs -I -d --delimiter -E -s --max-chars "
              "-a --arg-file --process-slot-var", "-0 --null -r --no-run-if-empty -t --verbose "
              "-p --interactive -x --exit -o --open-tty")  # fmt: skip
# ssh's options: with no operand after them (`GIT_SSH_COMMAND="ssh -i key"`, git adds the host
# and its command) it runs nothing of its own; with operands it is UNMODELLED.
SSH = Spec("-B -b -c -D -E -e -F -I -i -J -L -l -m -O -o -P -p -Q -R -S -W -w", "-4 -6 -A -a "
           "-C -f -G -g -K -k -M -N -n -q -s -T -t -V -v -X -x -Y -y")  # fmt: skip
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "busybox-sh"})
# Runners that start a program of the project's environment: `uv run X`, `poetry run X`...
RUNNERS: dict[tuple[str, str], Spec] = {
    ("uv", "run"): Spec("--with --with-editable --with-requirements --python -p --project "
                         "--directory --package --extra --group --env-file --index "
                         "--default-index --only-group --no-group", "--no-sync --frozen "
                         "--locked --isolated --no-project --all-extras --no-dev --active -q "
                         "--quiet -v --verbose --offline --no-cache --all-packages --exact"),
    ("uv", "tool"): Spec(),
    ("poetry", "run"): Spec("-C --directory -P --project"),
    ("pdm", "run"): Spec("-p --project"),
    ("hatch", "run"): Spec(),
    ("pipenv", "run"): Spec(),
    ("pipx", "run"): Spec("--spec --python"),
    ("conda", "run"): Spec("-n --name -p --prefix", "--no-capture-output --live-stream"),
    ("mamba", "run"): Spec("-n --name -p --prefix", "--no-capture-output --live-stream"),
}  # fmt: skip
PYTHON_NAME = re.compile(r"(python|pypy)(\d+(\.\d+)*)?[a-z]?")
PYTHON = Spec("-W -X --check-hash-based-pycs", "-b -B -d -E -h -i -I -O -OO -q -s -S -u -v "
               "-V -x -P")  # fmt: skip
MODULE_PROGRAMS = {"fleetledger.__main__": "fleetledger"}  # `python -m M` runs program M
# Builtins whose commands cannot be seen before they run. (``source FILE`` and ``. FILE`` run a
# file, like ``bash FILE``: a program of its own, whose content the gate does not see.)
OPAQUE: dict[str, str] = {
    "eval": "eval runs a string built at run time",
    "alias": "an alias is defined in the command",
}
# Programs that run another program in ways not modelled here: refused rather than guessed.
UNMODELLED = frozenset(
    [
        "parallel",
        "watch",
        "script",
        "strace",
        "ltrace",
        "valgrind",
        "gdb",
        "perf",
        "firejail",
        "bwrap",
        "systemd-run",
        "chroot",
        "unshare",
        "nsenter",
        "su",
        "runuser",
        "ssh",
        "expect",
        "tmux",
        "screen",
        "entr",
        "fakeroot",
        "faketime",
        "proot",
        "torsocks",
        "proxychains",
        "proxychains4",
        "dbus-run-session",
        "xvfb-run",
        "taskset",
        "numactl",
        "chrt",
        "setpriv",
        "sg",
        "pkexec",
        "flock",
        "direnv",
        "coproc",
    ]
)
# Global options before the subcommand, per program: (taking a value, flags).
GLOBALS: dict[str, Spec] = {
    "git": Spec("-C -c --git-dir --work-tree --namespace --super-prefix --config-env "
                 "--list-cmds --exec-path", "--no-pager -p --paginate -P --bare "
                 "--no-replace-objects --literal-pathspecs --glob-pathspecs --noglob-pathspecs "
                 "--icase-pathspecs --no-optional-locks --no-advice --no-lazy-fetch"),
    "terraform": Spec("-chdir"),
    "tofu": Spec("-chdir"),
    "kubectl": Spec("--context -n --namespace --kubeconfig --cluster --user -s --server "
                     "--token --as --as-group --as-uid --certificate-authority "
                     "--client-certificate --client-key --request-timeout --cache-dir -v "
                     "--profile --profile-output --tls-server-name --password --username",
                     "--insecure-skip-tls-verify --match-server-version --warnings-as-errors"),
    "helm": Spec("--kube-context -n --namespace --kubeconfig --kube-apiserver --kube-as-user "
                  "--kube-as-group --kube-token --kube-ca-file --registry-config "
                  "--repository-cache --repository-config --burst-limit --qps", "--debug "
                  "--kube-insecure-skip-tls-verify"),
    "gh": Spec("-R --repo --hostname"),
    "docker": Spec("-H --host --context -c --config -l --log-level --tlscacert --tlscert "
                    "--tlskey", "-D --debug --tls --tlsverify"),
    "podman": Spec("--connection -c --url --root --runroot --log-level --cgroup-manager",
                    "--remote -r"),
    "fleetledger": Spec(),
}  # fmt: skip

# Builtins that evaluate a string as code: their command operands (a trap's action, mapfile's
# -C callback) are parsed like `sh -c`; their name operands (`a[$(cmd)]`: bash expands a
# subscript's substitutions) are read for substitutions. name: (options, names of the options
# whose value is a command, names of the options whose value is a name, operands: "names",
# "command" (the first operand) or "" (none)).
EVALUATES: dict[str, tuple[Spec, tuple[str, ...], tuple[str, ...], str]] = {
    "trap": (Spec("", "-l -p"), (), (), "command"),
    "mapfile": (Spec("-d -n -O -s -u -C -c", "-t"), ("-C",), (), "names"),
    "readarray": (Spec("-d -n -O -s -u -C -c", "-t"), ("-C",), (), "names"),
    "let": (Spec(), (), (), "names"),
    "printf": (Spec("-v"), (), ("-v",), ""),
    "read": (Spec("-a -d -i -n -N -p -t -u", "-e -r -s"), (), ("-a",), "names"),
    "unset": (Spec("", "-f -v -n"), (), (), "names"),
    "test": (Spec("-v"), (), ("-v",), ""),
    "[": (Spec("-v"), (), ("-v",), ""),
    **{name: (Spec("", "-a -A -f -F -g -i -I -l -n -r -t -u -x -p"), (), (), "names")
       for name in ("declare", "local", "export", "readonly", "typeset")},
}  # fmt: skip

# Options that take no value, of the subcommands whose rules have unless_flags: after one of
# these (or an operand, or an option with its value attached), an unless flag is an option,
# never another option's value (`git push -o -n` pushes, with push option "-n").
FLAGS: dict[str, Spec] = {
    "git": Spec("", "-q --quiet -v --verbose -f --force --tags --all --mirror -u "
                     "--set-upstream --atomic --porcelain --no-verify --verify --follow-tags "
                     "--no-follow-tags --prune -d --delete --force-with-lease --thin --no-thin "
                     "--progress --no-progress --ipv4 -4 --ipv6 -6 --signed"),
    "kubectl": Spec("", "--all -A --all-namespaces --force --wait --overwrite --prune "
                         "--recursive -R --server-side --force-conflicts --validate "
                         "--record --local"),
    "helm": Spec("", "--install -i --atomic --wait --wait-for-jobs --debug --force "
                      "--create-namespace --reuse-values --reset-values --reset-then-reuse-values "
                      "--cleanup-on-fail --skip-crds --no-hooks --devel --dependency-update "
                      "--disable-openapi-validation --render-subchart-notes --keep-history "
                      "--take-ownership --rollback-on-failure"),
    "terraform": Spec("", "-auto-approve -input=false -no-color -compact-warnings"),
}  # fmt: skip
FLAGS["tofu"] = FLAGS["terraform"]
FLAGS["git-lfs"] = FLAGS["git"]
