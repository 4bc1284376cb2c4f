"""The ACP agent over stdio (``fleet acp``), driven as an editor would: one JSON-RPC message per
line on the subprocess's stdin/stdout. The rules come from ``shared/acp.md`` (seeds 000 and 001);
each MUST/SHOULD of session/list, archive, unarchive and set_title has a test named after it.

``RpcPeer`` (a JSON-RPC client over any line/frame transport) is shared with the WebSocket tests.
Every peer checks at teardown that the agent never answered -32603 and never wrote a line that is
not JSON: a client mistake is never an internal error, and stdout carries protocol only.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from api.acp import LIST_PAGE
from orchestrator.archiving import archive as archive_ops
from orchestrator.session import sessions as session_ops
from orchestrator.session import titles
from orchestrator.turn import turns
from tests.helpers import STARTUP_TIMEOUT, RecordingDispatcher, fail_if_a_worker_died, wait_for
from tests.workers.support import model_requests

#: The capabilities acp.md requires (values are objects; loadSession is the one boolean).
SESSION_CAPABILITIES = ("list", "delete", "close", "resume", "archive", "title", "setTitle")
TIMEOUT = 20.0
PROMPT_TIMEOUT = 45.0

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
NOT_FOUND = -32002
#: The handshake every ACP connection starts with (requests before it are refused -32600).
INITIALIZE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": 1, "clientCapabilities": {}},
}


class RpcError(AssertionError):
    """An error response where a result was expected."""


class RpcPeer:
    """A JSON-RPC 2.0 client over a transport that carries one message per line or frame.

    ``write`` sends one message's text; the transport's reader calls ``feed`` with each text it
    receives and ``eof`` when it ends. Every message received is kept in ``messages`` in
    arrival order, so tests can check what came before what.
    """

    def __init__(self, write: Callable[[str], None], name: str) -> None:
        self._write = write
        self.name = name
        self.messages: list[dict[str, Any]] = []
        self.garbage: list[str] = []
        self.ended = False
        self._cond = threading.Condition()
        self._ids = itertools.count(1)

    # -- transport side ------------------------------------------------------------------
    def feed(self, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            msg = None
        with self._cond:
            if isinstance(msg, dict):
                self.messages.append(msg)
            else:
                self.garbage.append(text)
            self._cond.notify_all()

    def eof(self) -> None:
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    # -- client side ---------------------------------------------------------------------
    def send_raw(self, text: str) -> None:
        self._write(text)

    def send(self, message: dict[str, Any]) -> None:
        self._write(json.dumps(message))

    def request_async(self, method: str, params: Any = None) -> int:
        """Send a request; return its id (wait for the answer with ``response``)."""
        rid = next(self._ids)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return rid

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def mark(self) -> int:
        """The index the next message received will have (for ``wait(since=...)``)."""
        with self._cond:
            return len(self.messages)

    def wait(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = TIMEOUT,
        what: str = "",
        since: int = 0,
    ) -> tuple[int, dict[str, Any]]:
        """The first message (index, message) from index ``since`` on matching ``predicate``,
        waiting for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = since
            while True:
                for i in range(seen, len(self.messages)):
                    if predicate(self.messages[i]):
                        return i, self.messages[i]
                seen = len(self.messages)
                fail_if_a_worker_died(what or "a message")
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    raise AssertionError(
                        f"{self.name}: no message {what or 'matching'} within {timeout}s "
                        f"(ended={self.ended}); last messages: {self.messages[-5:]}"
                    )
                self._cond.wait(min(left, 0.5))

    def response(self, rid: Any, timeout: float = TIMEOUT) -> tuple[int, dict[str, Any]]:
        """(index, message) of the response to request ``rid``."""
        return self.wait(
            lambda m: "method" not in m and m.get("id") == rid and ("result" in m or "error" in m),
            timeout,
            f"answering id {rid!r}",
        )

    def request(self, method: str, params: Any = None, timeout: float = TIMEOUT) -> dict[str, Any]:
        return self.response(self.request_async(method, params), timeout)[1]

    def call(self, method: str, params: Any = None, timeout: float = TIMEOUT) -> Any:
        """The result of a request; fails on an error response."""
        msg = self.request(method, params, timeout)
        if "error" in msg:
            raise RpcError(f"{method} {params!r} answered {msg['error']!r}")
        assert set(msg) == {"jsonrpc", "id", "result"}, msg
        return msg["result"]

    def error(
        self, method: str, params: Any, code: int, timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        """The error of a request, asserted to carry ``code`` and a message a person can read."""
        msg = self.request(method, params, timeout)
        assert "error" in msg and "result" not in msg, f"{method} {params!r} answered {msg!r}"
        err: dict[str, Any] = msg["error"]
        assert err["code"] == code, f"{method} {params!r}: expected {code}, got {err!r}"
        assert isinstance(err["message"], str) and err["message"].strip(), err
        return err

    def updates(self, session_id: str, kind: str | None = None) -> list[tuple[int, dict[str, Any]]]:
        """(index, update) of every session/update received for ``session_id``."""
        with self._cond:
            return [
                (i, m["params"]["update"])
                for i, m in enumerate(self.messages)
                if m.get("method") == "session/update"
                and m["params"]["sessionId"] == session_id
                and (kind is None or m["params"]["update"].get("sessionUpdate") == kind)
            ]

    def wait_update(
        self, session_id: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = TIMEOUT
    ) -> tuple[int, dict[str, Any]]:
        i, msg = self.wait(
            lambda m: (
                m.get("method") == "session/update"
                and m["params"]["sessionId"] == session_id
                and predicate(m["params"]["update"])
            ),
            timeout,
            f"session/update of {session_id}",
        )
        return i, msg["params"]["update"]

    def check_clean(self) -> None:
        """No internal error was ever answered and nothing but JSON-RPC was received."""
        with self._cond:
            internal = [m for m in self.messages if (m.get("error") or {}).get("code") == -32603]
            assert not internal, f"{self.name}: -32603 answered: {internal}"
            assert not self.garbage, f"{self.name}: non-JSON output: {self.garbage[:3]}"
            for m in self.messages:
                assert m.get("jsonrpc") == "2.0", m


class StdioAgent(RpcPeer):
    """A ``fleet acp`` subprocess (same Redis and key prefix as the tests: conftest's env)."""

    def __init__(self, name: str) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "acp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=dict(os.environ),
        )
        assert self.proc.stdin is not None
        stdin = self.proc.stdin
        lock = threading.Lock()

        def write(text: str) -> None:
            assert "\n" not in text, "one message per line"
            with lock:
                stdin.write(text.encode("utf-8", "surrogatepass") + b"\n")
                stdin.flush()

        super().__init__(write, name)
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.feed(line.decode("utf-8", "replace").rstrip("\n"))
        self.eof()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)
        self._stderr.close()


