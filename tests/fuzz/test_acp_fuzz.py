"""Property-based fuzzing of the JSON-RPC endpoint: ``api.acp.AcpConnection`` driven in process
(the same object serves ``fleet acp`` and the ``/acp`` WebSocket) with arbitrary JSON values,
JSON-RPC-shaped objects with methods from the real method list and random params, random text
lines, deeply nested documents and hostile JSON (numbers of thousands of digits, non-finite
numbers, nesting past the parse limit, lone surrogates: in params, in ids and inside listing
cursors), against the real test Redis.

For every input: ``handle_text`` never raises; every message sent back is a JSON-RPC 2.0
message whose errors carry an integer ``code`` and a non-empty ``message`` and are never
-32603 (internal error); a request (with a usable id) is answered; the connection still
answers ``initialize`` afterwards. A ``RecordingDispatcher`` stands in for Celery, so a prompt
on a real session starts a turn that no worker runs: such prompts may stay pending and are
cancelled when the connection closes.

The number of inputs fuzzed per target is printed (run with ``-s`` to see it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.acp import MAX_MESSAGE, AcpConnection, encode_message, shared_hub
from api.acp import METHODS as _METHODS
from api.acp import NOTIFICATIONS as _NOTIFICATIONS
from orchestrator import untrusted
from orchestrator.archiving import archive
from orchestrator.errors import InputRejected
from orchestrator.session import sessions
from tests.helpers import RecordingDispatcher

pytestmark = pytest.mark.redis

INTERNAL_ERROR = -32603
METHODS = sorted(_METHODS) + sorted(_NOTIFICATIONS)
ANSWER_TIMEOUT = 10.0
FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
COUNTS: dict[str, int] = {}


class Harness:
    """One event loop for the run, a fresh connection per input."""

    def __init__(self, store: Any, redis_url: str) -> None:
        self.store, self.redis_url = store, redis_url
        self.loop = asyncio.new_event_loop()
        cwd = f"/tmp/fleet-fuzz/{uuid.uuid4().hex}"
        self.active = sessions.create_session(store, cwd).session_id
        self.archived = sessions.create_session(store, cwd).session_id
        archive.archive(store, RecordingDispatcher(), self.archived)

    def run(self, text: str, expect_id: Any = None) -> list[dict[str, Any]]:
        """Messages sent back for ``text``; with ``expect_id``, only once the answer with that
        id is among them (a session/prompt is otherwise not waited for: it may stay pending)."""
        return self.loop.run_until_complete(self._run(text, expect_id))

    async def _run(self, text: str, expect_id: Any = None) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            wire = encode_message(message)  # what a transport would write: must encode
            wire.encode("utf-8")
            sent.append(json.loads(wire))

        hub = shared_hub(self.redis_url, self.store.keys.events)
        conn = AcpConnection(send, self.store, RecordingDispatcher(), hub)
        try:
            # Past the handshake, so every method is reached (before it, each answers -32600).
            await conn.handle_text(
                '{"jsonrpc":"2.0","id":"fuzz-init","method":"initialize",'
                '"params":{"protocolVersion":1}}'
            )
            await _wait(lambda: any(m.get("id") == "fuzz-init" for m in sent), "initialize")
            sent.clear()
            await conn.handle_text(text)
            await _answered(sent, text)
            if expect_id is not None:
                await _wait(lambda: any(m.get("id") == expect_id for m in sent), repr(expect_id))
            # The connection is still usable.
            mark = len(sent)
            await conn.handle_text(
                '{"jsonrpc":"2.0","id":"fuzz-check","method":"initialize",'
                '"params":{"protocolVersion":1}}'
            )
            await _wait(lambda: any(m.get("id") == "fuzz-check" for m in sent[mark:]), "initialize")
        finally:
            await conn.close()
        return sent

    def close(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


async def _wait(predicate: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + ANSWER_TIMEOUT
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no answer to {what} within {ANSWER_TIMEOUT}s")
        await asyncio.sleep(0.005)


def _good_id(value: Any) -> bool:
    return value is None or (isinstance(value, (str, int)) and not isinstance(value, bool))


async def _answered(sent: list[dict[str, Any]], text: str) -> None:
    """A request with a usable id gets an answer with that id (a prompt may stay pending).
    An oversized message is refused unread, so its answer carries a null id."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE:
        return
    try:
        msg = untrusted.loads(text)
    except (ValueError, InputRejected):
        return  # answered at once (-32700, -32600 or -32602); see test_fuzz_hostile_json
    if not (
        isinstance(msg, dict)
        and msg.get("jsonrpc") == "2.0"
        and isinstance(msg.get("method"), str)
        and "id" in msg
        and _good_id(msg["id"])
        and msg["method"] in _METHODS
    ):
        return
    if msg["method"] == "session/prompt":
        return
    rid = msg["id"]
    await _wait(
        lambda: any("id" in m and m["id"] == rid and type(m["id"]) is type(rid) for m in sent),
        f"{msg['method']} (id {rid!r})",
    )


