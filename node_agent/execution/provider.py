"""The provider a claims-cache miss asks: what it is sent, what it answers, how it fails.

A ``Provider`` completes a ``WorkingSet`` (bounded, whatever the history's length) into a
``Completion``; ``OpenAIChatProvider`` is one over an OpenAI-compatible chat endpoint (httpx).
The cache records on its receipt which of these it was:

    FleetError
    ├── MissingApiKey    no key configured: nothing was sent (inference_attempted=false)
    └── ProviderFailed   the provider was called and failed (inference_attempted=true)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import httpx

from ledger.errors import ErrorCode, FleetError


class MissingApiKey(FleetError):
    """No API key is configured: no request was made."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.INVALID_INPUT)


class ProviderFailed(FleetError):
    """The provider was called and the call failed (status, timeout, malformed answer)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.UNREACHABLE)


@dataclass(frozen=True)
class WorkingSet:
    """What a miss sends to the model: bounded, whatever the history's length."""

    system: str
    claims: tuple[str, ...]
    story: str | None
    messages: tuple[str, ...]
    task: str

    def prompt(self) -> list[dict[str, str]]:
        context = ["Related verified claims:\n- " + "\n- ".join(self.claims)] if self.claims else []
        if self.story:
            context.append(f"Story: {self.story}")
        system = "\n\n".join([self.system, *context])
        history = [{"role": "user", "content": m} for m in self.messages]
        return [
            {"role": "system", "content": system},
            *history,
            {"role": "user", "content": self.task},
        ]


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: int | None = None  # micros; None when the provider does not say


class Provider(Protocol):
    model: str

    async def complete(self, working_set: WorkingSet) -> Completion: ...


class OpenAIChatProvider:
    """An OpenAI-compatible ``/v1/chat/completions`` provider (no env proxies, no redirects)."""

    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 30.0, max_tokens: int = 512,
    ) -> None:  # fmt: skip
        self.base_url, self.model = base_url.rstrip("/"), model
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.api_key_env, self.timeout_s, self.max_tokens = api_key_env, timeout_s, max_tokens

    async def complete(self, working_set: WorkingSet) -> Completion:
        if not self.api_key:
            raise MissingApiKey(f"no API key: set {self.api_key_env}; no request was made")
        body = {
            "model": self.model,
            "messages": working_set.prompt(),
            "max_tokens": self.max_tokens,
        }
        try:
            async with httpx.AsyncClient(
                timeout=self.timeout_s, trust_env=False, follow_redirects=False
            ) as http:
                reply = await http.post(
                    f"{self.base_url}/v1/chat/completions", json=body,
                    headers={"Authorization": f"Bearer {self.api_key}"},
                )  # fmt: skip
        except httpx.HTTPError as exc:
            raise ProviderFailed(f"provider call failed: {type(exc).__name__}") from None
        if reply.status_code != 200:
            raise ProviderFailed(f"provider answered HTTP {reply.status_code}")
        try:
            data = reply.json()
            text = str(data["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise ProviderFailed("provider answer is not a chat completion") from None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return Completion(
            text, str(data.get("model") or self.model), _count(usage.get("prompt_tokens")),
            _count(usage.get("completion_tokens")), None,
        )  # fmt: skip


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
