"""The items' checks as this node runs them: on a claim, again when their inputs changed.

A check that did not pass is run again only when what it reads changed since (``recheck``); an
item a passed check closed is reopened when the node's own run on the workspace as it is now no
longer passes (``revalidate``). Every status change goes through the store's firewall with the
check as its actor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ledger.items import Actor, ItemStatus
from node_agent.execution.state import ExecutionState
from node_agent.todo import recheck
from node_agent.todo.auditor import Audit, closed_by_check
from node_agent.todo.checks import CheckResult, EvidenceCheck, PassedCheck, WrittenCheck, run_check
from node_agent.todo.item import StoredItem
from node_agent.todo.item_store import ItemStore
from node_agent.todo.recheck import Verified
from node_agent.todo.verifier import Verifier
from node_agent.workspace import Fingerprint


class Checker:
    """Runs items' checks here and remembers, by item, what a check that did not pass read."""

    def __init__(
        self, store: ItemStore, execution: ExecutionState, verifier: Verifier, *, timeout_s: float
    ) -> None:
        self.store, self.execution, self.verifier = store, execution, verifier
        self.check_timeout_s = timeout_s
        # the checks that ran here and did not pass, by item: what their inputs were then
        self._verified: dict[str, Verified] = {}
        # by session: its checked items, what they read at its last turn end (what moved since)
        self._watches: dict[str, recheck.Watch] = {}

    async def verify(self, stored: StoredItem, seen: dict[str, Fingerprint] | None = None) -> bool:
        """Run the item's check here; a pass moves it to done as the check's own actor.
        ``seen``: the workspace fingerprints this turn end took already."""
        return (await self.check(stored, seen))[0].passed

    async def check(
        self, stored: StoredItem, seen: dict[str, Fingerprint] | None = None
    ) -> tuple[CheckResult, bool]:
        """``verify``, with the check's result (its detail is what the item now records) and
        whether the check ran to a verdict (an error while running it is no verdict)."""
        check, run = stored.check, self.store.run
        if check is None:
            return CheckResult(passed=False, detail="no check"), False
        judged = True
        known, versions, suite = False, None, None
        try:  # any error is a failed check with its detail, never an exception
            if isinstance(check, EvidenceCheck):
                known = await run(self.store.evidence_known, check.evidence_id)
            elif isinstance(check, WrittenCheck):  # the workspace, off the event loop
                versions = await asyncio.to_thread(
                    self.execution.matching, check.cwd, check.pattern
                )
            elif isinstance(check, PassedCheck):  # the node's own run, cached by workspace state
                suite = await self.verifier.check(check, seen)
            result = await run_check(
                check, evidence_known=lambda _: known, versions=versions, suite=suite,
                timeout=self.check_timeout_s,
            )  # fmt: skip
        except Exception as exc:
            result = CheckResult(passed=False, detail=f"the check failed to run ({exc})")
            judged = False
        if result.passed:
            await run(
                self.store.set_status,
                stored.item_id,
                ItemStatus.DONE,
                Actor("check", check.describe(), check_passed=True),
                detail=result.detail,
            )
        else:
            await run(self.store.record_check_detail, stored.item_id, result.detail)
        return result, judged

    async def verify_due(
        self, session_id: str, audited: Audit, seen: dict[str, Fingerprint]
    ) -> tuple[int, list[str]]:
        """Run the checks of the open items whose inputs changed since they last ran here
        without passing (``recheck``); return how many ran and the items they closed."""
        watch = self._watches.setdefault(session_id, recheck.Watch())
        for item_id in watch.update(audited):  # no longer open: its last run is no standing
            self._verified.pop(item_id, None)
        if not watch.by_id:
            return 0, []
        cwds, paths, wanted = watch.reads()
        known = await self.store.run(self.store.evidence_known_among, wanted) if wanted else None
        looked = await asyncio.to_thread(
            recheck.look, cwds, paths, known or frozenset(), recheck.clock_ns(self.store.clock)
        )
        looked.workspaces = seen  # the passed checks' fingerprints, as the verifier takes them
        moved = {
            cwd: recheck.changed(watch.listings.get(cwd), now)
            for cwd, now in looked.listings.items()
        }
        watch.listings = looked.listings
        due = watch.due(moved)
        watch.pending.update(s.item_id for s in due)  # until looked at (a cancelled turn end)
        ran, verified = 0, []
        for stored in due:
            assert stored.check is not None
            last = self._verified.get(stored.item_id)
            now = recheck.inputs(stored.check, looked)
            if recheck.due(stored, last, now):
                ran += 1
                result, judged = await self.check(stored, seen)
                self._verified.pop(stored.item_id, None)
                if result.passed:
                    verified.append(stored.item_id)
                elif judged:  # a passed check's fingerprint is known once the verifier took it
                    now = now if now is not None else recheck.inputs(stored.check, looked)
                    self._verified[stored.item_id] = Verified(stored.check, result.detail, now)
            watch.looked(stored, self._verified.get(stored.item_id))
        return ran, verified

    async def revalidate(
        self, items: Sequence[StoredItem], seen: dict[str, Fingerprint] | None = None
    ) -> list[str]:
        """Reopen each item a passed check closed whose run no longer holds: the workspace it
        saw changed and the node's own run on the workspace as it is now does not pass."""
        reopened = []
        for stored in items:
            check = stored.check
            if not isinstance(check, PassedCheck) or not closed_by_check(stored):
                continue
            try:
                result = await self.verifier.check(check, seen)
            except Exception as exc:  # a run that cannot be made is not a pass
                result = CheckResult(passed=False, detail=f"the check failed to run ({exc})")
            if not result.passed:
                await self.store.run(
                    self.store.set_status, stored.item_id, ItemStatus.OPEN,
                    Actor("check", check.describe(), check_passed=False), detail=result.detail,
                )  # fmt: skip
                reopened.append(stored.item_id)
        return reopened
