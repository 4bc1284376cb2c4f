"""Without a token the API serves loopback only, and says so."""

from __future__ import annotations

import pytest

from api.cli import api_bind_address

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_without_a_token_the_api_binds_to_loopback_and_says_so(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert api_bind_address(host, "") == "127.0.0.1"
    assert "FLEET_API_TOKEN is not set" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_needs_no_token(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert api_bind_address(host, "") == host
    assert capsys.readouterr().err == ""


def test_with_a_token_the_requested_address_is_kept() -> None:
    assert api_bind_address("0.0.0.0", "s3cret") == "0.0.0.0"
