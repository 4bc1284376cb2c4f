"""Parsing ``sentinel://`` URLs and choosing the broker transport for them."""

from __future__ import annotations

import pytest
import redis
from redis._parsers.base import BaseParser

from orchestrator.settings import FleetSettings
from orchestrator.storage.redisconn import (
    TRANSIENT_REPLIES,
    NoReplicasError,
    SentinelOptions,
    SilenceProbe,
    is_sentinel,
    parse_sentinel_url,
)
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
    settings = FleetSettings(redis_url=url, redis_sentinel_master="fm", redis_sentinel_auth="pw")
    options = sentinel_transport_options(url, settings)
    assert options["master_name"] == "fm"
    assert options["sentinel_kwargs"]["password"] == "pw"
    assert sentinel_transport_options("redis://h:6379/0", settings) == {}
    assert SentinelOptions.from_settings(settings).master == "fm"


@pytest.mark.parametrize(
    ("auth", "user", "password"),
    [("", "", ""), ("pw", "", "pw"), ("u:pw", "u", "pw"), (":p:w", "", "p:w")],
)
def test_the_sentinel_credentials_are_one_setting(auth: str, user: str, password: str) -> None:
    given = FleetSettings(redis_url="sentinel://h1:26379", redis_sentinel_auth=auth)
    options = SentinelOptions.from_settings(given)
    assert (options.username, options.password) == (user, password)


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


def test_a_noreplicas_reply_is_a_typed_transient_error() -> None:
    error = BaseParser.parse_error("NOREPLICAS Not enough good replicas to write.")
    assert isinstance(error, NoReplicasError)
    assert isinstance(error, redis.ResponseError)
    assert NoReplicasError in TRANSIENT_REPLIES


def test_a_silent_subscription_is_pinged_then_counted_lost() -> None:
    now = [0.0]
    probe = SilenceProbe(after=5.0, wait=5.0, clock=lambda: now[0])
    # Nothing heard for 5 s: no PING yet; past 5 s: one PING, and no second while it waits
    now[0] = 5.0
    assert probe.step(heard=False) is False
    now[0] = 5.1
    assert probe.step(heard=False) is True
    now[0] = 9.0
    assert probe.step(heard=False) is False
    # Its answer (anything read) starts the count again
    assert probe.step(heard=True) is False
    now[0] = 14.0
    assert probe.step(heard=False) is False
    now[0] = 14.2
    assert probe.step(heard=False) is True
    # A PING unanswered for 5 s more: the connection counts as lost
    now[0] = 19.3
    with pytest.raises(redis.TimeoutError):
        probe.step(heard=False)
