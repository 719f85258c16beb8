"""Who produced an event: principals, one Ed25519 signature per stored message, and which
kinds each role may emit for which missions (docs/security.md).

A stored message (format 2, ``ledger.events``) is signed once, over its bytes as stored, and
verified once where it is read; its events carry no signatures of their own. Messages of
format 1 (each event signed itself, over ``canonical``) are still verified as they were.

Keys are NATS nkeys (user seeds ``SU...``, public keys ``U...``), so the key that signs a
principal's events is the key NATS authenticates it with. Pure: no key is generated or read
here (randomness and files live at the edge); every check raises a ``RuleViolation`` naming
``producer_identity`` or ``producer_permission``.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import nacl.exceptions
import nacl.signing
from pydantic import BaseModel, ConfigDict, Field

from ledger.errors import InvalidInput, Rule, RuleViolation
from ledger.events import (
    ID_PATTERN,
    OWNER_ROLE,
    Event,
    LedgerMessage,
    acts_for,
    message_head,
    read_message,
    seal,
)
from ledger.invariants import holds_role
from ledger.protocol import NODE_KIND_PREFIXES, check_message

_USER_SEED = (18 << 3, 20 << 3)  # nkeys: 'S' seed prefix, then 'U' user type
_PREFIX_USER = 20 << 3


class Role(StrEnum):
    """What a principal is; it decides which kinds it may produce."""

    NODE = "node"  # a node agent: observations of its own machine
    COORDINATOR = "coordinator"  # decision state: grants, reservations, receipts, risks
    HUMAN = "human"  # a person using the CLI: requests, never events of its own
    SERVICE = "service"  # an orchestrator: requests (the coordinator records its budget facts)
    VIEWER = "viewer"  # a read-only reader (`fleetledger web`): views, never a change


class Principal(BaseModel):
    """A named key holder. ``missions``: where it may act ("*": every mission)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=ID_PATTERN)
    role: Role
    public_key: str = Field(pattern=r"^U[A-Z2-7]{55}$")
    missions: frozenset[str] = frozenset({"*"})
    revoked: bool = False
    # when it was revoked (None: before revocations kept a time): what it signed earlier stays
    revoked_at: datetime | None = None
    # a node's agents (the holders of the grants it asks under): it speaks for these only
    agents: frozenset[str] = frozenset()

    def acts_in(self, mission_id: str) -> bool:
        return "*" in self.missions or mission_id in self.missions


def as_of(principals: Mapping[str, Principal], at: datetime) -> Mapping[str, Principal]:
    """The directory as it stood at ``at`` (a stored message's time): a key revoked later was
    still good then, so replay keeps what it signed before its revocation. A revocation
    without a time counts from always (nothing it signed is kept)."""
    later = [
        key for key, p in principals.items()
        if p.revoked and p.revoked_at is not None and p.revoked_at > at
    ]  # fmt: skip
    if not later:
        return principals
    return {**principals, **{k: principals[k].model_copy(update={"revoked": False}) for k in later}}


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _decode(text: str, what: str) -> bytes:
    """An nkey's raw bytes (prefix + key), its CRC checked."""
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{what} is not an nkey (base32)") from None
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if len(raw) < 3 or _crc16(body) != crc:
        raise InvalidInput(f"{what} is not an nkey (checksum)")
    return body


def _encode(body: bytes) -> str:
    return base64.b32encode(body + _crc16(body).to_bytes(2, "little")).decode().rstrip("=")


@functools.lru_cache(maxsize=64)
def _signing_key(seed: str) -> nacl.signing.SigningKey:
    """The key of a user seed; decoded once per seed (this process holds the seed anyway):
    signing is then one libsodium call, off the hot path's Python."""
    body = _decode(seed, "seed")
    if len(body) != 34 or (body[0] & 0xF8, ((body[0] & 0x07) << 5) | (body[1] >> 3)) != (
        _USER_SEED[0],
        _USER_SEED[1],
    ):
        raise InvalidInput("seed is not an nkey user seed (SU...)")
    return nacl.signing.SigningKey(body[2:])


