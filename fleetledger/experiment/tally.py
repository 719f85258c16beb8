"""What each mission scored in each arm (``Tally``), what showed the run was secure
(``Secured``), and the whole run's ``Results`` with its verdict and figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.controls import KERNEL_CONTROLS, Control
from ledger.errors import Rule
from ledger.money import format_amount

# refusals that come from identity (who signed, what they may do, their role bindings), not
# from a control under test; a grant refused under grant_authority: its issuer holds no role
# (in a decision, grant_authority is the grant's own scope, a check of the kernel's)
IDENTITY_RULES = frozenset({Rule.PRODUCER_IDENTITY, Rule.PRODUCER_PERMISSION, Rule.ROLE_BINDING})
ISSUER_RULES = IDENTITY_RULES | {Rule.GRANT_AUTHORITY}

# Which mission exercises which control (SPEC S1's failures).
MISSIONS: dict[Control, str] = {
    Control.EVIDENCE_GATING: "invoice exception",
    Control.RISK_NON_ERASURE: "credit recommendation, covenant risk handed on as prose",
    Control.ATTENUATION: "delegation that widens authority",
    Control.SHARED_RESERVATIONS: "4 branches race for 0.50 of 0.80",
    Control.STATUS_FIREWALL: "agent declares itself done early",
    Control.STALE_PREMISE: "edit premised on a file another agent changed",
    Control.RECORD_ANSWERS: "a repeated test command",
}


@dataclass
class Tally:
    """One mission in one arm: its scripted steps against what the system let through."""

    control: Control  # the control this mission is about
    off: Control | None  # the control the arm switched off (None: every control on)
    violations: int = 0  # steps the script knows must be stopped
    caught: int = 0
    missed: int = 0
    legit: int = 0  # steps that must go through
    false_blocks: int = 0
    overspend: int = 0  # micro-units admitted beyond the ceiling
    wrong_completions: int = 0  # the run ended as "done" with work not done
    repeated_runs: int = 0  # commands executed again while their recorded result was valid
    lost_updates: int = 0  # another agent's change overwritten
    dead_letters: int = 0  # events the ledger's fold refused after the fact (the record's check)
    replay_ms: float | None = None  # replay to the cut of the mission's first violation
    replay_agrees: bool | None = None  # the replayed state gives the recorded verdict
    # steps identity refused (signature, permission, an issuer's or a binder's role): not a
    # control's catch; the verdict names each
    identity_refusals: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    def step(
        self, what: str, *, violation: bool, stopped: bool, rule: str | None = None,
        identity: frozenset[Rule] = IDENTITY_RULES,
    ) -> None:  # fmt: skip
        """One scripted step; ``rule``: the rule that stopped it (one of ``identity``: a
        refusal by identity, recorded apart and not counted as caught)."""
        by_identity = stopped and rule in identity
        if by_identity:
            self.identity_refusals.append(f"{what}: {rule}")
        if violation:
            self.violations += 1
            self.caught += stopped and not by_identity
            self.missed += not stopped
        else:
            self.legit += 1
            self.false_blocks += stopped
        mark = (
            ("caught" if stopped else "MISSED")
            if violation
            else ("FALSE BLOCK" if stopped else "ok")
        )
        self.steps.append(f"{what}: {mark}" + (f" ({rule})" if stopped and rule else ""))

    @property
    def harm(self) -> int:
        """What went wrong: let-through violations and their consequences."""
        return self.missed + self.wrong_completions + (self.overspend > 0)


@dataclass(frozen=True)
class Secured:
    """What shows a run was on the secure default: measured on its fleet, not assumed."""

    principals: int  # in the directory nats-server, the coordinators and the clients used
    anonymous_refused: bool  # nats-server refused a connection that presented no key
    node_events: int  # the node agent's observations, each verified as ingest verifies
    node_refusals: tuple[str, ...] = ()  # ...and those verification refused ("kind: rule")
    node_published: int = 0  # what its outbox says it published (each must be found verified)

    def problems(self) -> list[str]:
        out = []
        if not self.anonymous_refused:
            out.append("identity: nats-server let a connection without a key in (an open NATS)")
        if not self.node_events:
            out.append("identity: no signed observation of the node agent reached the stream")
        elif self.node_events < self.node_published:
            out.append(
                f"identity: the node agent published {self.node_published} events, "
                f"{self.node_events} were read back verified"
            )
        out += [f"identity: a node agent event was refused: {r}" for r in self.node_refusals]
        return out


@dataclass
class Results:
    tallies: list[Tally]
    kernel_us: dict[str, float]  # per decision: "all" and "without <control>"
    authorize_p50_ms: dict[str, float]  # end to end over NATS: "all" and "without <control>"
    seconds: float
    cross_effects: list[str]  # an arm that changed a mission it is not about (expected: none)
    secured: Secured

    def tally(self, control: Control, off: bool) -> Tally:
        want = control if off else None
        return next(t for t in self.tallies if t.control is control and t.off is want)

    def verdict(self) -> list[str]:
        """What falls short of the issue's bar (empty: every control earns its keep)."""
        problems = []
        for control in Control:
            on, off = self.tally(control, False), self.tally(control, True)
            if on.harm:
                problems.append(f"{control}: something went wrong with every control on")
            if not off.harm:
                problems.append(f"{control}: nothing went wrong with it off")
            if on.false_blocks:
                problems.append(f"{control}: {on.false_blocks} false block(s) with it on")
            for t in (on, off):
                arm = "off" if t.off else "on"
                problems += [f"{control} {arm}: identity refused {r}" for r in t.identity_refusals]
        return problems + self.secured.problems()

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bench": "ab", "seconds": round(self.seconds, 2)}
        for control in Control:
            on, off = self.tally(control, False), self.tally(control, True)
            out[control.value] = {
                "mission": MISSIONS[control],
                "violations": on.violations,
                "on": _brief(on),
                "off": _brief(off),
                "kernel_us_added": self.kernel_added_us(control),
                "authorize_p50_ms_on": self.authorize_p50_ms.get("all"),
                "authorize_p50_ms_off": self.authorize_p50_ms.get(f"without {control}"),
            }
        out["kernel_us_all"] = self.kernel_us.get("all")
        out["authorize_p50_ms"] = self.authorize_p50_ms
        out["cross_effects"] = self.cross_effects
        out["identity"] = {
            "principals": self.secured.principals,
            "anonymous_refused": self.secured.anonymous_refused,
            "node_events_verified": self.secured.node_events,
            "node_events_published": self.secured.node_published,
            "node_refusals": list(self.secured.node_refusals),
        }
        out["shortfalls"] = self.verdict()
        return out

    def kernel_added_us(self, control: Control) -> float | None:
        if control not in KERNEL_CONTROLS or not self.kernel_us:
            return None
        return round(self.kernel_us["all"] - self.kernel_us[f"without {control}"], 3)


def _brief(t: Tally) -> dict[str, Any]:
    return {
        "caught": t.caught, "missed": t.missed, "false_blocks": t.false_blocks,
        "overspend": format_amount(t.overspend), "wrong_completions": t.wrong_completions,
        "repeated_runs": t.repeated_runs, "lost_updates": t.lost_updates,
        "replay_ms": t.replay_ms, "replay_agrees": t.replay_agrees,
        "dead_letters": t.dead_letters, "identity_refusals": t.identity_refusals,
    }  # fmt: skip
