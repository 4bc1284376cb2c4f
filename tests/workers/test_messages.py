"""``workers.messages``: the argument repr written directly, patterns, and when a template is
refused or dropped.

The repr is compared with Celery's ``saferepr`` on generated values; a template is learned
from a message Celery really published to Redis (through ``CeleryDispatcher``) and must give
it back byte for byte.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
from celery import Celery
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st

from workers import messages
from workers.dispatch import CeleryDispatcher

scalars = (
    st.text()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.none()
)
keys = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(keys, inner, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(value=plain, maxlevels=st.integers(min_value=0, max_value=4))
def test_a_plain_value_s_repr_is_saferepr_s_text(value: Any, maxlevels: int) -> None:
    direct = messages.plain_repr(value, maxlevels)
    assert direct is not None
    assert direct == saferepr(value, None, maxlevels=maxlevels)


@settings(max_examples=200, deadline=None)
@given(value=plain | st.sets(st.integers()) | st.binary(), maxlen=st.integers(1, 80))
def test_the_argument_repr_is_saferepr_s_whatever_the_length(value: Any, maxlen: int) -> None:
    """Too long to be sure saferepr truncated nothing, or not plain: saferepr's own text."""
    assert messages.args_repr(value, maxlen, 3) == saferepr(value, maxlen, maxlevels=3)


def test_values_that_are_not_plain_have_no_direct_repr() -> None:
    class Text(str):
        pass

    for value in ({1, 2}, b"x", Text("x"), [1, {"a": object()}], {(1, 2): 3}, math):
        assert messages.plain_repr(value, 3) is None


def test_a_pattern_fills_its_slots_and_keeps_percent_signs() -> None:
    pattern = messages.Pattern.learn(
        {"a": "x", "b": {"c": 1, "d": "100%"}, "e": "x"}, {("a",): "one", ("b", "c"): "two"}
    )
    assert pattern.names == ("one", "two")
    assert pattern.render({"one": '"y"', "two": "2"}) == (
        '{"a": "y", "b": {"c": 2, "d": "100%"}, "e": "x"}'
    )
    with pytest.raises(ValueError):
        messages.Pattern.learn({"a": 1}, {("b",): "one"})


def _first_message(app: Celery, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``learn`` was given for the first message Celery published for a pair."""
    seen: dict[str, Any] = {}
    real = messages.learn

    def learn(recorded: Any, task_id: str, args: Any, reply_to: str, reprs: Any) -> Any:
        seen.update(recorded=recorded, task_id=task_id, args=args, reply_to=reply_to)
        seen["reprs"] = reprs
        return real(recorded, task_id, args, reply_to, reprs)

    monkeypatch.setattr(messages, "learn", learn)
    assert CeleryDispatcher(app).send_many([("turn.stop", ["s-1", ["t-1"]], "turn.ctl")]) == [None]
    return seen


def test_a_template_renders_its_first_message_back_byte_for_byte(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first_message(app, monkeypatch)
    [[(_, (key, raw))], [(_, (topic, raw_event))]] = first["recorded"]
    template = messages.learn(**first)
    assert template is not None
    assert (template.key, template.topic) == (key, topic)


@pytest.mark.parametrize(
    "change",
    [
        lambda raw: raw.replace('"retries": 0', '"retries":  0'),  # spacing Celery did not use
        lambda raw: raw.replace('"lang": "py"', '"lang":"py"'),
        lambda raw: raw + " ",
    ],
)
def test_a_template_is_refused_when_it_does_not_render_its_first_message_back(
    app: Celery, monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    first = _first_message(app, monkeypatch)
    [[(push, (key, raw))], event] = first["recorded"]
    changed = change(raw)
    assert changed != raw
    first["recorded"] = [[(push, (key, changed))], event]
    assert messages.learn(**first) is None


def test_a_template_is_refused_when_its_repr_differs_from_celery_s(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first_message(app, monkeypatch)
    first["reprs"] = lambda args: f"{args!r} "
    assert messages.learn(**first) is None


def test_a_template_is_refused_for_other_commands_than_a_push_and_a_publish(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first_message(app, monkeypatch)
    [[push], [publish]] = first["recorded"]
    for recorded in ([[push], [publish, ("pexpire", ("q", 1))]], [[push]], [[publish], [push]]):
        assert messages.learn(**{**first, "recorded": recorded}) is None


def test_templates_are_dropped_in_a_forked_child() -> None:
    templates = messages.Templates()
    templates.put(("turn.stop", "turn.ctl"), None)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, b"1" if templates.known(("turn.stop", "turn.ctl")) else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"0"
    os.waitpid(pid, 0)
    assert templates.known(("turn.stop", "turn.ctl"))