def seed_from_bytes(raw: bytes) -> str:
    """The nkey user seed (``SU...``) for 32 random bytes the caller drew."""
    if len(raw) != 32:
        raise InvalidInput("an Ed25519 seed is 32 bytes")
    b1 = _USER_SEED[0] | (_USER_SEED[1] >> 5)
    b2 = (_USER_SEED[1] & 0x1F) << 3
    return _encode(bytes([b1, b2]) + raw)


@functools.lru_cache(maxsize=1024)
def _verify_key(signer: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key of a public nkey, decoded (checksum included) once per key."""
    return nacl.signing.VerifyKey(_decode(signer, "signer")[1:])


@functools.lru_cache(maxsize=64)
def _public_of(seed: str) -> str:
    return _encode(bytes([_PREFIX_USER]) + bytes(_signing_key(seed).verify_key))


def public_key(seed: str) -> str:
    """The public nkey (``U...``) of a user seed."""
    return _public_of(seed)


def seal_message(events: Sequence[Event], seed: str) -> bytes:
    """``events`` (one mission, in order) as one stored message signed by the holder of
    ``seed``: one signature over the message's bytes as stored (format 2)."""
    head = message_head(events, _public_of(seed))
    signature = _signing_key(seed).sign(head).signature
    return seal(head, base64.urlsafe_b64encode(signature).decode())


def sign_blob(data: bytes, seed: str) -> str:
    """The holder of ``seed``'s signature over ``data`` (url-safe base64), for what is stored
    outside the ledger stream (the coordinator's snapshots); ``verify_blob`` checks it."""
    return base64.urlsafe_b64encode(_signing_key(seed).sign(data).signature).decode()


def verify_blob(data: bytes, signer: str, signature: str) -> bool:
    """Does ``signature`` by the public nkey ``signer`` cover exactly ``data``?"""
    try:
        _verify_key(signer).verify(data, base64.urlsafe_b64decode(signature))
    except (InvalidInput, binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
        return False
    return True


def _message_name(message: LedgerMessage) -> str:
    """How a refusal names the message (built only for one: a UUID's text costs a microsecond)."""
    last = message.events[-1]
    if len(message.events) == 1:
        return f"event {last.event_id}"
    return f"the bundle of {len(message.events)} events ending with {last.event_id}"


def verify_message(message: LedgerMessage, principals: Mapping[str, Principal]) -> Principal:
    """The principal whose signature covers a format-2 message as stored (one verification for
    all its events); else ``RuleViolation`` (producer_identity) saying what is wrong: unsigned,
    an unknown or revoked key, or bytes (any event's included) that are not what it signed."""
    if message.signer is None or message.signature is None:
        raise RuleViolation(Rule.PRODUCER_IDENTITY, f"{_message_name(message)} is not signed")
    who = principals.get(message.signer)
    if who is None:
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY, f"{_message_name(message)} is signed by an unknown key"
        )
    if who.revoked:
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            f"{_message_name(message)} is signed by {who.name}, whose key is revoked",
        )
    try:
        if message.signed is None:
            raise ValueError("the signature does not close the message")
        _verify_key(message.signer).verify(
            message.signed, base64.urlsafe_b64decode(message.signature)
        )
    except (InvalidInput, binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            f"{_message_name(message)}: the signature of {who.name} does not match its content",
        ) from None
    return who


