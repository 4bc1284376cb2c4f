"""Client traffic over the HTTP API, and the log of every answer the client saw.

Threads (bounded by ``concurrency``) pick seeded random operations on a population of
sessions: create, prompt with a scripted instruction list, archive with and without
``stopActivity``, unarchive and bulk archive. Every call is logged with the wall clock
(``time.time()``, the machine clock the workers also stamp model requests with) at which it
was sent and answered, its status and, for archives, the outcome per session.

Each ``remind`` instruction carries a unique token (``say R<n>``) and each prompt (and each
subagent prompt inside it) has at most one, so a reminder's turn can be told apart from every
other; the checks rely on it.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

#: Operations and their weights.
OPS = {
    "prompt": 10,
    "archive_stop": 3,
    "archive": 2,
    "unarchive": 4,
    "bulk": 1,
    "create": 1,
    # prompt, then archive with stopActivity 0-0.5 s later: an archive racing live steps
    "race": 3,
    # archive with stopActivity, unarchive, prompt again: late stops meet new work
    "cycle": 1,
}
#: How often an operation picks a session it believes to be in the state it wants.
AIM = 0.8
CWD = "/soak"


@dataclass
class Call:
    """One HTTP request as the client saw it. ``status`` is ``None`` when no answer came
    (connection refused or reset, timeout); ``code`` is the error code of an error answer."""

    op: str
    sids: list[str]
    sent: float
    done: float
    status: int | None
    code: str = ""
    body: Any = None

    @property
    def answered(self) -> bool:
        return self.status is not None


@dataclass
class ClientLog:
    """Every call, in completion order (thread safe)."""

    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)


class Scripts:
    """Seeded scripted prompts (``orchestrator/models/model.py``); a unique token per reminder."""

    def __init__(self) -> None:
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()

    def token(self) -> str:
        with self._lock:
            return f"R{next(self._tokens)}"

    def line(self, rng: random.Random, allow: tuple[str, ...], remind: bool) -> str:
        kinds = [k for k in ("say", "think", "exec", "run", "spawn", "remind") if k in allow]
        weights = {"say": 4, "think": 3, "exec": 2, "run": 2, "spawn": 2, "remind": 2}
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        if kind == "remind" and not remind:
            kind = "say"
        if kind == "say":
            return "say hello"
        if kind == "think":
            return f"think {rng.choice((0.05, 0.2, 0.5, 1, 2))}"
        if kind == "exec":
            return f"exec {rng.choice((0.2, 0.5, 1.5))}"
        if kind == "run":
            return f"run {rng.choice((1, 2, 4))}"
        if kind == "remind":
            return f"remind {rng.choice((0.5, 1, 2, 4))} say {self.token()}"
        child = self.prompt(rng, ("say", "think", "remind"), lines=rng.randint(1, 2))
        return "spawn " + child.replace("\n", "|")

    def prompt(self, rng: random.Random, allow: tuple[str, ...], lines: int) -> str:
        out: list[str] = []
        for _ in range(lines):
            line = self.line(rng, allow, remind=not any(x.startswith("remind") for x in out))
            out.append(line)
        return "\n".join(out)

    def any(self, rng: random.Random) -> str:
        """A prompt for traffic: usually 1-4 instructions, sometimes 30 ``say`` lines (a
        long chain of steps keeps a turn between steps for a while)."""
        if rng.random() < 0.08:
            return "\n".join(["say hello"] * 30)
        every = ("say", "think", "exec", "run", "spawn", "remind")
        return self.prompt(rng, every, lines=rng.randint(1, 4))


class Traffic:
    """The client side of a soak: a session population and worker threads driving it."""

    def __init__(
        self, base_url: str, token: str, seed: int, sessions: int, concurrency: int
    ) -> None:
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.seed = seed
        self.population = sessions
        self.concurrency = concurrency
        self.log = ClientLog()
        self.scripts = Scripts()
        self.sessions: list[str] = []
        #: sessions the client believes archived (from the answers it got)
        self.archived: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ calls
    def call(
        self,
        client: httpx.Client,
        op: str,
        sids: list[str],
        method: str,
        path: str,
        body: Any = None,
    ) -> Call:
        """One request, logged. Never raises for a transport failure."""
        sent = time.time()
        try:
            r = client.request(method, path, json=body, headers=self.headers)
        except httpx.HTTPError:
            call = Call(op, sids, sent, time.time(), None)
        else:
            done = time.time()
            try:
                payload = r.json()
            except ValueError:
                payload = {"raw": r.text[:200]}
            code = ""
            if r.status_code >= 400 and isinstance(payload, dict):
                code = str((payload.get("error") or {}).get("code", ""))
            call = Call(op, sids, sent, done, r.status_code, code, payload)
        self.log.add(call)
        self._believe(call)
        return call

    def _believe(self, call: Call) -> None:
        """Track which sessions are archived, from the answers (a guide for aiming
        operations, never evidence)."""
        body = call.body if isinstance(call.body, dict) else {}
        with self._lock:
            if call.code in ("session_archived", "ancestor_archived"):
                self.archived.update(call.sids[:1])
            elif call.status == 200 and "results" in body:
                for item in body["results"]:
                    if item.get("outcome") in ("archived", "already_archived"):
                        self.archived.add(item["sessionId"])
            elif call.status == 200 and body.get("outcome") in ("archived", "already_archived"):
                self.archived.add(call.sids[0])
            elif call.status == 200 and body.get("archived") is False:
                self.archived.discard(call.sids[0])

    def pick(self, rng: random.Random, archived: bool) -> str:
        """A session, usually (``AIM``) one believed ``archived`` or not as asked."""
        with self._lock:
            pool = list(self.sessions)
            aimed = [s for s in pool if (s in self.archived) == archived]
        return rng.choice(aimed if aimed and rng.random() < AIM else pool)

    def create(self, client: httpx.Client, parent: str | None = None) -> str | None:
        body: dict[str, Any] = {"cwd": CWD}
        if parent:
            body["parentId"] = parent
        call = self.call(client, "create", [], "POST", "/sessions", body)
        if call.status == 201:
            sid = str(call.body["sessionId"])
            with self._lock:
                self.sessions.append(sid)
            return sid
        return None

    def archive(self, client: httpx.Client, op: str, sids: list[str], stop: bool) -> None:
        """Archive (bulk when several ids); an attempt with no answer or a 5xx is retried
        once, as an idempotent client would."""
        for _ in range(2):
            body: dict[str, Any] = {"stopActivity": stop}
            if len(sids) == 1:
                path = f"/sessions/{sids[0]}/archive"
            else:
                path, body["sessionIds"] = "/sessions/archive", sids
            call = self.call(client, op, sids, "POST", path, body)
            if call.status is not None and call.status < 500:
                return
            time.sleep(0.3)

    # ------------------------------------------------------------------ driving
    def setup(self, client: httpx.Client) -> None:
        """Create the population: ``sessions`` roots plus a child under every third."""
        roots = [self.create(client) for _ in range(self.population)]
        for sid in roots[::3]:
            if sid:
                self.create(client, parent=sid)

    def step(self, client: httpx.Client, rng: random.Random) -> None:
        """One random operation."""
        op = rng.choices(list(OPS), list(OPS.values()))[0]
        with self._lock:
            pool = list(self.sessions)
        if not pool:
            op = "create"
        if op == "create":
            parent = rng.choice(pool) if pool and rng.random() < 0.3 else None
            self.create(client, parent)
        elif op == "prompt":
            self.prompt(client, rng, self.pick(rng, archived=False))
        elif op in ("archive", "archive_stop"):
            self.archive(client, op, [self.pick(rng, archived=False)], op == "archive_stop")
        elif op == "unarchive":
            self.unarchive(client, self.pick(rng, archived=True))
        elif op == "race":
            sid = self.pick(rng, archived=False)
            self.prompt(client, rng, sid)
            time.sleep(rng.uniform(0, 0.5))
            self.archive(client, "archive_stop", [sid], True)
        elif op == "cycle":
            sid = self.pick(rng, archived=False)
            self.archive(client, "archive_stop", [sid], True)
            self.unarchive(client, sid)
            self.prompt(client, rng, sid)
        else:
            sids = list({self.pick(rng, archived=False) for _ in range(rng.randint(2, 8))})
            stop = rng.random() < 0.6
            self.archive(client, "bulk_stop" if stop else "bulk", sids, stop)

    def archive_busy(self, rng: random.Random) -> None:
        """Archive with ``stopActivity`` up to three sessions that were prompted lately and
        are believed active (the fault schedule calls it while the turn worker is frozen)."""
        with self._lock:
            recent = [c.sids[0] for c in self.log.calls[-200:] if c.op == "prompt"]
            busy = [s for s in dict.fromkeys(reversed(recent)) if s not in self.archived]
        with httpx.Client(base_url=self.base_url, timeout=10) as client:
            for sid in busy[: rng.randint(1, 3)]:
                self.archive(client, "archive_stop", [sid], True)

    def prompt(self, client: httpx.Client, rng: random.Random, sid: str) -> None:
        body = {"prompt": self.scripts.any(rng)}
        self.call(client, "prompt", [sid], "POST", f"/sessions/{sid}/prompt", body)

    def unarchive(self, client: httpx.Client, sid: str) -> None:
        self.call(client, "unarchive", [sid], "POST", f"/sessions/{sid}/unarchive")

    def run(self, until: float) -> None:
        """Drive traffic from ``concurrency`` threads until the monotonic time ``until``."""

        def worker(n: int) -> None:
            rng = random.Random(self.seed * 1000 + n)
            with httpx.Client(base_url=self.base_url, timeout=10) as client:
                while time.monotonic() < until:
                    self.step(client, rng)
                    time.sleep(rng.uniform(0, 0.05))

        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="soak-client") as pool:
            for f in [pool.submit(worker, n) for n in range(self.concurrency)]:
                f.result()
