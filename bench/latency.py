"""How soon an ACP prompt is settled once the client stops it: ``session/cancel`` and
``session/close`` of a session whose prompt is in a 30 s model request, measured from the
client's message to the prompt's response, over a real ``fleet acp`` process and a real turn
worker.

    python -m bench.latency            # 10 of each
    python -m bench.latency -n 3       # a smoke run

The event of the stopped turn settles the prompt; the ACP server's safety poll (every 2 s)
only covers a lost event, so figures near 2 s mean the event path was missed. The tests check
that a stop settles the prompt ``cancelled`` (tests/api/test_acp_stdio.py); this prints how
soon. Redis: ``--redis-url`` (a fresh key prefix, removed after) or a private embedded server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import environment, pct


class Client:
    """A JSON-RPC peer over a ``fleet acp`` process's stdio (one request at a time, plus
    one prompt in flight)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "acp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.next_id = 0

    def send(self, method: str, params: dict[str, Any], *, notify: bool = False) -> int:
        self.next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            msg["id"] = self.next_id
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def until(self, predicate: Any) -> dict[str, Any]:
        """Read messages until one matches ``predicate``; return it."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("fleet acp exited")
            msg: dict[str, Any] = json.loads(line)
            if predicate(msg):
                return msg

    def call(self, method: str, params: dict[str, Any]) -> Any:
        rid = self.send(method, params)
        return self.until(lambda m: m.get("id") == rid and "method" not in m).get("result")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def _update_kind(msg: dict[str, Any]) -> Any:
    return msg.get("params", {}).get("update", {}).get("sessionUpdate")


def stop_latency(client: Client, how: str) -> float:
    """Seconds from the stop (``cancel`` or ``close``) to the prompt's response."""
    sid = client.call("session/new", {"cwd": "/tmp/bench-latency", "mcpServers": []})["sessionId"]
    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "think 30"}]}
    rid = client.send("session/prompt", prompt)
    client.until(lambda m: _update_kind(m) == "user_message_chunk")
    time.sleep(0.5)  # let the step begin (a benchmark's pacing, not a test's wait)
    started = time.perf_counter()
    if how == "cancel":
        client.send("session/cancel", {"sessionId": sid}, notify=True)
    else:
        client.send("session/close", {"sessionId": sid})
    reply = client.until(lambda m: m.get("id") == rid and "method" not in m)
    took = time.perf_counter() - started
    assert reply["result"] == {"stopReason": "cancelled"}, reply
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=10, help="stops of each kind")
    parser.add_argument("--redis-url", default=None, help="use this Redis (fresh prefix)")
    args = parser.parse_args()
    from localfleet.fleet import LocalFleet
    from orchestrator.families import Family

    with environment(args.redis_url) as (url, prefix):
        env = dict(os.environ, FLEET_REDIS_URL=url, FLEET_KEY_PREFIX=prefix)
        state = Path(tempfile.mkdtemp(prefix="fleet-bench-latency-"))
        with LocalFleet(url, prefix, state, hostname="bench") as fleet:
            fleet.start([Family.TURN])
            fleet.wait_ready(90)
            client = Client(env)
            try:
                client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                for how in ("cancel", "close"):
                    figures = [stop_latency(client, how) for _ in range(args.n)]
                    print(
                        f"session/{how:6} -> prompt settled: median "
                        f"{statistics.median(figures) * 1000:.0f} ms, p99 "
                        f"{pct(figures, 0.99) * 1000:.0f} ms, max {max(figures) * 1000:.0f} ms "
                        f"(n={len(figures)})"
                    )
            finally:
                client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
