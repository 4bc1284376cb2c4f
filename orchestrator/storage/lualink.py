"""A script's source: its body after only the prelude definitions it reaches.

Every Lua script of the store runs after a prelude: the key builders ``K``
(``keys.lua_prelude``), the shared rules (``luarules.lua_rules``), ``storage/_lib.lua`` and
the families' liveness rules. Redis runs a script's whole source on every call, so a
definition costs each call whether the script uses it or not: the whole prelude ahead of
``return 1`` took 20.3 us of the server's time per call against 3.4 us for ``return 1`` alone
(``EVALSHA``, ``INFO commandstats``, Redis 7.0), the time of a dozen simple commands.
``link`` keeps the definitions the body reaches, directly or through other definitions, in
their own order, and drops the rest.

What the prelude may hold, one top-level statement at a time (a statement starts at column 0;
the comment lines just before it belong to it):

- a definition: ``local function name(...)``, ``local name = ...`` or ``K.name = ...``; it is
  reached when its name is (``K.name`` by ``K.name``);
- a registration: a top-level call ``fn(...)`` that defines nothing (``family('turn', {...})``).
  It is kept whenever a table ``fn`` fills (``TABLE[...] = ...`` in ``fn``'s body) is
  reached, so everything iterating ``FAMILIES`` sees every family.

Names are found by their spelling, outside comments: a name that only appears inside a string
is kept too (harmless: a definition more), and nothing is ever left out that the text uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY = re.compile(r"\bK\.([A-Za-z_][A-Za-z0-9_]*)")
_FUNCTION = re.compile(r"local\s+function\s+([A-Za-z_][A-Za-z0-9_]*)")
_LOCALS = re.compile(r"local\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*=")
_KEY_DEF = re.compile(r"K\.([A-Za-z_][A-Za-z0-9_]*)\s*=")
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_FILLS = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\[[^\]]*\]\s*=(?!=)")


@dataclass(frozen=True)
class Statement:
    """One top-level statement of the prelude: its ``text`` (with the comment lines before
    it), the names it ``defines`` (``K.name`` for a key builder), the names it ``uses``
    outside comments, and for a registration the function it ``calls``."""

    text: str
    defines: frozenset[str]
    uses: frozenset[str]
    #: For a registration: the function it calls.
    calls: str | None


def _code(text: str) -> str:
    """``text`` without its ``--`` comments; a ``--`` inside a quoted string is kept. Raises
    ``ValueError`` for a long bracket (``[[``, ``[=[``: long strings and block comments),
    which the scripts do not use and this does not read."""
    if re.search(r"\[=*\[", text):
        raise ValueError("a long bracket ([[ or [=[) in a script: not supported by lualink")
    return "\n".join(_line_code(line) for line in text.splitlines())


def _line_code(line: str) -> str:
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1  # the escaped character
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif line.startswith("--", i):
            return line[:i]
        i += 1
    return line


def _uses(text: str) -> set[str]:
    """The names ``text`` refers to: identifiers, and ``K.name`` for each key builder."""
    code = _code(text)
    return set(_NAME.findall(code)) | {f"K.{m}" for m in _KEY.findall(code)}


def _statement(text: str) -> Statement:
    code = _code(text).strip()
    head = code.splitlines()[0] if code else ""
    defines: set[str] = set()
    calls = None
    if m := _FUNCTION.match(head):
        defines.add(m.group(1))
    elif m := _LOCALS.match(head):
        defines.update(n.strip() for n in m.group(1).split(","))
    elif m := _KEY_DEF.match(head):
        defines.add(f"K.{m.group(1)}")
    elif m := _CALL.match(head):
        calls = m.group(1)
    elif head:
        raise ValueError(f"a prelude statement neither defines nor registers: {head!r}")
    return Statement(text, frozenset(defines), frozenset(_uses(text) - defines), calls)


def statements(prelude: str) -> list[Statement]:
    """The top-level statements of ``prelude``, in order, each with the comment and blank lines
    just before it."""
    out: list[list[str]] = [[]]
    for line in prelude.splitlines(keepends=True):
        starts = bool(line[:1]) and not line[:1].isspace() and not line.startswith("--")
        if starts and not line.startswith(("end", "}", ")")):
            current = out[-1]
            lead = len(current)  # the comment and blank lines at its end move to the new one
            while lead and (not current[lead - 1].strip() or current[lead - 1].startswith("--")):
                lead -= 1
            out.append(current[lead:])
            del current[lead:]
        out[-1].append(line)
    head = "".join(out[0])
    if _code(head).strip():
        raise ValueError(f"the prelude starts with an indented line: {head[:80]!r}")
    return [_statement("".join(lines)) for lines in out[1:]]


def link(prelude: list[Statement], body: str) -> str:
    """The source of a script: the statements of ``prelude`` that ``body`` reaches, in their
    order, then ``body``."""
    by_name: dict[str, list[int]] = {}
    for i, st in enumerate(prelude):
        for name in st.defines:
            by_name.setdefault(name, []).append(i)
    # A registration is reached with any table its function fills.
    fills: dict[str, set[str]] = {}
    for st in prelude:
        for name in st.defines:
            fills[name] = set(_FILLS.findall(_code(st.text)))
    registers: dict[str, list[int]] = {}
    for i, st in enumerate(prelude):
        if st.calls is not None:
            for table in fills.get(st.calls, ()):
                registers.setdefault(table, []).append(i)
    kept: set[int] = set()
    pending = list(_uses(body))
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for i in by_name.get(name, []) + registers.get(name, []):
            if i not in kept:
                kept.add(i)
                pending.extend(prelude[i].uses)
                calls = prelude[i].calls
                if calls is not None:
                    pending.append(calls)
    return "".join(prelude[i].text for i in sorted(kept)) + "\n" + body