def _check_messages(sent: list[dict[str, Any]], text: str) -> None:
    for m in sent:
        assert m.get("jsonrpc") == "2.0", (m, text[:200])
        assert not ("result" in m and "error" in m), m
        if "error" in m:
            err = m["error"]
            assert isinstance(err, dict), m
            assert isinstance(err.get("code"), int), m
            assert err["code"] != INTERNAL_ERROR, (m, text[:500])
            assert isinstance(err.get("message"), str) and err["message"].strip(), m
            assert err["message"] != "Internal Server Error", m


@pytest.fixture(scope="module")
def harness(store: Any, redis_url: str) -> Iterator[Harness]:
    h = Harness(store, redis_url)
    yield h
    h.close()
    report = ", ".join(f"{k}: {v}" for k, v in sorted(COUNTS.items()))
    print(f"\nACP fuzz inputs per target: {report}")


# -- strategies ------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
ids = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.text(max_size=20),
    st.none(),
    json_values,
)
probe_ids = st.sampled_from(
    [
        "a:b",
        "*",
        "sess_x\n",
        "../",
        "x" * 65,
        "x" * 5000,
        "séance",
        "\ud800",
        "",
        "sess_000000000000000000000000",
        "idx:all",
        "fleet:session:*",
    ]
)


@st.composite
def session_ids(draw: st.DrawFn, harness: Harness) -> Any:
    return draw(
        st.one_of(st.sampled_from([harness.active, harness.archived]), probe_ids, json_values)
    )


def params_for(harness: Harness) -> st.SearchStrategy[Any]:
    text_blocks = st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=50)}),
            st.fixed_dictionaries(
                {"type": st.sampled_from(["image", "resource_link", "audio", ""])},
                optional={"uri": json_values, "text": json_values},
            ),
            json_values,
        ),
        max_size=3,
    )
    shaped = st.fixed_dictionaries(
        {},
        optional={
            "sessionId": session_ids(harness),
            "cwd": st.one_of(st.just("/tmp/fleet-fuzz/x"), st.text(max_size=30), json_values),
            "mcpServers": st.one_of(st.just([]), json_values),
            "protocolVersion": st.one_of(st.integers(), json_values),
            "cursor": st.one_of(st.text(max_size=40), json_values),
            "archived": st.one_of(st.sampled_from(["exclude", "include", "only"]), json_values),
            "title": st.one_of(st.text(max_size=60), json_values),
            "prompt": st.one_of(text_blocks, json_values),
            "requestId": ids,
        },
    )
    return st.one_of(shaped, json_values)


def rpc_objects(harness: Harness) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"jsonrpc": st.one_of(st.just("2.0"), st.just("2.0"), json_values)},
        optional={
            "id": ids,
            "method": st.one_of(st.sampled_from(METHODS), st.text(max_size=20), json_values),
            "params": params_for(harness),
            "result": json_values,
        },
    )


