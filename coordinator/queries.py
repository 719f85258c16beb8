"""Queries: view requests over NATS answered with a projection of the applied state, once
it includes everything the stream held when the request came (a linearizable read). Clients
ask a mission's partition subject, where its owner answers from memory; a coordinator asked
of another's mission (on the plain subject) reads that mission's messages from the stream."""

from __future__ import annotations

import json

from pydantic import ValidationError

from coordinator.journal import Journal
from coordinator.views import project
from fleetbus.bus import Request
from fleetbus.http import first_error
from ledger.errors import ErrorCode, FleetError, InvalidInput
from ledger.protocol import ErrorBody, ViewRequest


class Queries:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.read_from_stream = 0  # views of another's mission (its messages read, not kept)

    async def on_request(self, msg: Request) -> None:
        try:
            req = ViewRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            await msg.respond(_error(InvalidInput(first_error(exc))))
            return
        try:  # read what was stored before the request, not just what is folded (a requester
            # holding a receipt republished by the stream must see it in the view)
            journal = self.journal
            await journal.wait_applied(await journal.bus.last_seq())
            if journal.folds(req.mission_id) or journal.refold is None:
                await journal.warm(req.mission_id)  # a cold mission is loaded back
                state = journal.states.get(req.mission_id)
            else:  # another's (its owner folds it): its messages read, kept nowhere
                self.read_from_stream += 1
                state = (await journal.refold(req.mission_id, journal.applied_seq))[0]
        except FleetError as exc:
            await msg.respond(_error(exc))
            return
        if state is None or state.mission is None:
            err = InvalidInput(f"mission {req.mission_id} does not exist", code=ErrorCode.NOT_FOUND)
            await msg.respond(_error(err))
            return
        view = project(state, req.role, applied_seq=self.journal.applied_seq)
        await msg.respond(view.model_dump_json(exclude_unset=True).encode())


def _error(exc: FleetError) -> bytes:
    return json.dumps({"error": ErrorBody.of(exc).model_dump()}).encode()


__all__ = ["Queries"]
