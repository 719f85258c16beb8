"""bench/judge.py: the deterministic turn-end path of the node agent (SPEC S11).

A scripted 50-turn mission: items are captured, closed by humans and by checks, blocked,
paused, corrected, and falsely claimed done by the "model". Each turn end goes through the
auto-ledger with a counting judge injected (a real ``Judge`` implementation, no network).
Reported: the share of turn ends resolved with zero model calls, and the median deterministic
turn-end latency next to a raw baseline measured in the same run (a bare SQLite read of the
session's items). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ledger.items import Actor, ItemStatus
from node_agent.autoledger import AutoLedger
from node_agent.judge import JudgeGate
from node_agent.store import Store


class CountingJudge:
    """An in-process model that always answers with a well-formed verdict on item t1."""

    model = "counting"

    def __init__(self) -> None:
        self.calls = 0
        self.item = "t1"

    async def generate(
        self, prompt: str, *, schema: dict[str, Any], max_tokens: int, timeout: float
    ) -> str:
        self.calls += 1
        first = next(line for line in prompt.splitlines() if line[:1] == "t" and ":" in line)
        return json.dumps({"item": first.split(":")[0], "status": "open", "next": "keep going"})


async def mission(turns: int, directory: Path) -> dict[str, float]:
    store = Store(directory / "bench.sqlite3")
    judge = CountingJudge()
    gate = JudgeGate(judge, store, calls_per_run=2)
    ledger = AutoLedger(store, gate=gate)
    human = Actor("human", "ann")
    deterministic_ms: list[float] = []
    zero_call_turns = 0
    session = "bench"
    for turn in range(turns):
        phase = turn % 5
        if phase == 0:  # a new goal with three steps
            ledger.on_prompt(
                session, f"- write part {turn}\n- review part {turn}\n- test part {turn}"
            )
        elif phase == 1:  # the model claims everything done; the firewall keeps them open
            for item in ledger.audit(session).actionable:
                store.record_claim(item.item_id, "done", "model")
        elif phase == 2:  # a correction cancels one item
            ledger.on_prompt(session, f"Actually, skip the review of part {turn - 2}.")
        elif phase == 3:  # a human closes one, one is blocked
            live = ledger.audit(session).actionable
            if live:
                store.set_status(live[0].item_id, ItemStatus.DONE, human)
            if len(live) > 1:
                store.set_status(live[1].item_id, ItemStatus.BLOCKED, human)
        else:  # everything left is paused by the operator: the turn end must be silent
            for item in ledger.audit(session).actionable:
                store.set_status(item.item_id, ItemStatus.PAUSED, human)
        before = judge.calls
        result = await ledger.turn_end(session)
        if judge.calls == before:
            zero_call_turns += 1
            deterministic_ms.append(result.latency_ms)
    # the raw baseline: a bare read of the session's items from the same database
    db = sqlite3.connect(directory / "bench.sqlite3")
    raw: list[float] = []
    for _ in range(max(200, turns)):
        started = time.perf_counter()
        db.execute("SELECT * FROM items WHERE session_id = ? ORDER BY ord", (session,)).fetchall()
        raw.append((time.perf_counter() - started) * 1000)
    db.close()
    store.close()
    median = statistics.median(deterministic_ms) if deterministic_ms else float("nan")
    raw_median = statistics.median(raw)
    return {
        "turns": turns,
        "zero_call_share": zero_call_turns / turns,
        "model_calls": judge.calls,
        "median_turn_end_ms": round(median, 3),
        "raw_sqlite_read_ms": round(raw_median, 4),
        "ratio_vs_raw": round(median / raw_median, 1) if raw_median else float("nan"),
        "target_ms": 5.0,
        "meets_target": median <= 5.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one 50-turn mission")
    parser.add_argument("--turns", type=int, default=None)
    args = parser.parse_args()
    turns = args.turns or (50 if args.quick else 500)
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(mission(turns, Path(tmp)))
    print(
        f"turn ends resolved with zero model calls: {figures['zero_call_share']:.0%} "
        f"({figures['model_calls']} model calls in {turns} turns)",
        file=sys.stderr,
    )
    print(
        f"median deterministic turn end: {figures['median_turn_end_ms']} ms "
        f"(raw SQLite read {figures['raw_sqlite_read_ms']} ms, ratio {figures['ratio_vs_raw']}x; "
        f"target <= 5 ms)",
        file=sys.stderr,
    )
    print(json.dumps({"bench": "judge", **figures}))


if __name__ == "__main__":
    main()