def check_origins(
    message: LedgerMessage, principals: Mapping[str, Principal] | None
) -> list[RuleViolation | None]:
    """The one check of who produced a stored message's events, at ingest and at replay
    alike: per event, the violation that keeps it out, or None. Signed by a known, unrevoked
    principal (format 2: the message, verified once; format 1: each event itself) that may
    emit it. No directory: an open fleet, nothing to check."""
    if principals is None:
        return [None] * len(message.events)
    out: list[RuleViolation | None] = []
    who: Principal | None = None
    if message.format != 1:
        try:
            who = verify_message(message, principals)
        except RuleViolation as exc:
            return [exc] * len(message.events)  # none of it is what a principal signed
    for event in message.events:
        try:
            check_producer(who if who is not None else verify(event, principals), event)
        except RuleViolation as exc:
            out.append(exc)
            continue
        out.append(None)
    return out


def admit(
    subject: str, data: bytes, principals: Mapping[str, Principal] | None
) -> tuple[tuple[Event, ...], list[RuleViolation | None]]:
    """The one check of a stored message before anything believes it (ingest, replay, a node
    following the stream): parsed once; its subject says what it carries (``check_message``);
    who produced each event, and may they (``check_origins``). Each event with the violation
    that keeps it out, or None; ``FleetError`` when the message is unreadable or its subject
    lies (none of it can be believed)."""
    message = read_message(data)
    check_message(subject, message.events)
    return message.events, check_origins(message, principals)


def receipt_signer(message: LedgerMessage, principals: Mapping[str, Principal]) -> Principal:
    """Who signed a stored decision's receipt (its message's last event): the message's signer
    (format 2), or the receipt's own (format 1); ``RuleViolation`` otherwise."""
    if message.format == 1:
        return verify(message.events[-1], principals)
    return verify_message(message, principals)


# --- format 1: every event signed itself (read only) -------------------------------------


def canonical(event: Event) -> bytes:
    """The bytes a format-1 signature covers: the event's JSON without its signature. Field
    order is the model's and sets are sorted (``ledger.authority.Names``), so an event and its
    copy parsed back from the stream give the same bytes in any process."""
    if event.signature is None:
        return event.to_json()
    return event.model_copy(update={"signature": None}).to_json()


def verify(event: Event, principals: Mapping[str, Principal]) -> Principal:
    """The principal that signed a format-1 ``event``, once its signature checks; else
    ``RuleViolation`` (producer_identity) saying what is wrong. ``principals`` is keyed by
    public key."""
    if event.signer is None or event.signature is None:
        raise RuleViolation(Rule.PRODUCER_IDENTITY, f"event {event.event_id} is not signed")
    who = principals.get(event.signer)
    if who is None:
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY, f"event {event.event_id} is signed by an unknown key"
        )
    if who.revoked:
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            f"event {event.event_id} is signed by {who.name}, whose key is revoked",
        )
    try:
        _verify_key(event.signer).verify(
            canonical(event), base64.urlsafe_b64decode(event.signature)
        )
    except (InvalidInput, binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            f"event {event.event_id}: the signature of {who.name} does not match its content",
        ) from None
    return who


# --- requests: who is asking (management, decisions) ---------------------------------------

SIGNER_HEADER = "Fleet-Signer"
SIGNED_AT_HEADER = "Fleet-Signed-At"
SIGNATURE_HEADER = "Fleet-Signature"
NONCE_HEADER = "Fleet-Nonce"
REQUEST_SKEW = timedelta(minutes=5)  # a signed request older (or newer) than this is refused
# the payload field of each management op that names the person acting (docs/security.md: it must be
# the authenticated principal, never a free string)
ACTING_AS: dict[str, str] = {
    "risk.treat": "by", "approve": "approver", "overrun.treat": "by", "grant.revoke": "by",
    "role.bind": "by", "role.unbind": "by", "evidence.register": "registered_by",
    "evidence.supersede": "actor",
}  # fmt: skip
# the ops in which a principal bound to ``acts-for:P`` may name P (binding roles is not one:
# a delegate never hands on what it was given)
DELEGABLE = frozenset({"risk.treat", "approve", "overrun.treat", "grant.revoke"})