@contextlib.contextmanager
def stdio_agent(name: str) -> Iterator[StdioAgent]:
    agent = StdioAgent(name)
    try:
        # The first answer waits for the process to start (imports dominate: slow on a loaded
        # machine); it comes at once if the process exits (its stdout ends).
        try:
            init = agent.call(
                "initialize", {"protocolVersion": 1, "clientCapabilities": {}}, STARTUP_TIMEOUT
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{name}'s stderr:\n{agent.stderr()}") from None
        assert init["protocolVersion"] == 1
        yield agent
        assert agent.alive(), f"{name} exited:\n{agent.stderr()}"
        agent.check_clean()
    finally:
        agent.close()


@pytest.fixture(scope="module")
def agent() -> Iterator[StdioAgent]:
    """One ``fleet acp`` connection shared by the module's tests (each uses its own sessions)."""
    with stdio_agent("agent") as a:
        yield a


@pytest.fixture(scope="module")
def agent2() -> Iterator[StdioAgent]:
    """A second ``fleet acp`` process: another client, another API process."""
    with stdio_agent("agent2") as a:
        yield a


@pytest.fixture
def cwd() -> str:
    """A working directory no other test uses, so cwd-filtered lists hold only our sessions."""
    return f"/tmp/fleet-acp-test/{uuid.uuid4().hex}"


# -- helpers shared with the other ACP test modules ------------------------------------------
def new_session(peer: RpcPeer, cwd: str) -> str:
    result = peer.call("session/new", {"cwd": cwd, "mcpServers": []})
    assert set(result) >= {"sessionId"}, result
    sid: str = result["sessionId"]
    assert isinstance(sid, str) and sid
    return sid


def check_info(info: dict[str, Any]) -> None:
    """A SessionInfo as acp.md says, with the archive capability advertised."""
    assert isinstance(info["sessionId"], str) and info["sessionId"], info
    assert isinstance(info["cwd"], str) and info["cwd"].startswith("/"), info
    assert isinstance(info["archived"], bool), f"archived must be a boolean: {info}"
    if "title" in info:
        assert isinstance(info["title"], str), info
    if "updatedAt" in info:
        assert isinstance(info["updatedAt"], str) and "T" in info["updatedAt"], info


def list_page(peer: RpcPeer, **params: Any) -> dict[str, Any]:
    result: dict[str, Any] = peer.call("session/list", params)
    assert set(result) <= {"sessions", "nextCursor", "_meta"}, result
    assert isinstance(result["sessions"], list), result
    for info in result["sessions"]:
        check_info(info)
    if "nextCursor" in result:
        assert isinstance(result["nextCursor"], str) and result["nextCursor"], result
    return result


def list_all(peer: RpcPeer, **params: Any) -> list[dict[str, Any]]:
    """Every session of a listing, following nextCursor with the same filters."""
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        page = list_page(peer, **params, **({"cursor": cursor} if cursor else {}))
        out.extend(page["sessions"])
        cursor = page.get("nextCursor")
        if cursor is None:
            return out
    raise AssertionError("listing did not end")


def listed(peer: RpcPeer, cwd: str, archived: str | None = None) -> dict[str, dict[str, Any]]:
    params: dict[str, Any] = {"cwd": cwd}
    if archived is not None:
        params["archived"] = archived
    return {s["sessionId"]: s for s in list_all(peer, **params)}


def settle(peer: RpcPeer) -> None:
    """Return once ``peer`` has handled every event published before the call: a title set
    now on a session open on ``peer`` reaches it after them (the API process hears one
    channel and sends updates in publish order). Absence checks wait on this, not a sleep."""
    marker = new_session(peer, "/tmp/fleet-acp-test/markers")
    title = f"marker {uuid.uuid4().hex}"
    peer.call("session/set_title", {"sessionId": marker, "title": title})
    peer.wait_update(marker, lambda u: u.get("title") == title)


def text_prompt(sid: str, text: str) -> dict[str, Any]:
    return {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}


def check_non_finite_refused(peer: RpcPeer, cwd: str, literal: str) -> None:
    """``literal`` (``NaN``, ``Infinity``, ``-Infinity``: not JSON, though Python's parser
    takes them) is refused as a non-finite number is, naming the limit and where: in params
    -32602 to the request's id, in a cursor -32602 too, in the id -32600 to null."""
    sid = new_session(peer, cwd)
    peer.send_raw(
        f'{{"jsonrpc":"2.0","id":"{sid}","method":"session/set_title",'
        f'"params":{{"sessionId":"{sid}","title":{literal}}}}}'
    )
    error = peer.response(sid)[1]["error"]
    assert error["code"] == INVALID_PARAMS, error
    assert error["data"]["limit"] == "number", error
    assert error["data"]["path"] == "$.params.title", error
    assert f"{literal} is not finite" in error["message"], error
    assert "send a finite number" in error["message"], error
    assert "title" not in listed(peer, cwd)[sid]
    score = '{"a":"exclude","c":null,"s":' + literal + ',"i":"sess_x"}'
    cursor = base64.urlsafe_b64encode(score.encode()).decode().rstrip("=")
    error = peer.error("session/list", {"cursor": cursor}, INVALID_PARAMS)
    assert error["data"]["param"] == "cursor" and error["data"]["path"] == "$.s", error
    assert f"{literal} is not finite" in error["message"], error
    mark = peer.mark()
    peer.send_raw('{"jsonrpc":"2.0","id":' + literal + ',"method":"session/list"}')
    _, msg = peer.wait(lambda m: "error" in m, since=mark)
    assert msg["id"] is None and msg["error"]["code"] == INVALID_REQUEST, msg
    assert msg["error"]["data"]["path"] == "$.id", msg


def agent_texts(peer: RpcPeer, sid: str) -> list[str]:
    return [
        u["content"]["text"]
        for _, u in peer.updates(sid, "agent_message_chunk")
        if u["content"].get("type") == "text"
    ]


# -- initialize and JSON-RPC framing ---------------------------------------------------------
def test_initialize_advertises_protocol_1_and_the_session_capabilities(agent: StdioAgent) -> None:
    result = agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert result["protocolVersion"] == 1
    caps = result["agentCapabilities"]
    assert caps["loadSession"] is True
    assert set(caps["sessionCapabilities"]) == set(SESSION_CAPABILITIES)
    for name in SESSION_CAPABILITIES:
        assert caps["sessionCapabilities"][name] == {}, name
    # A client asking for a newer version gets the highest one supported (1).
    assert agent.call("initialize", {"protocolVersion": 7})["protocolVersion"] == 1
    agent.error("initialize", {}, INVALID_PARAMS)


def test_parse_error_for_a_line_that_is_not_json_and_the_process_keeps_serving(
    agent: StdioAgent,
) -> None:
    mark = agent.mark()
    agent.send_raw("this is not json")
    _, msg = agent.wait(lambda m: (m.get("error") or {}).get("code") == PARSE_ERROR, since=mark)
    assert msg["id"] is None and "JSON" in msg["error"]["message"]
    mark = agent.mark()
    agent.send_raw("[" * 100_000)  # nested past the parser's recursion limit
    agent.wait(lambda m: (m.get("error") or {}).get("code") == PARSE_ERROR, since=mark)
    assert agent.alive()
    assert agent.call("session/list", {"cwd": "/nonexistent/acp"}) == {"sessions": []}


@pytest.mark.parametrize(
    "line",
    [
        "[]",
        "42",
        '"a string"',
        "null",
        '{"jsonrpc": "1.0", "id": 1, "method": "initialize"}',
        '{"id": 1, "method": "initialize"}',
        '{"jsonrpc": "2.0", "id": 1}',
        '{"jsonrpc": "2.0", "id": 1, "method": 5}',
        '[{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}]',
    ],
)
def test_invalid_request_for_non_request_json(agent: StdioAgent, line: str) -> None:
    mark = agent.mark()
    agent.send_raw(line)
    _, msg = agent.wait(lambda m: (m.get("error") or {}).get("code") == INVALID_REQUEST, since=mark)
    assert msg["id"] in (None, 1)
    assert agent.call("session/list", {"cwd": "/nonexistent/acp"}) == {"sessions": []}


@pytest.mark.parametrize("bad_id", [1.5, True, {"a": 1}, [1]])
def test_invalid_request_for_bad_id_types(agent: StdioAgent, bad_id: Any) -> None:
    mark = agent.mark()
    agent.send({"jsonrpc": "2.0", "id": bad_id, "method": "session/list", "params": {}})
    _, msg = agent.wait(lambda m: (m.get("error") or {}).get("code") == INVALID_REQUEST, since=mark)
    assert msg["id"] is None  # an unusable id is never echoed


@pytest.mark.parametrize("version", ["x", "1", "2024-11", 1.5, True, None, [1]])
def test_initialize_refuses_a_protocol_version_that_is_not_an_integer(
    agent: StdioAgent, version: Any
) -> None:
    # acp.md and the schema: protocolVersion is an integer (uint16), as -5 is refused.
    err = agent.error("initialize", {"protocolVersion": version}, INVALID_PARAMS)
    assert "protocolVersion" in err["message"], err
    assert err["data"]["param"] == "protocolVersion", err
    assert (
        "protocolVersion"
        in agent.error("initialize", {"protocolVersion": -5}, INVALID_PARAMS)["message"]
    )
    assert agent.call("initialize", {"protocolVersion": 1})["protocolVersion"] == 1


def test_initialize_reads_a_legacy_date_version_as_version_1(agent: StdioAgent) -> None:
    # Early clients (some editors still) send the date of the revision they speak.
    assert agent.call("initialize", {"protocolVersion": "2024-11-05"})["protocolVersion"] == 1


@pytest.mark.parametrize("method", ["session/cancel", "$/cancel_request"])
def test_a_notification_sent_as_a_request_is_told_to_drop_the_id(
    agent: StdioAgent, method: str
) -> None:
    # acp.md: session/cancel is a notification; a request is not a method it lacks.
    params = {"sessionId": "sess_000000000000000000000000", "requestId": 1}
    err = agent.error(method, params, INVALID_REQUEST)
    assert "Method not found" not in err["message"], err
    assert f"{method} is a notification" in err["message"], err
    assert "without an id" in err["message"], err


@pytest.mark.parametrize("rid", [4, "four", None])
def test_an_invalid_request_echoes_an_id_it_could_read(agent: StdioAgent, rid: Any) -> None:
    # JSON-RPC 2.0: the id is null only when it could not be determined.
    mark = agent.mark()
    agent.send({"jsonrpc": "1.0", "id": rid, "method": "initialize", "params": {}})
    _, msg = agent.wait(lambda m: (m.get("error") or {}).get("code") == INVALID_REQUEST, since=mark)
    assert "id" in msg and msg["id"] == rid and type(msg["id"]) is type(rid), msg


def test_string_and_null_ids_are_echoed(agent: StdioAgent) -> None:
    agent.send({"jsonrpc": "2.0", "id": "req-ä", "method": "session/list", "params": {}})
    _, msg = agent.response("req-ä")
    assert "result" in msg
    # ACP's RequestId admits null (discouraged, but a request).
    mark = agent.mark()
    agent.send({"jsonrpc": "2.0", "id": None, "method": "initialize", "params": {"x": 1}})
    agent.wait(
        lambda m: m.get("id") is None and (m.get("error") or {}).get("code") == INVALID_PARAMS,
        since=mark,
    )


def test_unknown_method_is_method_not_found_and_unknown_notification_is_ignored(
    agent: StdioAgent,
) -> None:
    err = agent.error("session/fly", {}, METHOD_NOT_FOUND)
    assert "session/fly" in err["message"]
    mark = agent.mark()
    agent.notify("session/fly", {})
    agent.notify("session/cancel", {})  # malformed notification: no answer, no harm
    assert agent.call("session/list", {"cwd": "/nonexistent/acp"}) == {"sessions": []}
    answers = [m for m in agent.messages[mark:] if "method" not in m]
    assert [m["id"] for m in answers] == [answers[-1]["id"]], answers


def test_params_must_be_an_object(agent: StdioAgent) -> None:
    agent.error("session/list", [1, 2], INVALID_PARAMS)
    agent.error("session/list", "x", INVALID_PARAMS)


def test_lone_surrogates_are_invalid_params_never_internal_errors(agent: StdioAgent) -> None:
    # "\ud800" is valid JSON but not Unicode text; the agent must answer, not crash.
    agent.send_raw(
        '{"jsonrpc":"2.0","id":"s1","method":"session/new","params":{"cwd":"/tmp/\\ud800",'
        '"mcpServers":[]}}'
    )
    _, msg = agent.response("s1")
    assert msg["error"]["code"] == INVALID_PARAMS, msg
    agent.send_raw(
        '{"jsonrpc":"2.0","id":"s2","method":"session/list","params":{"cwd":"/\\ud800"}}'
    )
    assert agent.response("s2")[1]["error"]["code"] == INVALID_PARAMS
    agent.send_raw('{"jsonrpc":"2.0","id":"s3","method":"nope/\\ud800"}')
    assert agent.response("s3")[1]["error"]["code"] == METHOD_NOT_FOUND
    sid = new_session(agent, "/tmp/fleet-acp-test/surrogates")
    # json.dumps writes a lone surrogate as the escape "\\ud800", as a client would.
    agent.error("session/prompt", text_prompt(sid, "say \ud800"), INVALID_PARAMS)
    titled = agent.call("session/set_title", {"sessionId": sid, "title": "a\ud800b"})
    assert titled == {"title": "ab"}  # the title normalizer drops it


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_as_numbers_that_are_not_finite(
    agent: StdioAgent, cwd: str, literal: str
) -> None:
    check_non_finite_refused(agent, cwd, literal)
    assert agent.call("session/list", {"cwd": "/nonexistent/acp"}) == {"sessions": []}


def test_session_new_requires_an_absolute_cwd(agent: StdioAgent) -> None:
    params: dict[str, Any]
    for params in (
        {"cwd": "relative/dir", "mcpServers": []},
        {"cwd": "", "mcpServers": []},
        {"mcpServers": []},
        {"cwd": 5, "mcpServers": []},
    ):
        err = agent.error("session/new", params, INVALID_PARAMS)
        assert "cwd" in err["message"]
    agent.error("session/new", {"cwd": "/tmp/x", "mcpServers": "none"}, INVALID_PARAMS)


# -- session/list ----------------------------------------------------------------------------
def test_list_archived_filter_default_excludes_include_and_only(
    agent: StdioAgent, cwd: str
) -> None:
    kept, hidden = new_session(agent, cwd), new_session(agent, cwd)
    assert agent.call("session/archive", {"sessionId": hidden}) == {}
    for default in (None, "exclude"):
        sessions = listed(agent, cwd, default)
        assert set(sessions) == {kept}, default
    explicit_null = list_all(agent, cwd=cwd, archived=None)
    assert {s["sessionId"] for s in explicit_null} == {kept}
    include = listed(agent, cwd, "include")
    assert set(include) == {kept, hidden}
    assert include[kept]["archived"] is False and include[hidden]["archived"] is True
    only = listed(agent, cwd, "only")
    assert set(only) == {hidden} and only[hidden]["archived"] is True


@pytest.mark.parametrize(
    "value", [True, False, "yes", 1, 0, "", "EXCLUDE", "all", "_vendor", [], {}]
)
def test_list_rejects_unsupported_archived_values_never_silently_excluding(
    agent: StdioAgent, value: Any
) -> None:
    err = agent.error("session/list", {"archived": value}, INVALID_PARAMS)
    assert "archived" in err["message"]


def test_list_every_session_carries_boolean_archived(agent: StdioAgent, cwd: str) -> None:
    sids = [new_session(agent, cwd) for _ in range(3)]
    agent.call("session/archive", {"sessionId": sids[0]})
    for flt in ("exclude", "include", "only"):
        for info in list_all(agent, cwd=cwd, archived=flt):
            assert isinstance(info["archived"], bool), info
    # Unfiltered by cwd too: every session anyone listed carries it.
    for info in list_page(agent, archived="include")["sessions"]:
        assert isinstance(info["archived"], bool), info


def test_list_empty_result_and_no_next_cursor_on_last_page(agent: StdioAgent, cwd: str) -> None:
    assert agent.call("session/list", {"cwd": cwd}) == {"sessions": []}
    assert agent.call("session/list", {"cwd": cwd, "archived": "only"}) == {"sessions": []}
    new_session(agent, cwd)
    page = list_page(agent, cwd=cwd)
    assert len(page["sessions"]) == 1 and "nextCursor" not in page


def test_list_rejects_a_relative_cwd(agent: StdioAgent) -> None:
    agent.error("session/list", {"cwd": "relative"}, INVALID_PARAMS)
    agent.error("session/list", {"cwd": 3}, INVALID_PARAMS)


def test_list_pagination_walks_every_session_exactly_once(
    agent: StdioAgent, store: Any, cwd: str
) -> None:
    created = [session_ops.create_session(store, cwd).session_id for _ in range(2 * LIST_PAGE + 7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = list_page(agent, cwd=cwd, **({"cursor": cursor} if cursor else {}))
        pages += 1
        assert len(page["sessions"]) <= LIST_PAGE
        seen.extend(s["sessionId"] for s in page["sessions"])
        cursor = page.get("nextCursor")
        if cursor is None:
            break
        assert len(page["sessions"]) == LIST_PAGE  # only the last page is short
    assert pages == 3
    assert len(seen) == len(set(seen)), "a session was listed twice"
    assert set(seen) == set(created)
    # Newest activity first.
    stamps = [s["updatedAt"] for s in list_all(agent, cwd=cwd)]
    assert stamps == sorted(stamps, reverse=True)


def test_list_exactly_one_full_page_has_no_next_cursor(
    agent: StdioAgent, store: Any, cwd: str
) -> None:
    for _ in range(LIST_PAGE):
        session_ops.create_session(store, cwd)
    page = list_page(agent, cwd=cwd)
    assert len(page["sessions"]) == LIST_PAGE and "nextCursor" not in page


def test_list_filter_combines_with_cwd_and_applies_before_pagination(
    agent: StdioAgent, store: Any, dispatcher: Any, cwd: str
) -> None:
    other = f"{cwd}-other"
    mine = [session_ops.create_session(store, cwd).session_id for _ in range(LIST_PAGE + 20)]
    session_ops.create_session(store, other)
    archived = set(mine[::2])  # 35 archived, 35 not: every filter spans pages of its own
    for sid in archived:
        archive_ops.archive(store, dispatcher, sid)
    exclude = [s["sessionId"] for s in list_all(agent, cwd=cwd)]
    only = [s["sessionId"] for s in list_all(agent, cwd=cwd, archived="only")]
    include = [s["sessionId"] for s in list_all(agent, cwd=cwd, archived="include")]
    assert sorted(exclude) == sorted(set(mine) - archived)
    assert sorted(only) == sorted(archived)
    assert sorted(include) == sorted(mine)
    assert len(include) == len(set(include))
    # A first page of a filtered listing is full of matching sessions only.
    first = list_page(agent, cwd=cwd, archived="include")
    assert len(first["sessions"]) == LIST_PAGE and "nextCursor" in first


def test_list_cursor_is_bound_to_its_cwd_and_archived_filter(
    agent: StdioAgent, store: Any, cwd: str
) -> None:
    for _ in range(LIST_PAGE + 1):
        session_ops.create_session(store, cwd)
    cursor = list_page(agent, cwd=cwd, archived="include")["nextCursor"]
    assert list_page(agent, cwd=cwd, archived="include", cursor=cursor)["sessions"]
    for params in (
        {"cwd": cwd, "archived": "only"},
        {"cwd": cwd, "archived": "exclude"},
        {"cwd": cwd},
        {"cwd": f"{cwd}-elsewhere", "archived": "include"},
        {"archived": "include"},
        {},
    ):
        err = agent.error("session/list", {**params, "cursor": cursor}, INVALID_PARAMS)
        assert "cursor" in err["message"]


@pytest.mark.parametrize(
    "cursor",
    [
        "garbled!!",
        "",
        "x" * 10_000,
        base64.urlsafe_b64encode(b'{"a":"exclude","c":null}').decode(),
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
        base64.urlsafe_b64encode(b"\xff\xfe not utf-8").decode(),
        5,
        {"s": 1},
    ],
)
def test_list_invalid_cursor_is_invalid_params(agent: StdioAgent, cursor: Any) -> None:
    agent.error("session/list", {"cursor": cursor}, INVALID_PARAMS)


def test_list_never_shows_deleted_sessions_under_any_filter(agent: StdioAgent, cwd: str) -> None:
    plain, archived = new_session(agent, cwd), new_session(agent, cwd)
    agent.call("session/archive", {"sessionId": archived})
    for sid in (plain, archived):
        assert agent.call("session/delete", {"sessionId": sid}) == {}
    for flt in (None, "exclude", "include", "only"):
        assert listed(agent, cwd, flt) == {}, flt
    everything = {s["sessionId"] for s in list_all(agent, archived="include")}
    assert not {plain, archived} & everything


def test_list_never_loads_resumes_or_modifies_anything(
    agent: StdioAgent, agent2: StdioAgent, store: Any, cwd: str
) -> None:
    sid = session_ops.create_session(store, cwd).session_id
    before = store.redis.hgetall(store.keys.session(sid))
    for flt in ("exclude", "include", "only"):
        list_all(agent2, cwd=cwd, archived=flt)
    assert store.redis.hgetall(store.keys.session(sid)) == before
    # Listing opened nothing: a change made elsewhere is not pushed to the lister.
    agent.call("session/set_title", {"sessionId": sid, "title": "changed elsewhere"})
    settle(agent2)
    assert agent2.updates(sid) == []


# -- session/archive and session/unarchive ---------------------------------------------------
def test_archive_hides_from_default_list_and_keeps_id_and_conversation(
    agent: StdioAgent, agent2: StdioAgent, store: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    # A turn's answer (its step is never sent: no worker runs it), then the turn ends
    tid = turns.start_turn(store, RecordingDispatcher(), sid, "say kept across archive")
    turns.record_update(
        store,
        sid,
        {
            "sessionUpdate": "agent_message_chunk",
            "turnId": tid,
            "content": {"type": "text", "text": "kept across archive"},
        },
    )
    turns.finish(store, RecordingDispatcher(), tid, turns.TurnState.COMPLETED)
    assert agent.call("session/archive", {"sessionId": sid}) == {}
    assert sid not in listed(agent, cwd)
    assert listed(agent, cwd, "only")[sid]["archived"] is True
    assert agent.call("session/unarchive", {"sessionId": sid}) == {}
    assert listed(agent, cwd)[sid]["archived"] is False
    agent2.call("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []})
    texts = [u["content"]["text"] for _, u in agent2.updates(sid, "agent_message_chunk")]
    assert texts == ["kept across archive"]


def test_archive_and_unarchive_are_idempotent(agent: StdioAgent, cwd: str) -> None:
    sid = new_session(agent, cwd)
    assert agent.call("session/unarchive", {"sessionId": sid}) == {}  # never archived
    assert agent.call("session/archive", {"sessionId": sid}) == {}
    assert agent.call("session/archive", {"sessionId": sid}) == {}
    assert listed(agent, cwd, "only")[sid]["archived"] is True
    assert agent.call("session/unarchive", {"sessionId": sid}) == {}
    assert agent.call("session/unarchive", {"sessionId": sid}) == {}
    assert listed(agent, cwd)[sid]["archived"] is False


def test_archive_and_unarchive_do_not_need_the_session_open_on_the_connection(
    agent2: StdioAgent, store: Any, cwd: str
) -> None:
    sid = session_ops.create_session(store, cwd).session_id  # never opened by any client
    assert agent2.call("session/archive", {"sessionId": sid}) == {}
    assert store.redis.hget(store.keys.session(sid), "archived") == "1"
    assert agent2.call("session/unarchive", {"sessionId": sid}) == {}
    assert store.redis.hget(store.keys.session(sid), "archived") == "0"


@pytest.mark.parametrize("method", ["session/archive", "session/unarchive"])
def test_archive_and_unarchive_of_unknown_or_deleted_session_is_resource_not_found(
    agent: StdioAgent, cwd: str, method: str
) -> None:
    agent.error(method, {"sessionId": "sess_" + "0" * 24}, NOT_FOUND)
    agent.error(method, {"sessionId": "not a session id!"}, NOT_FOUND)
    sid = new_session(agent, cwd)
    agent.call("session/delete", {"sessionId": sid})
    agent.error(method, {"sessionId": sid}, NOT_FOUND)
    # Unlike archive, delete of an unknown session succeeds silently.
    assert agent.call("session/delete", {"sessionId": "sess_" + "1" * 24}) == {}


def test_archive_with_stop_activity_false_refuses_a_busy_session_naming_its_work(
    agent: StdioAgent, store: Any, cwd: str
) -> None:
    # Given a session with a queued turn (no worker runs it)
    sid = new_session(agent, cwd)
    tid = turns.start_turn(store, RecordingDispatcher(), sid, "think 30")
    # When a client archives it saying not to stop its work
    err = agent.error("session/archive", {"sessionId": sid, "stopActivity": False}, -32003)
    # Then it is refused with the live items, and nothing is archived or stopped
    assert [(a["family"], a["id"]) for a in err["data"]["activity"]] == [("turn", tid)], err
    assert "stopActivity" in err["message"], err
    # And a value that is not a boolean is refused, never read as either
    for value in ("false", 0, "no", []):
        agent.error("session/archive", {"sessionId": sid, "stopActivity": value}, INVALID_PARAMS)
    assert store.redis.hget(store.keys.session(sid), "archived") == "0"
    assert turns.get_turn(store, tid).state.value in ("queued", "running")  # still live
    # And without it (or with null or true) the protocol's rule stops the work and archives
    assert agent.call("session/archive", {"sessionId": sid, "stopActivity": None}) == {}
    assert store.redis.hget(store.keys.session(sid), "archived") == "1"


@pytest.mark.parametrize("method", ["session/archive", "session/unarchive"])
def test_archive_and_unarchive_require_a_session_id(agent: StdioAgent, method: str) -> None:
    for params in ({}, {"sessionId": None}, {"sessionId": 5}, {"sessionId": ""}):
        agent.error(method, params, INVALID_PARAMS)


def test_archive_state_persists_across_connections(
    agent: StdioAgent, agent2: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/archive", {"sessionId": sid})
    assert listed(agent2, cwd, "include")[sid]["archived"] is True
    with stdio_agent("fresh") as fresh:  # a new process: nothing cached anywhere
        assert listed(fresh, cwd, "only")[sid]["archived"] is True
        fresh.call("session/unarchive", {"sessionId": sid})
    assert listed(agent, cwd)[sid]["archived"] is False


def test_archive_and_unarchive_do_not_change_updated_at(agent: StdioAgent, cwd: str) -> None:
    sid = new_session(agent, cwd)
    before = listed(agent, cwd)[sid]["updatedAt"]
    time.sleep(0.01)
    agent.call("session/archive", {"sessionId": sid})
    assert listed(agent, cwd, "only")[sid]["updatedAt"] == before
    agent.call("session/unarchive", {"sessionId": sid})
    assert listed(agent, cwd)[sid]["updatedAt"] == before


def test_archive_notifies_clients_with_the_session_open_and_unarchive_too(
    agent: StdioAgent, agent2: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)  # open on agent
    agent2.call("session/archive", {"sessionId": sid})
    agent.wait_update(
        sid, lambda u: u == {"sessionUpdate": "session_info_update", "archived": True}
    )
    agent2.call("session/unarchive", {"sessionId": sid})
    agent.wait_update(
        sid, lambda u: u == {"sessionUpdate": "session_info_update", "archived": False}
    )
    assert agent2.updates(sid) == []  # agent2 never opened it


def test_unarchive_returns_to_default_lists_without_loading_resuming_or_restarting(
    agent: StdioAgent, agent2: StdioAgent, store: Any, dispatcher: Any, cwd: str
) -> None:
    sid = session_ops.create_session(store, cwd).session_id
    archive_ops.archive(store, dispatcher, sid)
    turns_before = store.redis.zcard(store.keys.live_turns(sid))
    history_before = store.redis.llen(store.keys.history(sid))
    assert agent2.call("session/unarchive", {"sessionId": sid}) == {}
    assert listed(agent, cwd)[sid]["archived"] is False
    # Nothing was opened, replayed or started: no updates, no turns, no activity.
    assert agent2.updates(sid) == []
    assert store.redis.zcard(store.keys.live_turns(sid)) == turns_before == 0
    assert store.redis.llen(store.keys.history(sid)) == history_before
    assert agent2.call("_agentFleet/activity", {"sessionId": sid}) == {"activity": []}
    agent.call("session/set_title", {"sessionId": sid, "title": "not pushed to agent2"})
    settle(agent2)
    assert agent2.updates(sid) == []


def test_load_and_resume_of_archived_session_refused_telling_to_unarchive_first(
    agent: StdioAgent, agent2: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/archive", {"sessionId": sid})
    for method in ("session/load", "session/resume"):
        msg = agent2.request(method, {"sessionId": sid, "cwd": cwd, "mcpServers": []})
        err = msg.get("error")
        assert err, msg
        assert err["code"] not in (INTERNAL_ERROR, NOT_FOUND), err
        assert "unarchive" in err["message"], err
    assert listed(agent, cwd, "only")[sid]["archived"] is True


def test_close_load_and_resume_never_change_archive_state(
    agent: StdioAgent, agent2: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/close", {"sessionId": sid})
    agent2.call("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []})
    agent2.call("session/resume", {"sessionId": sid, "cwd": cwd})
    assert listed(agent, cwd)[sid]["archived"] is False
    agent.call("session/archive", {"sessionId": sid})
    agent.call("session/close", {"sessionId": sid})
    agent2.request("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []})
    agent2.request("session/resume", {"sessionId": sid, "cwd": cwd})
    assert listed(agent, cwd, "only")[sid]["archived"] is True


def test_delete_is_not_an_archive_and_unarchive_never_restores_a_deleted_session(
    agent: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/archive", {"sessionId": sid})
    agent.call("session/delete", {"sessionId": sid})
    agent.call("session/delete", {"sessionId": sid})  # idempotent
    agent.error("session/unarchive", {"sessionId": sid}, NOT_FOUND)
    for flt in ("exclude", "include", "only"):
        assert sid not in listed(agent, cwd, flt)
    plain = new_session(agent, cwd)
    agent.call("session/delete", {"sessionId": plain})
    assert listed(agent, cwd, "only") == {}  # a delete never shows up as archived
    agent.error("session/load", {"sessionId": plain, "cwd": cwd, "mcpServers": []}, NOT_FOUND)


# -- session/set_title -----------------------------------------------------------------------
def test_set_title_normalizes_and_returns_the_stored_title(agent: StdioAgent, cwd: str) -> None:
    sid = new_session(agent, cwd)
    assert agent.call("session/set_title", {"sessionId": sid, "title": "  a\n\tb  "}) == {
        "title": "a b"
    }
    assert listed(agent, cwd)[sid]["title"] == "a b"
    long = agent.call("session/set_title", {"sessionId": sid, "title": "x" * 500})["title"]
    assert 0 < len(long) < 500 and long == "x" * len(long)
    assert listed(agent, cwd)[sid]["title"] == long


@pytest.mark.parametrize("params", [{"title": ""}, {"title": " \n\t "}, {"title": None}, {}])
def test_set_title_empty_missing_or_null_is_invalid_params(
    agent: StdioAgent, cwd: str, params: dict[str, Any]
) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/set_title", {"sessionId": sid, "title": "before"})
    err = agent.error("session/set_title", {"sessionId": sid, **params}, INVALID_PARAMS)
    assert err["message"] == "Title must not be empty."
    assert listed(agent, cwd)[sid]["title"] == "before"


@pytest.mark.parametrize("title", [5, ["a"], {"t": "a"}, True])
def test_set_title_non_string_is_invalid_params(agent: StdioAgent, cwd: str, title: Any) -> None:
    sid = new_session(agent, cwd)
    agent.error("session/set_title", {"sessionId": sid, "title": title}, INVALID_PARAMS)


def test_set_title_unknown_or_deleted_session_is_resource_not_found(
    agent: StdioAgent, cwd: str
) -> None:
    agent.error("session/set_title", {"sessionId": "sess_" + "2" * 24, "title": "t"}, NOT_FOUND)
    sid = new_session(agent, cwd)
    agent.call("session/delete", {"sessionId": sid})
    agent.error("session/set_title", {"sessionId": sid, "title": "t"}, NOT_FOUND)
    agent.error("session/set_title", {"title": "t"}, INVALID_PARAMS)


def test_set_title_is_persisted_before_the_response_and_each_set_replaces_the_previous(
    agent: StdioAgent, agent2: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    for title in ("first", "second", "third"):
        assert agent.call("session/set_title", {"sessionId": sid, "title": title}) == {
            "title": title
        }
        # The very next list, from another process, already shows it.
        info = listed(agent2, cwd)[sid]
        assert info["title"] == title
        assert info["_meta"]["agentFleet"]["titleSource"] == "client"


def test_set_title_works_on_sessions_not_loaded_and_on_archived_ones(
    agent2: StdioAgent, store: Any, dispatcher: Any, cwd: str
) -> None:
    sid = session_ops.create_session(store, cwd).session_id
    assert agent2.call("session/set_title", {"sessionId": sid, "title": "never loaded"})
    archive_ops.archive(store, dispatcher, sid)
    assert agent2.call("session/set_title", {"sessionId": sid, "title": "archived"}) == {
        "title": "archived"
    }
    assert listed(agent2, cwd, "only")[sid]["title"] == "archived"


def test_set_title_notifies_clients_with_the_session_open(
    agent: StdioAgent, agent2: StdioAgent, cwd: str
) -> None:
    sid = new_session(agent, cwd)  # open on agent only
    assert agent2.call("session/set_title", {"sessionId": sid, "title": " Fix\nthe  bug "}) == {
        "title": "Fix the bug"
    }
    agent.wait_update(
        sid, lambda u: u == {"sessionUpdate": "session_info_update", "title": "Fix the bug"}
    )
    assert agent2.updates(sid) == []


def test_title_update_does_not_change_updated_at(agent: StdioAgent, cwd: str) -> None:
    sid = new_session(agent, cwd)
    before = listed(agent, cwd)[sid]["updatedAt"]
    time.sleep(0.01)
    agent.call("session/set_title", {"sessionId": sid, "title": "renamed"})
    assert listed(agent, cwd)[sid]["updatedAt"] == before


# -- the rest of the lifecycle ---------------------------------------------------------------
def test_unknown_session_on_load_resume_close_and_prompt_is_resource_not_found(
    agent: StdioAgent,
) -> None:
    missing = "sess_" + "3" * 24
    agent.error("session/load", {"sessionId": missing, "cwd": "/tmp", "mcpServers": []}, NOT_FOUND)
    agent.error("session/resume", {"sessionId": missing, "cwd": "/tmp"}, NOT_FOUND)
    agent.error("session/close", {"sessionId": missing}, NOT_FOUND)
    agent.error("session/prompt", text_prompt(missing, "say hi"), NOT_FOUND)


def test_prompt_rejects_malformed_content(agent: StdioAgent, cwd: str) -> None:
    sid = new_session(agent, cwd)
    for prompt in (
        [],
        "say hi",
        [{"type": "text"}],
        [{"type": "image", "data": "", "mimeType": ""}],
    ):
        agent.error("session/prompt", {"sessionId": sid, "prompt": prompt}, INVALID_PARAMS)


def test_session_load_replays_the_conversation_before_its_response(
    agent: StdioAgent, agent2: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    assert agent.call("session/prompt", text_prompt(sid, "say one\nsay two"), PROMPT_TIMEOUT) == {
        "stopReason": "end_turn"
    }
    rid = agent2.request_async("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []})
    at, msg = agent2.response(rid)
    assert msg["result"] == {}
    replay = agent2.updates(sid)
    assert replay and all(i < at for i, _ in replay), "every replayed update precedes the response"
    kinds = [u["sessionUpdate"] for _, u in replay]
    assert kinds[0] == "user_message_chunk"
    assert replay[0][1]["content"] == {"type": "text", "text": "say one\nsay two"}
    assert agent_texts(agent2, sid) == ["one", "two"]
    for _, update in replay:  # the fleet's own fields travel in _meta, not in the update
        assert "turnId" not in update
        if update["sessionUpdate"] != "session_info_update":
            assert update["_meta"]["agentFleet"]["turnId"].startswith("turn_")


def test_prompt_say_hello_sends_updates_then_end_turn(
    agent: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "say hello"))
    at, msg = agent.response(rid, PROMPT_TIMEOUT)
    assert msg["result"] == {"stopReason": "end_turn"}
    chunks = agent.updates(sid, "agent_message_chunk")
    assert [u["content"] for _, u in chunks] == [{"type": "text", "text": "hello"}]
    assert all(i < at for i, _ in agent.updates(sid)), "an update came after the response"


def test_prompt_cancelled_by_session_cancel_resolves_with_stop_reason_cancelled(
    agent: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "think 30\nsay never"))
    agent.wait_update(sid, lambda u: u["sessionUpdate"] == "user_message_chunk")
    agent.notify("session/cancel", {"sessionId": sid})
    _, msg = agent.response(rid, 15)
    assert msg["result"] == {"stopReason": "cancelled"}, msg
    # (how soon the cancel settles it is measured by ``python -m bench.latency``)
    assert "never" not in agent_texts(agent, sid)


def test_session_cancel_stops_only_the_turn_of_this_connections_prompt(
    agent: StdioAgent, fleet: Any, store: Any, cwd: str
) -> None:
    # Given this connection's prompt running and another client's turn queued behind it
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "think 30"))
    agent.wait_update(sid, lambda u: u["sessionUpdate"] == "user_message_chunk")
    other = turns.start_turn(store, RecordingDispatcher(), sid, "think 30")
    try:
        # When this connection sends session/cancel
        agent.notify("session/cancel", {"sessionId": sid})
        _, msg = agent.response(rid, 15)
        # Then its prompt ends cancelled, and the other client's turn is not touched (it runs
        # next)
        assert msg["result"] == {"stopReason": "cancelled"}, msg
        wait_for(
            lambda: turns.get_turn(store, other).state.value == "running",
            message="the other client's turn to start",
        )
    finally:
        turns.cancel_turns(store, RecordingDispatcher(), sid, [other])


def test_cancel_request_of_a_prompt_resolves_it_with_stop_reason_cancelled(
    agent: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "think 30"))
    agent.wait_update(sid, lambda u: u["sessionUpdate"] == "user_message_chunk")
    agent.notify("$/cancel_request", {"requestId": rid})
    _, msg = agent.response(rid, 15)
    assert msg["result"] == {"stopReason": "cancelled"}, msg
    # A cancel for a request already answered, or never sent, is ignored.
    mark = agent.mark()
    agent.notify("$/cancel_request", {"requestId": rid})
    agent.notify("$/cancel_request", {"requestId": "never-sent"})
    agent.notify("$/cancel_request", {})
    assert agent.call("session/list", {"cwd": cwd})["sessions"]
    assert [m for m in agent.messages[mark:] if "method" not in m][:-1] == []


def test_archive_of_an_active_session_cancels_its_work_and_notifies_before_the_prompt_resolves(
    agent: StdioAgent, agent2: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "exec 30\nsay never"))
    agent.wait_update(sid, lambda u: u["sessionUpdate"] == "tool_call", timeout=PROMPT_TIMEOUT)
    assert agent2.call("session/archive", {"sessionId": sid}) == {}  # another process
    at, msg = agent.response(rid, 20)
    assert msg["result"] == {"stopReason": "cancelled"}, msg
    info_at, _ = agent.wait_update(
        sid, lambda u: u == {"sessionUpdate": "session_info_update", "archived": True}
    )
    assert info_at < at, "archived:true must reach the client before its prompt resolves"
    # The exec tool call was settled by the archive itself (in ACP v1 terms it failed; the
    # fleet's status is in _meta), and nothing the stopped step did landed after it.
    settled = [u for _, u in agent.updates(sid, "tool_call_update")]
    assert len(settled) == 1 and settled[0]["status"] == "failed", settled
    assert settled[0].get("_meta", {}).get("agentFleet", {}).get("status") == "cancelled"
    assert agent2.call("_agentFleet/activity", {"sessionId": sid}) == {"activity": []}
    # Unarchive brings back nothing that was stopped: a prompt sent after it runs to its end
    # (the turn worker took messages sent after the unarchive), and the stopped one did not
    # come back meanwhile.
    assert agent2.call("session/unarchive", {"sessionId": sid}) == {}
    agent.wait_update(sid, lambda u: u.get("archived") is False)
    assert agent.call("session/prompt", text_prompt(sid, "say after"), PROMPT_TIMEOUT) == {
        "stopReason": "end_turn"
    }
    assert agent2.call("_agentFleet/activity", {"sessionId": sid}) == {"activity": []}
    assert agent_texts(agent, sid)[-1] == "after" and "never" not in agent_texts(agent, sid)


def test_untitled_session_gets_a_generated_title_from_its_first_prompt(
    agent: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    assert "title" not in listed(agent, cwd)[sid]
    rid = agent.request_async("session/prompt", text_prompt(sid, "say  Hello\tworld\nsay more"))
    at, msg = agent.response(rid, PROMPT_TIMEOUT)
    assert msg["result"] == {"stopReason": "end_turn"}
    info = listed(agent, cwd)[sid]
    assert info["title"] == "say Hello world"
    assert info["_meta"]["agentFleet"]["titleSource"] == "generated"
    title_at, _ = agent.wait_update(sid, lambda u: u.get("title") == "say Hello world")
    assert title_at < at
    # A later prompt does not retitle the session.
    agent.call("session/prompt", text_prompt(sid, "say again"), PROMPT_TIMEOUT)
    assert listed(agent, cwd)[sid]["title"] == "say Hello world"


def test_generated_title_never_replaces_a_client_set_title(
    agent: StdioAgent, store: Any, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/set_title", {"sessionId": sid, "title": "Mine"})
    assert agent.call("session/prompt", text_prompt(sid, "say hi"), PROMPT_TIMEOUT) == {
        "stopReason": "end_turn"
    }
    info = listed(agent, cwd)[sid]
    assert info["title"] == "Mine" and info["_meta"]["agentFleet"]["titleSource"] == "client"
    # A title that was being generated when the client renamed is discarded.
    assert titles.set_title(store, sid, "late generated", source="generated") is None
    assert listed(agent, cwd)[sid]["title"] == "Mine"
    settle(agent)
    sent = [u["title"] for _, u in agent.updates(sid, "session_info_update") if "title" in u]
    assert set(sent) <= {"Mine"}, sent


def test_set_title_mid_turn_does_not_affect_the_turn(
    agent: StdioAgent, agent2: StdioAgent, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "think 1.5\nsay done"))
    # Step 0 has begun (it generated the title) and is thinking.
    agent.wait_update(sid, lambda u: u.get("title") == "think 1.5", timeout=PROMPT_TIMEOUT)
    assert agent2.call("session/set_title", {"sessionId": sid, "title": "Renamed mid-turn"}) == {
        "title": "Renamed mid-turn"
    }
    at, msg = agent.response(rid, PROMPT_TIMEOUT)
    assert msg["result"] == {"stopReason": "end_turn"}
    assert agent_texts(agent, sid)[-1] == "done"
    rename_at, _ = agent.wait_update(sid, lambda u: u.get("title") == "Renamed mid-turn")
    assert rename_at < at
    info = listed(agent, cwd)[sid]
    assert info["title"] == "Renamed mid-turn"
    wait_for(lambda: not agent.call("_agentFleet/activity", {"sessionId": sid})["activity"])


def test_close_cancels_a_running_prompt(
    agent: StdioAgent, store: Any, fleet: Any, cwd: str
) -> None:
    sid = new_session(agent, cwd)
    rid = agent.request_async("session/prompt", text_prompt(sid, "think 30"))
    # Once the step runs (its model request is made): the turn is settled by its step
    wait_for(lambda: model_requests(store, sid), message=f"the model request of {sid}")
    assert agent.call("session/close", {"sessionId": sid}) == {}
    _, msg = agent.response(rid, 15)
    assert msg["result"] == {"stopReason": "cancelled"}
    # Closed: nothing more of the session reaches this client.
    count = len(agent.updates(sid))
    agent.call("session/set_title", {"sessionId": sid, "title": "after close"})
    settle(agent)
    assert len(agent.updates(sid)) == count


def test_prompt_on_an_archived_session_is_refused(agent: StdioAgent, cwd: str) -> None:
    sid = new_session(agent, cwd)
    agent.call("session/archive", {"sessionId": sid})
    msg = agent.request("session/prompt", text_prompt(sid, "say hi"))
    assert "unarchive" in msg["error"]["message"]
    assert msg["error"]["code"] not in (INTERNAL_ERROR, NOT_FOUND)


def test_a_line_larger_than_the_limit_is_refused_and_the_next_line_served(
    agent: StdioAgent,
) -> None:
    mark = agent.mark()
    big = {
        "jsonrpc": "2.0",
        "id": "big",
        "method": "session/list",
        "params": {"x": "a" * 1_200_000},
    }
    agent.send(big)
    agent.wait(lambda m: (m.get("error") or {}).get("code") == INVALID_REQUEST, since=mark)
    assert agent.call("session/list", {"cwd": "/nonexistent/acp"}) == {"sessions": []}
    assert not any(m.get("id") == "big" for m in agent.messages)


def test_stdin_eof_ends_the_process_cleanly() -> None:
    agent = StdioAgent("eof")
    try:
        agent.send(INITIALIZE)
        agent.send({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}})
        assert agent.proc.stdin is not None
        agent.proc.stdin.close()
        # The process starts, answers and exits: the bound is its start's.
        assert agent.proc.wait(STARTUP_TIMEOUT) == 0, agent.stderr()
        agent._reader.join(5)
        assert agent.response(1, 1)[1]["result"]["sessions"] is not None
        agent.check_clean()
    finally:
        agent.close()


def test_session_load_while_updates_stream_misses_and_repeats_nothing(
    agent2: StdioAgent, store: Any, cwd: str
) -> None:
    """session/load of a session whose turn is streaming: the replay plus the live updates
    that follow it are the conversation exactly, none lost in between and none sent twice."""
    sid = session_ops.create_session(store, cwd).session_id
    # The updates of a running turn (its step is never sent: no worker runs it)
    tid = turns.start_turn(store, RecordingDispatcher(), sid, "say chunks")
    stop = threading.Event()

    def stream() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            turns.record_update(
                store,
                sid,
                {
                    "sessionUpdate": "agent_message_chunk",
                    "turnId": tid,
                    "content": {"type": "text", "text": f"chunk {n}"},
                },
            )
            time.sleep(0.0005)

    writer = threading.Thread(target=stream, daemon=True)
    writer.start()
    try:  # once the writer is going
        wait_for(lambda: store.redis.llen(store.keys.history(sid)) > 50, message="chunks")
        for _ in range(5):  # several loads: each one races the writer
            agent2.call("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []})
            agent2.call("session/close", {"sessionId": sid})
    finally:
        stop.set()
        writer.join(5)
    history = [
        json.loads(h)["content"]["text"] for h in store.redis.lrange(store.keys.history(sid), 0, -1)
    ]
    # Per load: what the client got between the load request and the close answer.
    received = agent_texts(agent2, sid)
    assert received, "nothing replayed"
    loads: list[list[str]] = []
    current: list[str] = []
    for text in received:
        if text == "chunk 0" and current:
            loads.append(current)
            current = []
        current.append(text)
    loads.append(current)
    assert len(loads) == 5, [len(x) for x in loads]
    for got in loads:
        assert len(got) == len(set(got)), "an update was sent twice"
        assert got == history[: len(got)], "an update was lost or reordered"
