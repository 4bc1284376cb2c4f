"""JSON from clients, parsed within limits: the one parser every surface uses for what a
client sends (REST bodies, JSON-RPC messages on stdio and on the ``/acp`` WebSocket, and the
JSON inside listing cursors).

Python's ``json.loads`` alone lets a client crash the caller: nesting a few thousand levels
deep raises ``RecursionError``, an integer of more than 4,300 digits raises a bare
``ValueError`` (CPython's int-from-string digit limit), ``1e400`` becomes ``inf``, and the
literals ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON: RFC 8259 has no such numbers)
become floats. ``loads`` turns each of these into one ``InputRejected`` error
(``orchestrator.errors``; HTTP 400, JSON-RPC -32602) that names the limit, its value and
where it was exceeded:

- ``MAX_DEPTH`` (64) levels of arrays and objects;
- ``MAX_NUMBER_CHARS`` (100) characters in one number literal, and finite numbers only
  (``NaN`` and ``Infinity`` are refused as ``1e400`` is).

An object giving one key more than once (``{"dryRun": false, "dryRun": true}``) raises
``DuplicateKey`` (HTTP 422 ``invalid_params``, JSON-RPC -32602 or -32600) naming the key and
where: ``json.loads`` would keep the last value without a word, and act on what the sender
may not have meant. (Checked by an ``object_pairs_hook``: about 1 us more for a small body,
nothing measurable for one large object, under 1 us per object for many small ones.)

Lone surrogates (``"\\ud800"``) are valid JSON and pass ``loads``: JSON-RPC methods refuse
them where they would be stored (-32602); the HTTP API refuses any in a body at once (422,
through ``lone_surrogate``), since its answers echo what was sent.

Invalid JSON raises ``json.JSONDecodeError`` as ``json.loads`` does.

A model's output is untrusted too: a tool call's arguments are parsed by ``loads`` (with the
depth ``model.TOOL_JSON_MAX_DEPTH``), and what the fleet stored before it bounded them, or
stored from any other source, is read back by ``stored``, which cuts what is nested deeper than
``STORED_MAX_DEPTH`` (a read of a conversation never fails on what a model once sent).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable
from typing import Any

from orchestrator.errors import DuplicateKey, InputRejected

log = logging.getLogger(__name__)

#: Deepest nesting of arrays and objects accepted (the top-level value is depth 1).
MAX_DEPTH = 64
#: Longest number literal accepted, in characters (sign, digits, point and exponent).
MAX_NUMBER_CHARS = 100
#: Deepest nesting ``stored`` keeps of a stored value (an update's envelope and a tool call's
#: arguments of at most ``MAX_DEPTH`` levels fit); deeper parts are cut to ``CUT``.
STORED_MAX_DEPTH = 100
#: What ``stored`` puts in place of a part nested deeper than ``STORED_MAX_DEPTH``.
CUT = f"(cut: nested deeper than {STORED_MAX_DEPTH} levels)"


class _BadNumber:
    """Stands for a number literal over the limit or not finite, so parsing goes on to find
    the rest (and the walk after it, where it is)."""

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def problem(self) -> str:
        """What is wrong with the literal, and what to send instead."""
        literal = self.literal
        if len(literal) > MAX_NUMBER_CHARS:
            return (
                f"number {literal[:20]}... ({len(literal)} characters) is longer than "
                f"{MAX_NUMBER_CHARS} characters"
            )
        if literal.lstrip("-") in ("NaN", "Infinity"):
            why = "JSON has no NaN or Infinity"
        else:
            why = "out of range: the largest double is about 1.8e308"
        return f"{literal} is not finite ({why}); send a finite number"


def _path(parts: list[Any]) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _violation(value: Any, max_depth: int) -> tuple[str, list[Any], str] | None:
    """The first value breaking a limit, as (limit, path, detail); ``None`` when all is well.
    Walks iteratively, never below ``max_depth + 1`` levels."""
    stack: list[tuple[Any, list[Any], int]] = [(value, [], 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > max_depth:
                return "depth", path, f"nested deeper than {max_depth} levels"
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((child, [*path, key], depth + 1) for key, child in items)
        elif isinstance(node, _BadNumber):
            return "number", path, node.problem()
    return None


class _Repeated(dict[str, Any]):
    """An object in which ``key`` was given ``times`` times (its last value kept), so the walk
    after parsing can say where it is."""

    key: str = ""
    times: int = 0


def _marked(pairs: list[tuple[str, Any]], obj: dict[str, Any]) -> _Repeated:
    """``obj``, built from ``pairs`` in which a key comes more than once, as a ``_Repeated``."""
    seen: set[str] = set()
    key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
    marked = _Repeated(obj)
    marked.key, marked.times = key, sum(1 for k, _ in pairs if k == key)
    return marked


def _repeated(value: Any, param: str) -> DuplicateKey | None:
    """The error for the first ``_Repeated`` object in a parsed value (depth already
    checked), or ``None``."""
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Repeated):
            key, where = node.key[:80], _path([*path, node.key])[:200]
            times = "twice" if node.times == 2 else f"{node.times} times"
            message = f"{param} at {where}: key {key!r} was given {times}; give it once."
            return DuplicateKey(message, {"param": key, "path": where, "in": param}, value)
        if isinstance(node, (dict, list)):
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((child, [*path, k]) for k, child in reversed(list(items)))
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> str | None:
    """Where (``$.a[0]``) the first string or object key holding a lone surrogate is in a
    parsed value, or ``None``: such text cannot be encoded as UTF-8, so it can be neither
    stored nor echoed."""
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return _path(path)[:200]
        elif isinstance(node, (dict, list)):
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if isinstance(key, str) and _SURROGATE.search(key):
                    return _path(path)[:200]
                stack.append((child, [*path, key]))
    return None


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """What is wrong with ``data``, whose UTF-8 decoding raised ``exc``, in words a person can
    act on: ``"byte 0xff at offset 17 is not UTF-8 (invalid start byte)"``."""
    return f"byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8 ({exc.reason})"


def loads(text: str | bytes, *, param: str = "body", max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text`` (JSON sent by a client, named ``param`` in errors) within the module's
    limits (nesting: ``max_depth`` levels). Returns the value (no ``inf``, ``NaN`` or
    over-long numbers in it, no key given twice in an object). Raises ``InputRejected`` for a
    limit (a ``NaN``, ``Infinity`` or ``-Infinity`` literal included), ``DuplicateKey`` for a
    key given twice, ``json.JSONDecodeError`` for invalid JSON (bytes that are not UTF-8
    included)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise json.JSONDecodeError(f"not UTF-8 ({exc.reason})", "", exc.start) from None
    bad_numbers: list[str] = []
    repeated: list[_Repeated] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            obj = _marked(pairs, obj)
            repeated.append(obj)
        return obj

    def integer(literal: str) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            bad_numbers.append(literal)
            return _BadNumber(literal)
        return int(literal)

    def real(literal: str) -> Any:
        value = float(literal)
        if len(literal) > MAX_NUMBER_CHARS or not math.isfinite(value):
            bad_numbers.append(literal)
            return _BadNumber(literal)
        return value

    def constant(literal: str) -> Any:
        # NaN, Infinity, -Infinity: not JSON, but a number to the client that sent one (a
        # serializer's default for a float it holds), so refused as 1e400 is, with its path.
        bad_numbers.append(literal)
        return _BadNumber(literal)

    try:
        value = json.loads(
            text,
            parse_int=integer,
            parse_float=real,
            parse_constant=constant,
            object_pairs_hook=unique,
        )
    except RecursionError:
        raise InputRejected(
            f"{param}: JSON nested deeper than {max_depth} levels, the most accepted.",
            {"limit": "depth", "max": max_depth, "path": "$", "param": param},
        ) from None
    # The walk costs a Python step per value: skip it when nothing can be wrong (no bad
    # number, and too few brackets, strings' included, to nest past the limit).
    if not bad_numbers and text.count("[") + text.count("{") <= max_depth:
        found = None
    else:
        found = _violation(value, max_depth)
    if found is None:
        duplicate = _repeated(value, param) if repeated else None
        if duplicate is not None:
            raise duplicate
        return value
    limit, parts, detail = found
    data: dict[str, Any] = {"limit": limit, "param": param}
    data["max"] = max_depth if limit == "depth" else MAX_NUMBER_CHARS
    where = data["path"] = _path(parts)[:200]
    raise InputRejected(f"{param} at {where}: {detail}.", data, value)


#: A JSON string literal, or one bracket: what ``_clipped`` walks.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _clipped(text: str, max_depth: int) -> str:
    """``text`` (JSON) with each array or object nested deeper than ``max_depth`` replaced by
    the string ``CUT``; one regular-expression pass, no recursion."""
    pieces: list[str] = []
    depth, last, cut_at = 0, 0, -1
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            depth += 1
            if depth == max_depth + 1:
                cut_at = match.start()
        else:
            if depth == max_depth + 1 and cut_at >= 0:
                pieces += [text[last:cut_at], json.dumps(CUT)]
                last, cut_at = match.end(), -1
            depth -= 1
    pieces.append(text[last:])
    return "".join(pieces)


def stored(raw: str) -> Any:
    """Parse JSON the fleet stored (a conversation update): its parts nested deeper than
    ``STORED_MAX_DEPTH`` come back as ``CUT``, so no stored value can make its reader recurse
    out of stack. Raises ``ValueError`` when ``raw`` is not JSON."""
    if raw.count("[") + raw.count("{") > STORED_MAX_DEPTH:
        raw = _clipped(raw, STORED_MAX_DEPTH)
    return json.loads(raw)


def stored_updates(raws: Iterable[str]) -> list[dict[str, Any]]:
    """Stored ``session/update`` payloads parsed by ``stored``, oldest first; an item that is
    not a JSON object is skipped (logged)."""
    out: list[dict[str, Any]] = []
    for raw in raws:
        try:
            update = stored(raw)
        except ValueError:
            update = None
        if isinstance(update, dict):
            out.append(update)
        else:
            log.warning("unreadable conversation item skipped: %.80s", raw)
    return out
