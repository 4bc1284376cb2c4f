"""Task messages rendered from templates learned from what Celery itself writes.

Building a message with Celery (``app.amqp.create_task_message``, ``send_task_message``, the
``task-sent`` event, kombu's envelope and its JSON) costs far more CPU than the few fields that
change from one message of a (task, queue) pair to the next. So the first message of a pair is
built and published by Celery, and the Redis commands it turns into (an ``LPUSH`` of the
message, a ``PUBLISH`` of its event) are recorded on the way out (``workers.broker``). A
``Template`` is learned from them: the written JSON with the varying fields cut out as slots.

A template is used only if rendering the first message again from it, with that message's
values, reproduces the recorded commands byte for byte; otherwise the pair stays with Celery
for the life of the process. What a later message fills in:

* the task id (``headers.id``, ``headers.root_id``, ``properties.correlation_id``, the
  event's ``uuid`` and ``root_id``);
* the body (the arguments encoded with kombu's ``json`` serializer, then base64 as kombu's
  Redis channel writes it) and the arguments' repr (``headers.argsrepr``, the event's
  ``args``), see ``args_repr``;
* ``properties.reply_to`` (Celery's per-thread id), each envelope's ``delivery_tag``;
* the event's ``clock``, ``timestamp`` and ``utcoffset``.

Everything else (task name, queue, origin, host name, pid, the empty keyword arguments, the
options) is the same for every message of a pair sent from outside a task by one process, and
stays literal. A forked child has another pid: templates are dropped in the child
(``os.register_at_fork``) and learned again.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from celery.utils.saferepr import saferepr
from kombu.serialization import dumps as serialize

#: A Redis command as kombu's publish batch buffers it: (command name, its arguments).
Command = tuple[str, tuple[Any, ...]]

#: A JSON string literal, as ``json.dumps`` writes it with ``ensure_ascii`` (kombu's way).
json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii

#: Where the varying fields sit in a task message (path -> slot name).
MESSAGE_SLOTS: dict[tuple[str, ...], str] = {
    ("body",): "body",
    ("headers", "id"): "id",
    ("headers", "root_id"): "id",
    ("headers", "argsrepr"): "argsrepr",
    ("properties", "correlation_id"): "id",
    ("properties", "reply_to"): "reply_to",
    ("properties", "delivery_tag"): "tag",
}
#: ... in the envelope of its ``task-sent`` event.
EVENT_SLOTS: dict[tuple[str, ...], str] = {
    ("body",): "body",
    ("properties", "delivery_tag"): "tag",
}
#: ... in the event itself (the envelope's body).
EVENT_BODY_SLOTS: dict[tuple[str, ...], str] = {
    ("utcoffset",): "utcoffset",
    ("clock",): "clock",
    ("uuid",): "id",
    ("root_id",): "id",
    ("args",): "argsrepr",
    ("timestamp",): "timestamp",
}

_ELIDED: dict[type, str] = {list: "[...]", tuple: "(...)", dict: "{...}"}
_SCALARS = (str, int, float, bool, type(None))


def args_repr(value: Any, maxlen: int | None, maxlevels: int) -> str:
    """``celery.utils.saferepr.saferepr(value, maxlen, maxlevels)``, the text Celery puts in
    ``argsrepr``. Values made only of ``str``, ``int``, ``float``, ``bool``, ``None``,
    ``list``, ``tuple`` and ``dict`` (scalar keys) whose text is shorter than ``maxlen`` are
    written directly (the same text, several times faster); anything else is given to
    ``saferepr``."""
    text = plain_repr(value, maxlevels)
    # Shorter than the budget: saferepr truncated nothing.
    if text is not None and (maxlen is None or len(text) < maxlen):
        return text
    return str(saferepr(value, maxlen, maxlevels))


def plain_repr(value: Any, maxlevels: int) -> str | None:
    """``saferepr(value, None, maxlevels)`` for a plain value (``args_repr``), else ``None``."""
    out: list[str] = []
    return "".join(out) if _plain(value, 0, maxlevels, out) else None


def _plain(value: Any, level: int, maxlevels: int, out: list[str]) -> bool:
    """Append saferepr's text of ``value`` to ``out``; False if ``value`` is not plain."""
    kind = type(value)
    if kind is str:
        # saferepr quotes a string as it is, escaping only the quote (not repr's escapes).
        out.append("'" + value.replace("'", "\\'") + "'")
    elif kind is int or kind is float or kind is bool:
        out.append(str(value))
    elif value is None:
        out.append("None")
    elif kind is list or kind is tuple or kind is dict:
        if maxlevels and level >= maxlevels:
            out.append("(...,)" if kind is tuple and len(value) == 1 else _ELIDED[kind])
            return True
        return _container(value, kind, level, maxlevels, out)
    else:
        return False
    return True


