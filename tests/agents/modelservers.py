"""Model servers on loopback for the real agents: one HTTP server speaking the three APIs the
agents call, deterministic, with a request log the tests read.

``serve()`` starts a ``ThreadingHTTPServer`` on a free port of 127.0.0.1 in a thread and yields
a ``ModelServer`` (``base_url``, ``requests``); leaving the context stops it. Routes:

- OpenAI Responses, for Codex: ``POST {base}/responses`` (any prefix), streamed as SSE events
  ``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
  ``response.output_item.done``, ``response.completed`` (with ``usage``).
  ``GET {base}/models`` answers an empty list.
- Anthropic Messages, for Claude Code: ``POST /v1/messages`` (SSE ``message_start``,
  ``content_block_start/delta/stop``, ``message_delta``, ``message_stop``; a plain JSON
  message when ``stream`` is false) and ``POST /v1/messages/count_tokens``.
- Gemini, for Gemini CLI: ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``,
  ``:generateContent`` and ``:countTokens``.

Any other path is logged and answered 404 with a JSON body, so an unexpected side call shows in
the log rather than hanging the agent.

Behaviour, driven by the last user prompt the agent forwards (the last user text that is not
context the agent injected itself, such as ``<system-reminder>`` or ``<environment_context>``):

- the request's conversation ends with a tool result: the answer is ``done: <first line of
  the command's output>``;
- the prompt contains ``run: <command>`` (to the end of that line) and the request offers the
  agent's shell tool: the answer is one call of that tool running ``<command>``;
  ``ask: <command>`` is the same call, asking to run outside the sandbox where the tool can
  (Codex's ``sandbox_permissions: "require_escalated"``, which makes Codex ask the client's
  permission; Claude Code and Gemini CLI ask by themselves before a command that writes);
- otherwise: ``echo: <prompt>`` as plain text (side calls such as Claude Code's title
  generation with a small model offer no shell tool and get this too).

Every answer carries usage (input, output and cached input tokens, derived from the sizes of
the request and the answer), because a model gateway meters them.

Shell tools the agents offer, read from their first requests (more in docs/agents-notes.md):

- Codex (codex-acp 0.16.0; Responses ``tools`` of ``type: function``): ``exec_command`` with
  arguments ``{"cmd": text, "login"?: bool (default true: a login shell), "workdir"?,
  "tty"?, "yield_time_ms"?, "max_output_tokens"?, "shell"?, "sandbox_permissions"?:
  "use_default" | "require_escalated", "justification"?, "prefix_rule"?}``. The other tools:
  ``write_stdin``, ``update_plan``, ``get_goal``, ``create_goal``, ``update_goal``,
  ``request_user_input``, ``apply_patch``, ``view_image``, ``tool_search``, ``web_search``.
  The result is a ``function_call_output`` input item whose ``output`` is text: ``Chunk ID:
  ...\nWall time: ...\nProcess exited with code 0\nOriginal token count: ...\nOutput:\nhi``.
  (``shell_command`` and ``shell``, older Codex function tools, are answered too if
  offered.)
- Claude Code (claude-code-acp 0.16.2; Messages ``tools`` with ``input_schema``): ``Bash``
  with input ``{"command": text, "timeout"?: ms, "description"?: text, ...}``, among
  ``Task``, ``TaskOutput``, ``Glob``, ``Grep``, ``ExitPlanMode``, ``Read``, ``Edit``,
  ``Write``, ``NotebookEdit``, ``WebFetch``, ``TodoWrite``, ``WebSearch``, ``TaskStop``,
  ``Skill``, ``EnterPlanMode``. The result is a ``tool_result`` block (its ``content`` the
  output alone) in the next user message.
- Gemini CLI (0.61.0; ``tools[].functionDeclarations`` with ``parametersJsonSchema``):
  ``run_shell_command`` with args ``{"command": text, "description"?, "dir_path"?,
  "is_background"?}`` in a ``functionCall`` part, among ``list_directory``, ``read_file``,
  ``grep_search``, ``glob``, ``replace``, ``write_file``, ``web_fetch`` and more. The result
  is a ``functionResponse`` part whose ``response.output`` is ``<untrusted_context>\nOutput:
  hi\nProcess Group PGID: ...\n</untrusted_context>``. Before each prompt it asks a small
  model (``gemini-3.5-flash-lite:generateContent``) to route the request, with
  ``generationConfig.responseMimeType: application/json`` and a ``responseJsonSchema``; the
  server answers such a request with the smallest object the schema accepts (anything else
  makes Gemini CLI retry, then hang).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

#: Shell tool names by API family, in order of preference; the first one offered is called.
SHELL_TOOLS = {
    "responses": ("exec_command", "shell_command", "shell"),
    "messages": ("Bash",),
    "gemini": ("run_shell_command",),
}
_RUN = re.compile(r"\b(run|ask):\s*(.+)")
#: Prefixes of user text an agent injects around the person's prompt.
_INJECTED = ("<", "# AGENTS.md", "Caveat:")


@dataclass
class Reply:
    """What the model answers: plain ``text``, or one call of ``tool`` running ``command``
    (``ask``: with the tool's own request to run it outside the sandbox, if it has one)."""

    text: str = ""
    tool: str | None = None
    command: str = ""
    ask: bool = False


@dataclass
class Logged:
    """One request as received: ``api`` (``responses``/``messages``/``count_tokens``/``gemini``/
    ``other``), ``path``, ``body`` (decoded JSON or ``None``), ``prompt`` (the prompt the reply was
    driven by), ``reply`` (what was answered), ``at`` (``time.time()``)."""

    api: str
    path: str
    body: Any
    prompt: str = ""
    reply: Reply | None = None
    at: float = field(default_factory=time.time)

    def tool_names(self) -> list[str]:
        """The names of the tools the request offered (any of the three shapes)."""
        tools = (self.body or {}).get("tools") or [] if isinstance(self.body, dict) else []
        names: list[str] = []
        for tool in tools:
            for decl in tool.get("functionDeclarations") or [tool]:
                name = decl.get("name") or (decl.get("function") or {}).get("name")
                names.append(str(name or decl.get("type")))
        return names


class ModelServer:
    """A running server: ``base_url`` (``http://127.0.0.1:<port>``) and ``requests`` (every
    ``Logged`` request in arrival order; read it from any thread)."""

    def __init__(self, httpd: ThreadingHTTPServer) -> None:
        self.httpd = httpd
        self.base_url = f"http://127.0.0.1:{httpd.server_address[1]}"
        self.requests: list[Logged] = []
        self.lock = threading.Lock()

    def log(self, entry: Logged) -> None:
        with self.lock:
            self.requests.append(entry)

    def of(self, api: str) -> list[Logged]:
        """The logged requests of one ``api``, in order."""
        with self.lock:
            return [r for r in self.requests if r.api == api]


# --------------------------------------------------------------------------- reading requests


def _text_of(content: Any) -> list[str]:
    """The text pieces of one message's content in any of the three shapes."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for part in content or []:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and part.get("type") in (None, "text", "input_text"):
            out.append(text)
    return out


def _person_prompt(texts: list[str]) -> str:
    """The last text a person wrote, skipping what the agent injected around it."""
    kept = [t.strip() for t in texts if t.strip() and not t.strip().startswith(_INJECTED)]
    return kept[-1] if kept else (texts[-1].strip() if texts else "")


def first_output_line(output: str) -> str:
    """The first line of a command's output inside an agent's tool result text.

    Codex writes ``...\\nOutput:\\n<out>``, Gemini ``Output: <out>\\n...``, Claude the output
    alone; a JSON text with an ``output`` key is read through."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        decoded = json.loads(output)
        if isinstance(decoded, dict) and "output" in decoded:
            output = str(decoded["output"])
    match = re.search(r"^Output:[ \t]*(.*)$", output, re.MULTILINE)
    if match:
        rest = output[match.end(1) :] if not match.group(1).strip() else match.group(1)
        output = rest
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def _decide(prompt: str, tool_result: str | None, offered: list[str], api: str) -> Reply:
    if tool_result is not None:
        return Reply(text=f"done: {first_output_line(tool_result)}")
    match = _RUN.search(prompt)
    tool = next((t for t in SHELL_TOOLS[api] if t in offered), None)
    if match and tool:
        return Reply(tool=tool, command=match.group(2).strip(), ask=match.group(1) == "ask")
    return Reply(text=f"echo: {prompt}")


def _responses_turn(body: dict[str, Any]) -> tuple[str, str | None]:
    """(prompt, tool result or None) of an OpenAI Responses request."""
    items = body.get("input") or []
    if isinstance(items, str):
        return items, None
    last = items[-1] if items else {}
    result = None
    if last.get("type") in ("function_call_output", "custom_tool_call_output"):
        out = last.get("output")
        result = out if isinstance(out, str) else json.dumps(out)
    texts: list[str] = []
    for item in items:
        if item.get("role") == "user":
            texts.extend(_text_of(item.get("content")))
    return _person_prompt(texts), result


def _messages_turn(body: dict[str, Any]) -> tuple[str, str | None]:
    """(prompt, tool result or None) of an Anthropic Messages request."""
    messages = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    if not messages:
        return "", None
    content = messages[-1].get("content")
    if isinstance(content, list):
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            inner = results[-1].get("content")
            text = inner if isinstance(inner, str) else "\n".join(_text_of(inner))
            return "", text
    texts = [t for m in messages for t in _text_of(m.get("content"))]
    return _person_prompt(texts), None


def _gemini_turn(body: dict[str, Any]) -> tuple[str, str | None]:
    """(prompt, tool result or None) of a Gemini generateContent request."""
    contents = [c for c in body.get("contents") or [] if c.get("role", "user") == "user"]
    if not contents:
        return "", None
    parts = contents[-1].get("parts") or []
    responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
    if responses:
        response = responses[-1].get("response") or {}
        out = response.get("output", response)
        return "", out if isinstance(out, str) else json.dumps(out)
    texts = [p["text"] for c in contents for p in c.get("parts") or [] if "text" in p]
    return _person_prompt(texts), None


def _from_schema(schema: dict[str, Any]) -> Any:
    """The smallest value a JSON schema (Gemini's upper-case types or JSON Schema's) accepts."""
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _from_schema(props[k]) for k in schema.get("required") or props}
    if "enum" in schema:
        return schema["enum"][0]
    simple = {"string": "lab", "integer": 1, "number": 1, "boolean": False, "array": []}
    return simple.get(kind)


