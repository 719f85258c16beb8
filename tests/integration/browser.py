"""Headless Chromium driven over the Chrome DevTools protocol (a websocket per browser).

Debian's ``chromium`` (``make test`` installs it as root with apt-get). One page per
``Browser``: ``goto``, ``evaluate`` (a JavaScript expression's JSON value), ``key`` (a real key
press), ``screenshot``. The browser runs in its own process group with a fresh profile and is
ended by its pid.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import websockets

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-port=0",
)  # fmt: skip


def chromium() -> str:
    """The browser binary, or a failure saying how to install it (never a skip)."""
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if path is None:
        pytest.fail(
            f"headless Chromium is needed at {CHROMIUM} for the web page test: "
            "`apt-get install -y chromium` (`make test` installs it when run as root)"
        )
    return path


class Browser:
    def __init__(
        self, proc: subprocess.Popen[bytes], ws: Any, session: str, drain: threading.Thread
    ) -> None:
        self.proc, self.ws, self.session, self.drain = proc, ws, session, drain
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def launch(cls, profile: Path, width: int = 1280, height: int = 900) -> Browser:
        proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            url = await asyncio.wait_for(asyncio.to_thread(_devtools_url, proc), 30)
            # the rest of its stderr is drained (a full pipe would stall the browser), then closed
            drain = threading.Thread(target=_drain, args=(proc,), daemon=True)
            drain.start()
            ws = await websockets.connect(url, max_size=64 << 20)
            browser = cls(proc, ws, "", drain)
            target = await browser.send("Target.createTarget", url="about:blank")
            attached = await browser.send(
                "Target.attachToTarget", targetId=target["targetId"], flatten=True
            )
            browser.session = attached["sessionId"]
            await browser.send("Page.enable")
            await browser.send("Runtime.enable")
            await browser.send(
                "Emulation.setDeviceMetricsOverride",
                width=width, height=height, deviceScaleFactor=1, mobile=False,
            )  # fmt: skip
            return browser
        except BaseException:
            _end(proc)
            if proc.stderr is not None and not proc.stderr.closed:
                proc.stderr.close()
            raise

    async def _read(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            waiter = self._waiting.pop(msg.get("id", -1), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(msg)
            elif "method" in msg:
                await self._events.put(msg)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        msg: dict[str, Any] = {"id": n, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[n] = waiter
        await self.ws.send(json.dumps(msg))
        reply = await asyncio.wait_for(waiter, 30)
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return dict(reply.get("result") or {})

    async def goto(self, url: str) -> None:
        while not self._events.empty():
            self._events.get_nowait()
        await self.send("Page.navigate", url=url)
        async with asyncio.timeout(30):
            while (await self._events.get()).get("method") != "Page.loadEventFired":
                pass

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def key(self, key: str, code: str, vk: int, modifiers: int = 0) -> None:
        """Press and release one key, as a person's keyboard does."""
        for kind in ("rawKeyDown", "keyUp"):
            await self.send(
                "Input.dispatchKeyEvent", type=kind, key=key, code=code, modifiers=modifiers,
                windowsVirtualKeyCode=vk, nativeVirtualKeyCode=vk,
            )  # fmt: skip

    async def screenshot(self, path: Path) -> Path:
        """The whole page (beyond the viewport) as a PNG."""
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    async def close(self) -> None:
        self._reader.cancel()
        await self.ws.close()
        _end(self.proc)
        self.drain.join(10)


def _devtools_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stderr is not None
    said = []
    for line in iter(proc.stderr.readline, b""):
        text = line.decode(errors="replace")
        said.append(text)
        found = re.search(r"DevTools listening on (ws://\S+)", text)
        if found:
            return found.group(1)
    raise AssertionError("chromium exited before its DevTools endpoint: " + "".join(said[-20:]))


def _drain(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stderr is not None
    with proc.stderr:
        proc.stderr.read()


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
