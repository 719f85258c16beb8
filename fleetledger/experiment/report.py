"""The experiment's tables: the full one (``bench/ab.py``) and the demo's short one."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from fleetledger.experiment.tally import MISSIONS, Results
from ledger.controls import Control
from ledger.money import format_amount


def table(results: Results) -> Table:
    """One row per control: what it caught on, what went wrong off, and what it costs."""
    t = Table(
        title="The controlled experiment: each mission with every control on, then with one off",
        title_justify="left",
    )
    for col in ("control", "mission", "violations", "on: caught / missed / false blocks",
                "off: missed / false blocks", "off: what went wrong", "replay to cut (ms)",
                "kernel µs added", "authorize p50 on / off (ms)"):  # fmt: skip
        t.add_column(col, overflow="fold")
    for control in Control:
        on, off = results.tally(control, False), results.tally(control, True)
        harm = []
        if off.overspend:
            harm.append(f"overspend {format_amount(off.overspend)}")
        if off.wrong_completions:
            harm.append(f"{off.wrong_completions} wrong completion")
        if off.lost_updates:
            harm.append(f"{off.lost_updates} lost update")
        if off.repeated_runs:
            harm.append(f"{off.repeated_runs} repeated run")
        if off.dead_letters:
            harm.append(f"the record's fold refused {off.dead_letters} events after the fact")
        added = results.kernel_added_us(control)
        on_ms, off_ms = (
            results.authorize_p50_ms.get("all"),
            results.authorize_p50_ms.get(f"without {control}"),
        )
        t.add_row(
            control.value,
            MISSIONS[control],
            str(on.violations),
            Text.assemble(
                f"{on.caught} / ",
                (str(on.missed), "red" if on.missed else ""),
                f" / {on.false_blocks}",
            ),
            Text.assemble((str(off.missed), "red" if off.missed else ""), f" / {off.false_blocks}"),
            "; ".join(harm) or "the missed steps",
            "-"
            if on.replay_ms is None
            else f"{on.replay_ms}" + ("" if on.replay_agrees else " (disagrees)"),
            "-" if added is None else f"{added:+.2f} (of {results.kernel_us['all']:.1f})",
            "-" if off_ms is None else f"{on_ms} / {off_ms}",
        )
    return t


def short_table(results: Results) -> Table:
    """The demo's closing version: one line per control, with it and without it."""
    t = Table(
        title="The controlled experiment, short: each mission with the control and without it "
        "(full table: python bench/ab.py)",
        title_justify="left",
    )
    for col in ("control", "mission", "with it", "without it"):
        t.add_column(col, overflow="fold")
    for control in Control:
        on, off = results.tally(control, False), results.tally(control, True)
        let_through = Text(f"{off.missed} of {off.violations} let through", style="red")
        harm: list[str] = []
        if off.overspend:
            harm.append(f"overspend {format_amount(off.overspend)}")
        for n, what in (
            (off.wrong_completions, "wrong completion"),
            (off.lost_updates, "lost update"),
            (off.repeated_runs, "repeated run"),
        ):
            if n:
                harm.append(f"{n} {what}")  # fmt: skip
        t.add_row(
            control.value,
            MISSIONS[control],
            f"{on.caught} of {on.violations} stopped, {on.false_blocks} false blocks",
            Text.assemble(let_through, *(f", {h}" for h in harm)),
        )
    return t


def steps_of(results: Results) -> dict[str, dict[str, list[str]]]:
    return {
        c.value: {"on": results.tally(c, False).steps, "off": results.tally(c, True).steps}
        for c in Control
    }