def _request_bytes(subject: str, reply: str, signed_at: str, nonce: str, body: bytes) -> bytes:
    return f"{subject}\n{reply}\n{signed_at}\n{nonce}\n".encode() + body


def sign_request(
    seed: str, subject: str, body: bytes, at: datetime, *, nonce: str, reply: str = ""
) -> dict[str, str]:
    """The headers that prove who sent ``body`` on ``subject`` for an answer on ``reply``
    (signed: nobody can redirect it), when, and once (``nonce``: fresh per request, drawn by
    the caller)."""
    key = _signing_key(seed)
    signed_at = at.isoformat()
    sig = key.sign(_request_bytes(subject, reply, signed_at, nonce, body)).signature
    return {
        SIGNER_HEADER: _public_of(seed),
        SIGNED_AT_HEADER: signed_at,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: base64.urlsafe_b64encode(sig).decode(),
    }


class NonceWindow:
    """The nonces of signed requests seen within ``REQUEST_SKEW``: a request is accepted
    once. Memory is bounded by the window (older entries are evicted; a request older than
    the window is refused by its age anyway), and a request signed before ``floor`` (the
    process's start) is refused too, so a restart does not reopen the window."""

    def __init__(self, floor: datetime) -> None:
        self.floor = floor
        self._seen: dict[tuple[str, str], datetime] = {}  # (signer, nonce) -> signed at

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, signer: str, nonce: str, at: datetime, now: datetime) -> None:
        """Remember (signer, nonce) or raise ``RuleViolation`` (request_replay)."""
        check_fresh_nonce(self._seen, signer, nonce, at, floor=self.floor, now=now)
        horizon = now - REQUEST_SKEW
        if len(self._seen) > 64 and next(iter(self._seen.values())) < horizon:
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
        self._seen[(signer, nonce)] = at


def check_fresh_nonce(
    seen: Mapping[tuple[str, str], datetime],
    signer: str,
    nonce: str,
    at: datetime,
    *,
    floor: datetime,
    now: datetime,
) -> None:
    """A signed request counts once: its (signer, nonce) is not among those ``seen`` within
    the window, and it was signed no earlier than ``floor`` (before which nothing was seen)."""
    if not nonce:
        raise RuleViolation(Rule.REQUEST_REPLAY, "the request carries no nonce; refused")
    earlier = seen.get((signer, nonce))
    if earlier is not None and earlier >= now - REQUEST_SKEW:  # older: refused by its age
        raise RuleViolation(
            Rule.REQUEST_REPLAY,
            f"the request with nonce {nonce} was accepted already; a signed request counts once",
        )
    if at < floor - timedelta(seconds=1):
        raise RuleViolation(
            Rule.REQUEST_REPLAY,
            f"the request was signed at {at.isoformat()}, before this coordinator started "
            f"({floor.isoformat()}); send it again (a fresh signature)",
        )


def verify_request(
    headers: Mapping[str, str] | None,
    subject: str,
    body: bytes,
    principals: Mapping[str, Principal],
    now: datetime,
    *,
    reply: str | None = None,
    nonces: NonceWindow | None = None,
) -> Principal:
    """The principal that signed a request; ``RuleViolation`` (producer_identity) otherwise:
    unsigned, unknown or revoked key, a signature that does not match (its reply subject
    included), or a stale request; with ``nonces``, one seen already (request_replay)."""
    h = headers or {}
    signer, signed_at, signature = (h.get(k) for k in (SIGNER_HEADER, SIGNED_AT_HEADER,
                                                       SIGNATURE_HEADER))  # fmt: skip
    nonce = h.get(NONCE_HEADER, "")
    if not (signer and signed_at and signature):
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            "the request is not signed: connect as a principal (FLEET_PRINCIPAL, "
            "`fleetledger identity create`)",
        )
    who = principals.get(signer)
    if who is None or who.revoked:
        state = "revoked" if who is not None else "unknown"
        raise RuleViolation(Rule.PRODUCER_IDENTITY, f"the request is signed by a {state} key")
    try:
        at = datetime.fromisoformat(signed_at)
        _verify_key(signer).verify(
            _request_bytes(subject, reply or "", signed_at, nonce, body),
            base64.urlsafe_b64decode(signature),
        )
    except (InvalidInput, binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY, f"the request's signature of {who.name} does not match it"
        ) from None
    if at.tzinfo is None or abs(now - at) > REQUEST_SKEW:
        raise RuleViolation(
            Rule.PRODUCER_IDENTITY,
            f"the request of {who.name} was signed at {signed_at}, not within "
            f"{REQUEST_SKEW.total_seconds():.0f}s of now (replayed, or a wrong clock)",
        )
    if nonces is not None:
        nonces.admit(signer, nonce, at, now)
    return who


