"""The provider a claims-cache miss asks: an OpenAI-compatible chat completion over httpx.

It raises what the cache records on its receipt: ``MissingApiKey`` when no key is configured
(nothing was sent), ``ProviderFailed`` when the call was made and failed.
"""

from __future__ import annotations

import os

import httpx

from node_agent.claims import Completion, MissingApiKey, ProviderFailed, WorkingSet


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