def _container(value: Any, kind: type, level: int, maxlevels: int, out: list[str]) -> bool:
    if kind is dict:
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(", ")
            if type(key) not in _SCALARS or not _plain(key, 0, maxlevels, out):
                return False
            out.append(": ")
            if not _plain(item, level + 1, maxlevels, out):
                return False
        out.append("}")
        return True
    out.append("[" if kind is list else "(")
    for i, item in enumerate(value):
        if i:
            out.append(", ")
        if not _plain(item, level + 1, maxlevels, out):
            return False
    out.append("]" if kind is list else (",)" if len(value) == 1 else ")"))
    return True


class Pattern:
    """A JSON text with named slots: ``render`` puts in each slot the JSON text given for its
    name."""

    __slots__ = ("_format", "names")

    def __init__(self, pieces: list[str], names: list[str]) -> None:
        #: The slot names in order of appearance (a name may appear more than once).
        self.names = tuple(names)
        self._format = "%s".join(piece.replace("%", "%%") for piece in pieces)

    @classmethod
    def learn(cls, value: Mapping[str, Any], slots: Mapping[tuple[str, ...], str]) -> Pattern:
        """The pattern of ``kombu``'s JSON text of ``value`` with the fields at ``slots``'
        paths cut out. Raises ``ValueError`` when a path is missing or its marker shows up
        anywhere else."""
        token = uuid.uuid4().hex
        marked = json.loads(json.dumps(value))  # a copy to mark
        for path, name in slots.items():
            holder = marked
            for step in path[:-1]:
                holder = holder[step]
            if path[-1] not in holder:
                raise ValueError(f"no field {'.'.join(path)}")
            holder[path[-1]] = f"{token}:{name}"
        text = str(serialize(marked, serializer="json")[2])
        # Every marker opens with the token (quote included); its name runs to the next quote.
        head, *rest = text.split(json_str(f"{token}:")[:-1])
        pieces, names, known = [head], [], set(slots.values())
        for piece in rest:
            name, quote, tail = piece.partition('"')
            if not quote or name not in known:
                raise ValueError("a slot marker appears where no slot is")
            names.append(name)
            pieces.append(tail)
        if len(names) != len(slots):
            raise ValueError("a slot marker appears where no slot is")
        return cls(pieces, names)

    def render(self, values: Mapping[str, str]) -> str:
        """The text with each slot filled with ``values[name]`` (JSON text)."""
        return self._format % tuple([values[name] for name in self.names])