def check_acting_as(
    who: Principal,
    op: str,
    args: Mapping[str, Any],
    roles: Mapping[str, frozenset[str]] | None = None,
    *,
    mission_id: str,
) -> dict[str, Any]:
    """``args`` with the acting person set to ``who`` (when omitted); a request naming someone
    else is refused (producer_permission) unless ``who`` holds ``acts-for:<them>`` in the
    mission's ``roles`` (a delegation, itself a role event) and the op is ``DELEGABLE``.
    Nodes may only record effects; nobody acts in a mission outside its ``missions``."""
    if not who.acts_in(mission_id):
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION, f"{who.role} {who.name} may not act in mission {mission_id}"
        )
    _check_not_viewer(who, op)
    if who.role is Role.NODE and op != "effect.record":
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION, f"node {who.name} may record effects only, not {op}"
        )
    field = ACTING_AS.get(op)
    if field is None:
        return dict(args)
    named = args.get(field)
    if named is None or named == who.name:
        return {**args, field: who.name}
    if op in DELEGABLE and holds_role(roles or {}, who.name, acts_for(str(named))):
        return dict(args)
    raise RuleViolation(
        Rule.PRODUCER_PERMISSION,
        f"{who.name} may not act as {named!r} ({op} {field}): each person acts with their own "
        f"key (`fleetledger identity create NAME --role human`), or for another only through "
        f"a delegation {named} binds (`fleetledger role bind {who.name} --role "
        f"{acts_for(str(named))}`)",
    )


def _check_not_viewer(who: Principal, op: str) -> None:
    """A viewer reads views only: it neither changes a mission nor asks for a decision."""
    if who.role is Role.VIEWER:
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION, f"viewer {who.name} reads views only; it may not {op}"
        )


def check_requester(
    who: Principal,
    *,
    mission_id: str,
    node_id: str,
    holder: str | None,
    roles: Mapping[str, frozenset[str]],
) -> None:
    """May ``who`` ask for a decision on an action of the grant held by ``holder`` (None: no
    such grant)? A node speaks for the agents it runs (its requests name it as their node); a
    person or service for the grant it holds, for a holder that bound ``acts-for`` to it, or
    as a holder of the mission's owner role. Coordinators do not ask."""
    if not who.acts_in(mission_id):
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION, f"{who.role} {who.name} may not act in mission {mission_id}"
        )
    _check_not_viewer(who, "authorize")
    if who.role is Role.NODE:
        if node_id != who.name:
            raise RuleViolation(
                Rule.PRODUCER_PERMISSION,
                f"node {who.name} signed an authorize request that claims node {node_id}",
            )
        check_node_binding(who, holder)
        return
    if who.role is Role.COORDINATOR:
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION, f"coordinator {who.name} decides; it does not ask"
        )
    if holder is not None and (who.name == holder or holds_role(roles, who.name, acts_for(holder))):
        return
    if holds_role(roles, who.name, OWNER_ROLE):
        return
    raise RuleViolation(
        Rule.PRODUCER_PERMISSION,
        f"{who.name} may not ask for decisions on the grant of {holder or 'nobody'}: not its "
        f"holder, not bound to {acts_for(holder or '<holder>')!r} and not a mission owner",
    )