def _deep(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    # A well-formed request whose params nest deeply.
    return (
        '{"jsonrpc":"2.0","id":1,"method":"session/set_title","params":{"sessionId":"x",'
        '"title":' + "[" * depth + "]" * depth + "}}"
    )


def _dump(value: Any) -> str:
    return json.dumps(value)


#: JSON text a client can send that Python's parser alone chokes on or lets through harmful:
#: integers past CPython's 4,300-digit limit (a bare ValueError), long or non-finite numbers,
#: nesting past the parse limit (and past the recursion limit), lone surrogates (strings and
#: keys that cannot be encoded as UTF-8).
hostile_fragments = st.one_of(
    st.integers(4_300, 20_000).map(lambda n: "9" * n),
    st.integers(101, 4_299).map(lambda n: "-" + "1" * n),
    st.sampled_from(["1e400", "-1e400", "1" + "0" * 400 + ".5", "NaN", "Infinity", "-Infinity"]),
    st.integers(65, 3_000).map(lambda d: "[" * d + "]" * d),
    st.integers(65, 3_000).map(lambda d: '{"a":' * d + "1" + "}" * d),
    st.sampled_from(['"\\ud800"', '"a\\udfffb"', '{"\\ud800": 1}', '["\\udc00"]']),
)
#: Stands for a fragment in JSON text built by json.dumps, then replaced by it.
HOLE = "HOSTILE-FRAGMENT-HOLE"


def hostile_cursor(fragment: str, whole: bool) -> str:
    """A ``session/list`` cursor (URL-safe base64 of JSON) carrying ``fragment``: as the whole
    document, or as its score inside an otherwise well-formed cursor."""
    inner = fragment if whole else '{"a":"exclude","c":null,"s":' + fragment + ',"i":"x"}'
    return base64.urlsafe_b64encode(inner.encode("utf-8", "surrogatepass")).decode().rstrip("=")


# -- tests -----------------------------------------------------------------------------------


def _one(harness: Harness, target: str, text: str) -> None:
    COUNTS[target] = COUNTS.get(target, 0) + 1
    sent = harness.run(text)
    _check_messages(sent, text)


def test_fuzz_jsonrpc_shaped(harness: Harness) -> None:
    @FUZZ
    @given(msg=rpc_objects(harness))
    def run(msg: dict[str, Any]) -> None:
        _one(harness, "jsonrpc-shaped", _dump(msg))

    run()


def test_fuzz_arbitrary_json(harness: Harness) -> None:
    @settings(FUZZ, max_examples=100)
    @given(value=json_values)
    def run(value: Any) -> None:
        _one(harness, "arbitrary-json", _dump(value))

    run()


def test_fuzz_text_lines(harness: Harness) -> None:
    @settings(FUZZ, max_examples=100)
    @given(text=st.text(max_size=200))
    def run(text: str) -> None:
        _one(harness, "text", text)

    run()


def test_fuzz_deep_nesting(harness: Harness) -> None:
    @settings(FUZZ, max_examples=30)
    @given(
        depth=st.one_of(st.integers(1, 3000), st.integers(3000, 200_000)),
        kind=st.sampled_from(["list", "object", "params"]),
    )
    def run(depth: int, kind: str) -> None:
        text = _deep(depth, kind)
        if len(text) > MAX_MESSAGE:
            text = text[:MAX_MESSAGE]
        _one(harness, "deep-nesting", text)

    run()


def test_fuzz_hostile_json(harness: Harness) -> None:
    """JSON over a parse limit in a param or a cursor answers -32602 with the request's id; in
    the id, -32600; past the parser's own nesting, -32700. Lone surrogates are answered by each
    method. Never -32603, and the connection goes on."""

    @settings(FUZZ, max_examples=150)
    @given(
        fragment=hostile_fragments,
        where=st.sampled_from(["param", "cursor", "whole-cursor", "id", "message"]),
        method=st.sampled_from(sorted(_METHODS)),
        rid=st.integers(1, 2**31),
    )
    def run(fragment: str, where: str, method: str, rid: int) -> None:
        params: dict[str, Any] = {"sessionId": harness.active, "mcpServers": []}
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        if where == "param":
            params["title"] = HOLE
        elif where in ("cursor", "whole-cursor"):
            msg["method"] = "session/list"
            params["cursor"] = hostile_cursor(fragment, where == "whole-cursor")
        elif where == "id":
            msg["id"] = HOLE
        text = fragment if where == "message" else _dump(msg).replace(f'"{HOLE}"', fragment)
        COUNTS["hostile-json"] = COUNTS.get("hostile-json", 0) + 1
        sent = harness.run(text)
        _check_messages(sent, text)
        errors = [m for m in sent if "error" in m and m.get("id") != "fuzz-check"]
        # Nested past the parser's own recursion limit, a message cannot be read far enough
        # to find its id: -32700 with a null id, as JSON-RPC has it for parse errors.
        beyond_parser = where == "param" and fragment.startswith(("[[", '{"a":{"a":'))
        if "\\u" in fragment:
            return  # a lone surrogate is valid JSON: each method answers it (_check_messages)
        if beyond_parser and errors and errors[0]["id"] is None:
            assert errors[0]["id"] is None and errors[0]["error"]["code"] == -32700, errors[0]
        elif where in ("param", "cursor", "whole-cursor"):
            answer = next((m for m in errors if m.get("id") == rid), None)
            assert answer is not None, (where, sent[:3], text[:200])
            assert answer["error"]["code"] == -32602, answer
            # A cursor past its length cap is merely not a cursor.
            if len(params.get("cursor", "")) <= 8192:
                assert answer["error"]["data"]["limit"] in ("depth", "number"), answer
        elif where == "id" and not fragment.startswith(('"', "[", "{")):
            assert errors and errors[0]["id"] is None, sent[:3]
            assert errors[0]["error"]["code"] in (-32600, -32700), errors[0]

    run()


def test_oversized_message_is_refused_clearly(harness: Harness) -> None:
    text = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"' + "a" * MAX_MESSAGE
    text += '"}}'
    sent = harness.run(text)
    _check_messages(sent, text)
    err = sent[0]["error"]
    assert err["code"] == -32600 and str(MAX_MESSAGE) in err["message"], err


def test_the_message_limit_counts_utf8_bytes_as_a_websocket_frame_arrives_decoded(
    harness: Harness,
) -> None:
    # Given a text message of fewer characters than MAX_MESSAGE but more bytes (3 each)
    euros = "\u20ac" * (MAX_MESSAGE // 3 + 1)
    text = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"' + euros + '"}}'
    assert len(text) < MAX_MESSAGE < len(text.encode())
    # Then it is refused as a stdio line of the same bytes would be
    err = harness.run(text)[0]["error"]
    assert err["code"] == -32600 and f"larger than {MAX_MESSAGE} bytes" in err["message"], err