class Template:
    """The commands of one (task, queue) pair's message and ``task-sent`` event, as patterns.

    ``commands`` renders them for one message; the learned literals hold everything that does
    not vary (module docstring)."""

    __slots__ = ("key", "topic", "message", "event", "event_body", "embed", "_reprs")

    def __init__(
        self,
        key: str,
        topic: str,
        patterns: tuple[Pattern, Pattern, Pattern],
        embed: Any,
        reprs: Callable[[Any], str],
    ) -> None:
        self.key, self.topic, self.embed, self._reprs = key, topic, embed, reprs
        self.message, self.event, self.event_body = patterns

    def commands(
        self,
        task_id: str,
        args: Any,
        reply_to: str,
        tags: tuple[str, str],
        clock: int,
        timestamp: float,
        utcoffset: float,
    ) -> list[Command]:
        """The ``LPUSH`` of the message and the ``PUBLISH`` of its event (``tags``: their
        delivery tags; ``timestamp`` in seconds since the epoch, ``utcoffset`` in hours).
        Raises ``TypeError`` for ``args`` that are not a list or tuple, as Celery does."""
        args = args or ()  # as Celery's message: no arguments are written ``()``
        if not isinstance(args, list | tuple):
            raise TypeError("task args must be a list or tuple")
        payload = serialize((args, {}, self.embed), serializer="json")[2]
        ident, argsrepr = json_str(task_id), json_str(self._reprs(args))
        event = self.event_body.render(
            {
                "id": ident,
                "argsrepr": argsrepr,
                "clock": repr(clock),
                "timestamp": repr(timestamp),
                "utcoffset": repr(utcoffset),
            }
        )
        message = self.message.render(
            {
                "body": _b64(payload),
                "id": ident,
                "argsrepr": argsrepr,
                "reply_to": json_str(reply_to),
                "tag": json_str(tags[0]),
            }
        )
        envelope = self.event.render({"body": _b64(event), "tag": json_str(tags[1])})
        return [("lpush", (self.key, message)), ("publish", (self.topic, envelope))]


def _b64(text: str | bytes) -> str:
    """A body as kombu's Redis channel writes it: UTF-8, then base64, as a JSON string."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return '"' + base64.b64encode(data).decode("ascii") + '"'


def learn(
    recorded: list[list[Command]],
    task_id: str,
    args: Any,
    reply_to: str,
    reprs: Callable[[Any], str],
) -> Template | None:
    """The template of the message Celery published as ``recorded`` (the commands of the
    message, then of its event), or ``None`` when rendering it back from the template does
    not give the recorded commands byte for byte (or they are not one ``LPUSH`` and one
    ``PUBLISH``)."""
    try:
        [[(push, (key, raw))], [(pub, (topic, raw_event))]] = recorded
        if (push, pub) != ("lpush", "publish"):
            return None
        message, envelope = json.loads(raw), json.loads(raw_event)
        body = json.loads(base64.b64decode(message["body"]))
        event = json.loads(base64.b64decode(envelope["body"]))
        template = Template(
            key,
            topic,
            (
                Pattern.learn(message, MESSAGE_SLOTS),
                Pattern.learn(envelope, EVENT_SLOTS),
                Pattern.learn(event, EVENT_BODY_SLOTS),
            ),
            body[2],
            reprs,
        )
        again = template.commands(
            task_id,
            args,
            reply_to,
            (message["properties"]["delivery_tag"], envelope["properties"]["delivery_tag"]),
            event["clock"],
            event["timestamp"],
            event["utcoffset"],
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return template if again == [("lpush", (key, raw)), ("publish", (topic, raw_event))] else None


class Templates:
    """The templates of one sender, per (task, queue): a ``Template``, or ``None`` for a pair
    refused for good. Emptied in a forked child."""

    def __init__(self) -> None:
        self._by_pair: dict[tuple[str, str], Template | None] = {}
        _LIVE.add(self)

    def known(self, pair: tuple[str, str]) -> bool:
        """Whether ``pair`` was learned or refused already."""
        return pair in self._by_pair

    def get(self, pair: tuple[str, str]) -> Template | None:
        """The template of ``pair``; ``None`` when unknown or refused."""
        return self._by_pair.get(pair)

    def put(self, pair: tuple[str, str], template: Template | None) -> None:
        """Record ``pair``'s template, or ``None`` to leave the pair with Celery."""
        self._by_pair[pair] = template

    def clear(self) -> None:
        """Forget every template (they name this process's pid)."""
        self._by_pair.clear()


_LIVE: weakref.WeakSet[Templates] = weakref.WeakSet()


def _drop_in_child() -> None:
    for templates in list(_LIVE):
        templates.clear()


os.register_at_fork(after_in_child=_drop_in_child)