def check_node_binding(who: Principal, holder: str | None) -> None:
    """A node speaks only for the agents bound to it (its directory entry's ``agents``, set
    by `fleetledger up --agent NODE=AGENT`, `identity create --agents` and the chart)."""
    if holder is None or holder not in who.agents:
        raise RuleViolation(
            Rule.NODE_BINDING,
            f"node {who.name} runs no agent {holder or '(no grant)'}: a node asks and records "
            f"only for the agents bound to it (bound: {sorted(who.agents) or 'none'}; "
            f"`fleetledger identity create {who.name} --role node --agents {holder or 'AGENT'}`)",
        )


def check_effect_recorder(
    who: Principal,
    *,
    mission_id: str,
    holder: str | None,
    roles: Mapping[str, frozenset[str]],
    requested_by: str | None = None,
) -> None:
    """May ``who`` record the effect of an action of the grant held by ``holder``, asked for
    by ``requested_by``? A coordinator; a node only for an action decided through it (it
    asked) of an agent bound to it; otherwise whoever may ask for decisions on that grant
    (``check_requester``: its holder, a delegate of the holder, a mission owner)."""
    if who.role in (Role.COORDINATOR, Role.NODE):
        if not who.acts_in(mission_id):
            raise RuleViolation(
                Rule.PRODUCER_PERMISSION,
                f"{who.role} {who.name} may not act in mission {mission_id}",
            )
        if who.role is Role.NODE:
            if requested_by != who.name:
                raise RuleViolation(
                    Rule.NODE_BINDING,
                    f"node {who.name} may not record the effect of an action it did not ask "
                    f"for (asked by {requested_by or 'an unsigned request'})",
                )
            check_node_binding(who, holder)
        return
    check_requester(who, mission_id=mission_id, node_id="", holder=holder, roles=roles)


def check_producer(who: Principal, event: Event) -> None:
    """May ``who`` emit ``event``? Nodes: observations of their own node; coordinators:
    decision state; services: their branches' budget records; humans: nothing directly
    (they send requests)."""
    if not who.acts_in(event.mission_id):
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION,
            f"{who.role} {who.name} may not act in mission {event.mission_id}",
        )
    observation = event.kind.startswith(NODE_KIND_PREFIXES)
    if who.role is Role.NODE:
        if not observation:
            raise RuleViolation(
                Rule.PRODUCER_PERMISSION,
                f"node {who.name} may emit observations only, not {event.kind}",
            )
        if event.node_id != who.name:
            raise RuleViolation(
                Rule.PRODUCER_PERMISSION,
                f"node {who.name} signed an event that claims node {event.node_id}",
            )
    elif who.role is Role.COORDINATOR:
        if observation:
            raise RuleViolation(
                Rule.PRODUCER_PERMISSION,
                f"coordinator {who.name} may not emit the node observation {event.kind}",
            )
    else:  # an orchestrator's budget facts too: the coordinator records its branches' from
        # Redis (coordinator.branches), so no key but the one that talked to Redis writes them
        raise RuleViolation(
            Rule.PRODUCER_PERMISSION,
            f"{who.role} {who.name} sends requests; it may not append {event.kind} itself",
        )


__all__ = [
    "ACTING_AS",
    "DELEGABLE",
    "NonceWindow",
    "Principal",
    "Role",
    "admit",
    "as_of",
    "canonical",
    "check_acting_as",
    "check_effect_recorder",
    "check_fresh_nonce",
    "check_node_binding",
    "check_origins",
    "check_producer",
    "check_requester",
    "public_key",
    "receipt_signer",
    "seal_message",
    "seed_from_bytes",
    "sign_blob",
    "sign_request",
    "verify",
    "verify_blob",
    "verify_message",
    "verify_request",
]