def _json_reply(body: dict[str, Any]) -> Reply | None:
    """A JSON answer when the request asks for one (Gemini CLI's routing and checks)."""
    config = body.get("generationConfig") or {}
    if config.get("responseMimeType") != "application/json":
        return None
    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
    return Reply(text=json.dumps(_from_schema(schema)))


def _usage(body_size: int, reply: Reply) -> tuple[int, int, int]:
    """(input, output, cached input) tokens: a quarter of the bytes, half of input cached."""
    inp = max(1, body_size // 4)
    out = max(1, len(reply.text or reply.command) // 4 + (8 if reply.tool else 1))
    return inp, out, inp // 2


def _arguments(reply: Reply) -> dict[str, Any]:
    """A shell tool's arguments in the shape that tool declares."""
    tool, command = reply.tool, reply.command
    if tool == "shell":
        return {"command": ["bash", "-lc", command]}
    if tool == "exec_command":
        # Not a login shell: a profile's own output would come before the command's.
        args: dict[str, Any] = {"cmd": command, "login": False}
        if reply.ask:
            args |= {"sandbox_permissions": "require_escalated", "justification": "Lab asks"}
        return args
    if tool == "Bash":
        return {"command": command, "description": "Run the requested command"}
    return {"command": command}


# --------------------------------------------------------------------------- writing answers


def _responses_events(
    reply: Reply, usage: tuple[int, int, int], model: str
) -> list[dict[str, Any]]:
    """The Responses SSE events of one answer, in order (each has its ``type``)."""
    rid, iid = f"resp_{uuid.uuid4().hex[:12]}", f"item_{uuid.uuid4().hex[:12]}"
    inp, out, cached = usage
    base = {"id": rid, "object": "response", "model": model, "status": "in_progress", "output": []}
    if reply.tool:
        item: dict[str, Any] = {
            "type": "function_call",
            "id": iid,
            "call_id": f"call_{uuid.uuid4().hex[:12]}",
            "name": reply.tool,
            "arguments": json.dumps(_arguments(reply)),
            "status": "completed",
        }
        middle: list[dict[str, Any]] = []
    else:
        item = {
            "type": "message",
            "id": iid,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
        }
        middle = [
            {
                "type": "response.output_text.delta",
                "item_id": iid,
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
            for piece in _pieces(reply.text)
        ]
    started = {**item, "status": "in_progress"}
    if not reply.tool:
        started["content"] = []
    usage_body = {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }
    return [
        {"type": "response.created", "response": base},
        {"type": "response.output_item.added", "output_index": 0, "item": started},
        *middle,
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {
            "type": "response.completed",
            "response": {**base, "status": "completed", "output": [item], "usage": usage_body},
        },
    ]


def _messages_answer(reply: Reply, usage: tuple[int, int, int], model: str) -> dict[str, Any]:
    """An Anthropic message (the non-streamed shape; the stream is built from it)."""
    inp, out, cached = usage
    if reply.tool:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": f"toolu_{uuid.uuid4().hex[:20]}",
            "name": reply.tool,
            "input": _arguments(reply),
        }
    else:
        block = {"type": "text", "text": reply.text}
    return {
        "id": f"msg_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": "tool_use" if reply.tool else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": inp - cached,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": out,
        },
    }


def _messages_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Anthropic SSE events of one message: (event name, data)."""
    block = message["content"][0]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**message["usage"], "output_tokens": 1},
    }
    if block["type"] == "tool_use":
        opened = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
    else:
        opened = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": opened},
        ),
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
        for d in deltas
    ]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def _gemini_answer(reply: Reply, usage: tuple[int, int, int], model: str) -> dict[str, Any]:
    """One ``GenerateContentResponse`` holding the whole answer."""
    inp, out, cached = usage
    if reply.tool:
        part: dict[str, Any] = {"functionCall": {"name": reply.tool, "args": _arguments(reply)}}
    else:
        part = {"text": reply.text}
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": inp,
            "candidatesTokenCount": out,
            "cachedContentTokenCount": cached,
            "totalTokenCount": inp + out,
        },
        "modelVersion": model,
        "responseId": uuid.uuid4().hex[:16],
    }


def _pieces(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# --------------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_ref: ModelServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = urlparse(self.path).path
        self.server_ref.log(Logged(api="other", path=self.path, body=None))
        if path.endswith("/models"):
            self._json(200, {"object": "list", "data": [], "models": []})
        else:
            self._json(404, {"error": {"message": f"no route GET {path}"}})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        path = urlparse(self.path).path
        if path.endswith("/responses") and isinstance(body, dict):
            self._responses(body, len(raw))
        elif path.endswith("/messages/count_tokens"):
            self.server_ref.log(Logged(api="count_tokens", path=self.path, body=body))
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
        elif path.endswith("/v1/messages") and isinstance(body, dict):
            self._messages(body, len(raw))
        elif "/models/" in path and ":" in path and isinstance(body, dict):
            self._gemini(path, body, len(raw))
        else:
            self.server_ref.log(Logged(api="other", path=self.path, body=body))
            self._json(404, {"error": {"message": f"no route POST {path}"}})

    def _responses(self, body: dict[str, Any], size: int) -> None:
        entry = Logged(api="responses", path=self.path, body=body)
        prompt, result = _responses_turn(body)
        reply = _decide(prompt, result, entry.tool_names(), "responses")
        entry.prompt, entry.reply = prompt, reply
        self.server_ref.log(entry)
        events = _responses_events(reply, _usage(size, reply), str(body.get("model")))
        self._sse([(e["type"], e) for e in events])

    def _messages(self, body: dict[str, Any], size: int) -> None:
        entry = Logged(api="messages", path=self.path, body=body)
        prompt, result = _messages_turn(body)
        reply = _decide(prompt, result, entry.tool_names(), "messages")
        entry.prompt, entry.reply = prompt, reply
        self.server_ref.log(entry)
        message = _messages_answer(reply, _usage(size, reply), str(body.get("model")))
        if body.get("stream"):
            self._sse(_messages_events(message))
        else:
            self._json(200, message)

    def _gemini(self, path: str, body: dict[str, Any], size: int) -> None:
        model, _, method = path.rsplit("/", 1)[-1].partition(":")
        if method == "countTokens":
            self.server_ref.log(Logged(api="count_tokens", path=self.path, body=body))
            self._json(200, {"totalTokens": max(1, size // 4)})
            return
        entry = Logged(api="gemini", path=self.path, body=body)
        prompt, result = _gemini_turn(body)
        reply = _json_reply(body) or _decide(prompt, result, entry.tool_names(), "gemini")
        entry.prompt, entry.reply = prompt, reply
        self.server_ref.log(entry)
        answer = _gemini_answer(reply, _usage(size, reply), model)
        if method == "streamGenerateContent":
            self._sse([("", answer)])
        else:
            self._json(200, answer)

    def _sse(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def _json(self, status: int, data: dict[str, Any]) -> None:
        encoded = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)


@contextlib.contextmanager
def serve() -> Iterator[ModelServer]:
    """Start the server on a free loopback port; stop it (and its threads) on leaving.

    Yields a ``ModelServer``; raises ``OSError`` if no port can be bound."""
    handler: Any = type("Handler", (_Handler,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    server = ModelServer(httpd)
    handler.server_ref = server
    thread = threading.Thread(target=httpd.serve_forever, name="modelserver", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


if __name__ == "__main__":
    # A stand-in model server for trying the agents by hand: prints its URL, serves until
    # Ctrl-C. Point Codex at <url>/v1, Claude Code and Gemini CLI at <url>.
    import time as _time

    with serve() as running:
        print(f"model server on {running.base_url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                _time.sleep(3600)
