"""A small OpenAI-compatible Chat Completions server for the tests and the benchmark: a real
process on loopback that replays JSON fixtures and keeps a request log.

Run as ``python -m tests.openai_server FIXTURE_DIR LOG_FILE``; it prints ``PORT <n>`` once it
listens. ``POST /v1/chat/completions`` answers from the fixture named by the request's
``model`` (``FIXTURE_DIR/<model>.json``)::

    {"replies": [REPLY, ...], "by_prompt": {"<first user message>": [REPLY, ...]}}

A conversation (the request's model and first user message) takes its replies in order, one
per request, the last one repeating forever. A ``REPLY`` is one of:

- ``{"text": "...", "usage": [input, output]}``: streamed in pieces, finish ``stop``
  (``"finish"`` overrides it);
- ``{"tool_calls": [{"name": ..., "arguments": "<JSON text, may be malformed>"}]}``;
- ``{"hold": "partial text"}``: that text, then the stream held open until the client closes
  the connection (logged as ``closed``);
- ``{"stall": "headers"}``: nothing at all (not even the status line) until the client closes
  the connection (logged as ``closed``), then nothing more;
- ``{"raw": ["data: {not json", ...]}``: each string sent as one SSE event as it is, after the
  headers of a stream (hostile output);
- ``{"raw_nested": N}``: one SSE event whose data is ``N`` arrays nested in one another;
- ``{"text_forever": "piece"}``: that piece streamed again and again until the client closes
  the connection (logged as ``closed``; at most ``HOLD_MAX`` s);
- ``{"status": 429, "message": "..."}``: an error answer with an OpenAI error body.

A tool call's ``arguments`` may be written as ``{"nested": N}`` (``N`` arrays nested in one
another) or ``{"command_bytes": N}`` (a ``shell`` command of ``N`` bytes), sent in pieces of
64 KiB; ``usage`` values are sent as they are written (a negative number, a string). A client
closing the connection while an answer is being written is logged as ``closed`` too.

``GET /mark?name=X`` appends a ``mark`` record (a test notes a moment in the server's own
order). Every request and every closed connection is one JSON line in ``LOG_FILE``:
``{"event": "request"|"closed"|"mark", "model", "prompt", "messages", "tools", "n", "at"}``.
``serve`` starts it from a test or a benchmark and reads that log back (``Served``).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}
_fixtures: dict[str, dict[str, Any]] = {}
_log_path = Path()
#: Longest a held stream stays open (seconds).
HOLD_MAX = 60.0


def log(record: dict[str, Any]) -> None:
    """Append one record to the request log."""
    with _lock, _log_path.open("a") as f:
        f.write(json.dumps({**record, "at": time.time()}) + "\n")


def _first_prompt(messages: list[dict[str, Any]]) -> str:
    return next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")


def _reply(model: str, prompt: str) -> tuple[dict[str, Any], int]:
    fixture = _fixtures.get(model) or {"replies": [{"status": 404, "message": f"no {model}"}]}
    replies = fixture.get("by_prompt", {}).get(prompt) or fixture["replies"]
    with _lock:
        n = _counts.get((model, prompt), 0)
        _counts[(model, prompt)] = n + 1
    return replies[min(n, len(replies) - 1)], n


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _arguments(written: str | dict[str, int]) -> tuple[str, int]:
    """A tool call's arguments as a fixture writes them, and the size of the pieces they are
    sent in."""
    if isinstance(written, str):
        return written, 16
    if "nested" in written:
        depth = written["nested"]
        return "[" * depth + "]" * depth, 65536
    return json.dumps({"command": "x" * written["command_bytes"]}), 65536


class Handler(BaseHTTPRequestHandler):
    """One request (HTTP/1.0: the connection closes after each answer)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlparse(self.path)
        if url.path == "/mark":
            log({"event": "mark", "name": parse_qs(url.query).get("name", [""])[0]})
        self._json(200, {"ok": True})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        model, messages = str(body.get("model")), body.get("messages", [])
        prompt = _first_prompt(messages)
        reply, n = _reply(model, prompt)
        tools = [t["function"]["name"] for t in body.get("tools", [])]
        record = {"model": model, "prompt": prompt, "messages": messages, "tools": tools, "n": n}
        log({"event": "request", **record})
        if "status" in reply:
            error = {"message": reply["message"], "type": "test_error", "code": reply["status"]}
            self._json(reply["status"], {"error": error})
            return
        if "stall" in reply:
            self._hold(model, prompt)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            self._stream(model, reply, n)
        except OSError:  # the client closed the connection while the answer was written
            log({"event": "closed", "model": model, "prompt": prompt})
            return
        if "hold" in reply:
            self._hold(model, prompt)

    def _stream(self, model: str, reply: dict[str, Any], n: int) -> None:
        if "hold" in reply:
            self._send(_chunk(model, {"role": "assistant", "content": reply["hold"]}))
            return
        if "raw_nested" in reply:
            depth = reply["raw_nested"]
            self.wfile.write(b"data: " + b"[" * depth + b"]" * depth + b"\n\n")
            self.wfile.flush()
            return
        if "raw" in reply:
            for event in reply["raw"]:
                self.wfile.write(f"{event}\n\n".encode())
            self.wfile.flush()
            return
        if "text_forever" in reply:
            deadline = time.monotonic() + HOLD_MAX
            while time.monotonic() < deadline:
                self._send(_chunk(model, {"content": reply["text_forever"]}))
            return
        for call_no, call in enumerate(reply.get("tool_calls", [])):
            head = {"id": f"call_{n}_{call_no}", "type": "function"}
            fn = {"name": call["name"], "arguments": ""}
            self._send(_chunk(model, {"tool_calls": [{"index": call_no, **head, "function": fn}]}))
            args, size = _arguments(call["arguments"])
            for i in range(0, len(args), size):
                piece = {"index": call_no, "function": {"arguments": args[i : i + size]}}
                self._send(_chunk(model, {"tool_calls": [piece]}))
        text = reply.get("text", "")
        for i in range(0, len(text), 8):
            self._send(_chunk(model, {"content": text[i : i + 8]}))
        finish = reply.get("finish") or ("tool_calls" if reply.get("tool_calls") else "stop")
        self._send(_chunk(model, {}, finish))
        used = reply.get("usage", [0, 0])
        usage = {"prompt_tokens": used[0], "completion_tokens": used[1]}
        if all(isinstance(u, int) for u in used):
            usage["total_tokens"] = used[0] + used[1]
        self._send({**_chunk(model, {}), "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _send(self, data: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _hold(self, model: str, prompt: str) -> None:
        """Keep the stream open until the client closes its end."""
        sock: socket.socket = self.connection
        deadline = time.monotonic() + HOLD_MAX
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.002)
            if readable:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        break
                except OSError:
                    break
        log({"event": "closed", "model": model, "prompt": prompt})

    def _json(self, status: int, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@dataclass(frozen=True)
class Served:
    """A running fixture server: its ``base_url`` (``.../v1``) and request ``log_path``."""

    base_url: str
    log_path: Path

    def records(self, event: str = "request", prompt: str | None = None) -> list[dict[str, Any]]:
        """The log's records of ``event`` (of the conversation started by ``prompt``), in
        the server's order."""
        if not self.log_path.exists():
            return []
        found = [json.loads(line) for line in self.log_path.read_text().splitlines()]
        return [
            r
            for r in found
            if r["event"] == event and (prompt is None or r.get("prompt") == prompt)
        ]

    def mark(self, name: str) -> None:
        """Append a ``mark`` record named ``name`` to the log."""
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/mark?name={name}", timeout=10) as answer:
            answer.read()

    def since_mark(self, name: str) -> list[dict[str, Any]]:
        """Every record after the ``mark`` named ``name``."""
        found = [json.loads(line) for line in self.log_path.read_text().splitlines()]
        at = next(i for i, r in enumerate(found) if r["event"] == "mark" and r["name"] == name)
        return found[at + 1 :]


@contextlib.contextmanager
def serve(fixtures: Path, log_path: Path) -> Iterator[Served]:
    """Run the server as a child process on loopback until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.openai_server", str(fixtures), str(log_path)],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        yield Served(f"http://127.0.0.1:{port}/v1", log_path)
    finally:
        proc.kill()
        proc.wait(10)


def main() -> None:
    """Serve until killed."""
    global _log_path
    fixtures, _log_path = Path(sys.argv[1]), Path(sys.argv[2])
    for path in fixtures.glob("*.json"):
        _fixtures[path.stem] = json.loads(path.read_text())
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
