"""Parsing ``sentinel://`` URLs (issue 15) and choosing the broker transport for them."""

from __future__ import annotations

import pytest

from orchestrator.redisconn import SentinelOptions, is_sentinel, parse_sentinel_url
from orchestrator.settings import FleetSettings
from workers.app import broker_transport, sentinel_transport_options


def test_several_sentinels_with_the_primarys_credentials_and_db() -> None:
    url = "sentinel://:s%40cret@h1:26380/2;sentinel://h2;sentinel://h3:26381"
    found = parse_sentinel_url(url)
    assert found.sentinels == [("h1", 26380), ("h2", 26379), ("h3", 26381)]
    assert found.node_kwargs() == {"db": 2, "password": "s@cret"}


@pytest.mark.parametrize(
    "url", ["sentinel://", "redis://h:6379;sentinel://h2", "sentinel://h:port", "sentinel://h/x"]
)
def test_malformed_sentinel_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse_sentinel_url(url)


def test_broker_transport_and_options_follow_the_url() -> None:
    url = "sentinel://h1:26379;sentinel://h2:26379"
    assert is_sentinel(url) and not is_sentinel("redis://h:6379/0")
    assert broker_transport(url) == "workers.broker:SentinelTransport"
    assert broker_transport("redis://h:6379/0") == "workers.broker:Transport"
    settings = FleetSettings(
        redis_url=url, redis_sentinel_master="fm", redis_sentinel_password="pw"
    )
    options = sentinel_transport_options(url, settings)
    assert options["master_name"] == "fm"
    assert options["sentinel_kwargs"]["password"] == "pw"
    assert sentinel_transport_options("redis://h:6379/0", settings) == {}
    assert SentinelOptions.from_settings(settings).master == "fm"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sentinel://h1:26379;sentinel://h2:port", "port that is not a number"),
        ("memcached://h:11211", "must start with redis://, rediss://, unix:// or sentinel://"),
    ],
)
def test_commands_refuse_a_malformed_url_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, url: str, message: str
) -> None:
    from api.context import redis_url
    from orchestrator.errors import InvalidParams
    from orchestrator.settings import get_settings

    monkeypatch.setenv("FLEET_REDIS_URL", url)
    get_settings.cache_clear()
    try:
        with pytest.raises(InvalidParams, match=message):
            redis_url(discover=False)
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def test_a_sentinel_url_is_accepted_by_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    from api.context import redis_url
    from orchestrator.settings import get_settings

    url = "sentinel://h1:26379;sentinel://h2:26379"
    monkeypatch.setenv("FLEET_REDIS_URL", url)
    get_settings.cache_clear()
    try:
        assert redis_url(discover=False) == url
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
