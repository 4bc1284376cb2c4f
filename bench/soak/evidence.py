"""What the store holds after a soak, read once: turns, model requests, lineages, reminders,
conversation tool results, the audit stream and the archive metric."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from orchestrator.storage.keys import Keys

_STORED = re.compile(r"stored reminder (rem_[0-9a-f]+)")
_NOT_FIRED = re.compile(r"reminder (rem_[0-9a-f]+) not fired")
_METRIC = re.compile(r'^fleet_archives_total\{outcome="archived"\}\s+([0-9.eE+]+)$', re.M)


def epoch_ms(value: Any) -> float | None:
    """A record time as epoch ms: an ISO 8601 string (``...Z``), or a number of ms (or of
    s, if small) as a store script using ``TIME`` might write it."""
    if isinstance(value, int | float):
        return float(value) * (1000 if value < 1e11 else 1)
    if isinstance(value, str):
        try:
            return float(value) * (1000 if float(value) < 1e11 else 1)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000
        except ValueError:
            return None
    return None


@dataclass
class Evidence:
    """The store's side of the story, keyed by id."""

    turns: dict[str, dict[str, str]] = field(default_factory=dict)
    #: session id -> [(turn id, step, at in epoch ms)]
    requests: dict[str, list[tuple[str, int, float]]] = field(default_factory=dict)
    lineages: dict[str, list[str]] = field(default_factory=dict)
    reminders: dict[str, dict[str, str]] = field(default_factory=dict)
    #: reminder ids a tool result says were stored
    stored_reminders: set[str] = field(default_factory=set)
    #: reminder ids a reminder worker logged as not fired (refused)
    refused_reminders: set[str] = field(default_factory=set)
    #: audit entries (fleet-wide stream), decoded
    audit: list[dict[str, str]] = field(default_factory=list)
    archived_metric: int | None = None
    metric_source: str = ""


def _scan(client: redis.Redis, pattern: str) -> Iterator[str]:
    yield from client.scan_iter(match=pattern, count=2000)


def _hashes(client: redis.Redis, keys: list[str]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for start in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 1000]:
            pipe.hgetall(key)
        out.extend(pipe.execute())
    return out


def _lists(client: redis.Redis, keys: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    for start in range(0, len(keys), 500):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 500]:
            pipe.lrange(key, 0, -1)
        out.extend(pipe.execute())
    return out


def gather(url: str, prefix: str, logs: dict[str, Path], api: str, token: str) -> Evidence:
    """Read everything the checks need from the soak's Redis, the worker logs and the API."""
    import json

    k = Keys(prefix)
    # Any: redis-py types replies as unions over bytes/str; decode_responses makes them str.
    client: Any = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
    ev = Evidence()
    try:
        # Reminders before turns: a reminder fires by creating its turn in the same script,
        # and turns are never deleted, so one read fired here has its turn in the read below
        # (read the other way round, one firing in between would look lost).
        keys = list(_scan(client, f"{prefix}reminder:rem_*"))
        for h in _hashes(client, keys):
            if h.get("reminderId"):
                ev.reminders[h["reminderId"]] = h
        keys = [key for key in _scan(client, f"{prefix}turn:turn_*")]
        for h in _hashes(client, keys):
            if h.get("turnId"):
                ev.turns[h["turnId"]] = h
        keys = list(_scan(client, f"{prefix}modelreq:*"))
        for key, rows in zip(keys, _lists(client, keys), strict=True):
            sid = key[len(f"{prefix}modelreq:") :]
            for row in rows:
                rec = json.loads(row)
                at = epoch_ms(rec.get("at"))
                if at is not None:
                    ev.requests.setdefault(sid, []).append(
                        (str(rec.get("turnId", "")), int(rec.get("step", -1)), at)
                    )
        sids = sorted(ev.requests)
        for sid, line in zip(sids, _lists(client, [k.lineage(s) for s in sids]), strict=True):
            ev.lineages[sid] = line
        keys = list(_scan(client, f"{prefix}history:*"))
        for rows in _lists(client, keys):
            for row in rows:
                if "stored reminder" in row:
                    ev.stored_reminders.update(_STORED.findall(row))
        last = "-"
        while True:
            page: list[Any] = client.xrange(k.audit_all, min=last, max="+", count=5000)
            if last != "-":
                page = page[1:]
            if not page:
                break
            ev.audit.extend(fields for _, fields in page)
            last = page[-1][0]
        ev.archived_metric, ev.metric_source = _archived_metric(client, k, api, token)
    finally:
        client.close()
    for name, path in logs.items():
        if name.startswith("reminder@"):
            with contextlib.suppress(OSError):
                ev.refused_reminders.update(_NOT_FIRED.findall(path.read_text(errors="replace")))
    return ev


def _archived_metric(client: redis.Redis, k: Keys, api: str, token: str) -> tuple[int | None, str]:
    """``fleet_archives_total{outcome="archived"}`` as ``GET /metrics`` shows it; the metric's
    hash in Redis if the API does not answer."""
    try:
        r = httpx.get(api + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        if r.status_code == 200:
            found = _METRIC.search(r.text)
            return (int(float(found.group(1))) if found else 0), "GET /metrics"
    except httpx.HTTPError:
        pass
    raw = client.hget(k.metric("fleet_archives"), "archived")
    return int(raw or 0), "Redis hash (the API did not answer)"
