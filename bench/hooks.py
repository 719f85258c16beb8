"""bench/hooks.py: one agent hook call end to end, with a node agent running (SPEC S5.5, S11).

Each call is what an agent CLI does: ``sh -c <the installed command>`` with the hook JSON on
stdin, to the answer on stdout. Measured in one run against a real node agent
(`fleetledger node-agent run`): a PreToolUse, a PostToolUse and a Stop through the installed
stdlib hook (``python -S .../fleetledger_hook``), the same PreToolUse through the CLI command
(`fleetledger hook`, what was installed before), and the baseline, a no-op command hook
(``sh -c true``). Target: p50 <= 30 ms per call. Then the structural judge alone
(``fleetledger_hook.policy.judge``: parse, unwrap, match) over every command of the spelling
corpus (tests/fixtures/shell_corpus.toml), beside the regular expressions it replaced as the
raw baseline. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from fleetledger_hook import policy
from node_agent.hooks import hook_command

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "shell_corpus.toml"
# The regular expressions over the command text that the structural judge replaced (baseline).
REGEX_BASELINE = tuple(re.compile(r) for r in (
    r"\bgit\s+push\b", r"\b(kubectl|helm)\b.*\b(apply|install|upgrade|delete|rollout)\b",
    r"\b(terraform|tofu)\s+(apply|destroy)\b", r"\bfleetledger\s+todo\s+(done|cancel)\b",
))  # fmt: skip


def judge_figures(rounds: int) -> dict[str, float | int]:
    """The judge's own cost per command over the corpus (ms; each command's best of
    ``rounds``, so a loaded machine's pauses do not count), and the regex baseline's."""
    corpus = tomllib.loads(CORPUS.read_text())
    commands = [*corpus["ordinary"], *(c for cs in corpus["consequential"].values() for c in cs)]
    rules = policy.compile_rules(policy.DEFAULT_RULES)
    judged = [float("inf")] * len(commands)
    regex = [float("inf")] * len(commands)
    for _ in range(rounds):
        for at, command in enumerate(commands):
            started = time.perf_counter()
            policy.judge(rules, "Bash", {"command": command})
            judged[at] = min(judged[at], (time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            any(r.search(command) for r in REGEX_BASELINE)
            regex[at] = min(regex[at], (time.perf_counter() - started) * 1000)
    return {
        "corpus_commands": len(commands), "judge_rounds": rounds,
        "judge_p50_ms": p(judged, 0.5, 4), "judge_p99_ms": p(judged, 0.99, 4),
        "regex_p50_ms": p(regex, 0.5, 4),
        "judge_to_regex_p50": round(p(judged, 0.5, 4) / max(1e-6, p(regex, 0.5, 4)), 1),
    }  # fmt: skip


def start_node(state: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "node-agent", "run", "--state-dir", str(state)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (state / "node-agent.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the node agent did not start")
        time.sleep(0.05)
    return proc


def timed(command: str, payload: dict[str, object], n: int, env: dict[str, str]) -> list[float]:
    raw = json.dumps(payload).encode()
    out: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        done = subprocess.run(["sh", "-c", command], input=raw, capture_output=True, env=env)
        out.append((time.perf_counter() - started) * 1000)
        if done.returncode not in (0,):
            raise SystemExit(f"{command!r} exited {done.returncode}: {done.stderr.decode()}")
    return out


def p(values: list[float], q: float, digits: int = 2) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="30 calls of each kind")
    parser.add_argument("--calls", type=int, default=0)
    args = parser.parse_args()
    n = args.calls or (30 if args.quick else 200)
    state = Path(tempfile.mkdtemp(prefix="fl-bh-", dir="/tmp"))
    project = state / "project"
    project.mkdir()
    node = start_node(state)
    sock = state / "node-agent.sock"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}}
    env["PYTHONPATH"] = str(ROOT)
    try:
        session = "bench-session"
        base = {"session_id": session, "cwd": str(project)}
        prompt = {**base, "hook_event_name": "UserPromptSubmit",
                  "prompt": "1. write hello.txt\n2. run the tests"}  # fmt: skip
        subprocess.run(
            ["sh", "-c", hook_command("claude-code", "UserPromptSubmit", socket=sock)],
            input=json.dumps(prompt).encode(),
            capture_output=True,
            env=env,
            check=True,
        )
        pre = {**base, "hook_event_name": "PreToolUse", "tool_name": "Bash",
               "tool_input": {"command": "ls -la"}, "tool_use_id": "toolu_1"}  # fmt: skip
        post = {
            **pre,
            "hook_event_name": "PostToolUse",
            "tool_response": {"stdout": "total 0", "stderr": "", "interrupted": False},
        }
        stop = {**base, "hook_event_name": "Stop", "stop_hook_active": False}
        figures: dict[str, float | int | bool | str] = {"calls": n}
        noop = timed("true", pre, n, env)
        for name, event, payload in (("pre", "PreToolUse", pre), ("post", "PostToolUse", post),
                                     ("stop", "Stop", stop)):  # fmt: skip
            ms = timed(hook_command("claude-code", event, socket=sock), payload, n, env)
            figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = p(ms, 0.5), p(ms, 0.99)
        fleetledger = shutil.which("fleetledger", path=str(Path(sys.executable).parent))
        if fleetledger:  # the CLI command hook (what `hooks install` wrote before)
            cli_env = {**env, "FLEET_SOCKET": str(sock)}
            cli = timed(f"{fleetledger} hook claude-code PreToolUse", pre, max(5, n // 6), cli_env)
            figures["cli_pre_p50_ms"] = p(cli, 0.5)
        figures["noop_p50_ms"], figures["noop_p99_ms"] = p(noop, 0.5), p(noop, 0.99)
        worst = max(float(figures[f"{k}_p50_ms"]) for k in ("pre", "post", "stop"))
        figures["ratio_p50_to_noop"] = round(worst / max(0.01, float(figures["noop_p50_ms"])), 1)
        figures["target_p50_ms"] = 30
        figures["meets_target"] = worst <= 30
        figures.update(judge_figures(5 if args.quick else 20))
        print(f"hook call p50 (ms): pre {figures['pre_p50_ms']}, post {figures['post_p50_ms']}, "
              f"stop {figures['stop_p50_ms']}; no-op command hook {figures['noop_p50_ms']}; "
              f"`fleetledger hook` CLI {figures.get('cli_pre_p50_ms', 'n/a')}")  # fmt: skip
        print(f"judge over the {figures['corpus_commands']}-command corpus (ms, best of "
              f"{figures['judge_rounds']}): p50 "
              f"{figures['judge_p50_ms']}, p99 {figures['judge_p99_ms']}; regex baseline p50 "
              f"{figures['regex_p50_ms']} ({figures['judge_to_regex_p50']}x)")  # fmt: skip
        print(json.dumps({"bench": "hooks", **figures}))
    finally:
        node.terminate()
        node.wait(10)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
