"""bench/ab.py --quick on the real stack: every control stops its failure when on, something
goes wrong when it is off, and no control blocks a legitimate step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.controls import KERNEL_CONTROLS, Control

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_quick_experiment_shows_each_control_earns_its_keep() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ab.py"), "--quick"],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "ab" and figures["shortfalls"] == []
    assert figures["cross_effects"] == []  # an arm changes only the mission of its control
    # on the secure default: nkey NATS, signed requests and observations, verified
    identity = figures["identity"]
    assert identity["anonymous_refused"] is True and identity["principals"] >= 14
    assert identity["node_events_verified"] > 0 and identity["node_refusals"] == []
    assert identity["node_events_verified"] == identity["node_events_published"]
    for control in Control:
        row = figures[control.value]
        on, off = row["on"], row["off"]
        assert row["violations"] >= 1
        assert on["missed"] == 0 and on["false_blocks"] == 0, (control, on)
        assert on["caught"] == row["violations"], (control, on)
        assert on["overspend"] == "0.00" and on["wrong_completions"] == 0
        assert on["identity_refusals"] == off["identity_refusals"] == [], (control, on, off)
        harm = off["missed"] + off["wrong_completions"] + (off["overspend"] != "0.00")
        assert harm >= 1, (control, off)
        if control in KERNEL_CONTROLS:  # a decision's state is rebuilt from the stream
            assert on["replay_agrees"] is True and on["replay_ms"] > 0
            assert isinstance(row["kernel_us_added"], float)
            assert row["authorize_p50_ms_on"] > 0 and row["authorize_p50_ms_off"] > 0
    assert figures["shared_reservations"]["off"]["overspend"] != "0.00"
    assert figures["status_firewall"]["off"]["wrong_completions"] == 1
    assert figures["stale_premise"]["off"]["lost_updates"] == 1
    assert figures["record_answers"]["off"]["repeated_runs"] == 1
