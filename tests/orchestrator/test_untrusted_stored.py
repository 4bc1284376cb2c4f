"""``untrusted.stored``: stored JSON read back without recursing out of stack, its over-deep
parts cut, the rest (strings full of brackets and escaped quotes included) as it was."""

from __future__ import annotations

import json

import pytest

from orchestrator import untrusted

pytestmark = pytest.mark.unit

DEPTH = untrusted.STORED_MAX_DEPTH


def test_a_value_within_the_depth_comes_back_whole() -> None:
    value = {
        "text": '[{"quoted \\" [ and { inside"}]' * 200,
        "deep": json.loads("[" * 99 + "]" * 99),
    }
    assert untrusted.stored(json.dumps(value)) == value


@pytest.mark.parametrize("depth", [DEPTH + 1, 1_000, 200_000])
def test_parts_nested_deeper_are_cut_and_their_siblings_kept(depth: int) -> None:
    raw = '{"a": "]]}}[[", "deep": ' + "[" * depth + "]" * depth + ', "after": ["x]"]}'

    value = untrusted.stored(raw)

    assert value["a"] == "]]}}[[" and value["after"] == ["x]"]
    node = value["deep"]
    for _ in range(DEPTH - 2):
        [node] = node
    assert node == [untrusted.CUT]


def test_text_that_is_not_json_raises_value_error() -> None:
    with pytest.raises(ValueError):
        untrusted.stored("[" * 500 + "not json")
