"""Benchmark 7: the fleet's overhead per model step.

The same streamed chat-completion request, against the same local OpenAI-compatible server
(``tests/openai_server.py`` replaying a short answer), sent two ways: straight through the
``openai`` SDK, and as a whole model step of a one-step turn (``steps.run_step`` with the
``openai`` model: the gate and step start, the conversation read, the streamed chunks recorded
and published, usage and metrics, the turn's end). Printed: both medians and their ratio.
Beside them: from an archive's answer (its commit) to the server seeing the connection close
(the server's own clock), for a step whose answer the server holds open after its first
words, and for one whose server stalls before it sends any header.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import NullDispatcher, Row, configure, ms

ANSWER = "A short answer, streamed in a few pieces by the fixture server."


def _direct(client: Any, prompt: str) -> float:
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model="bench",
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        stream_options={"include_usage": True},
    )
    for _ in stream:
        pass
    return time.perf_counter() - t0


def bench_model_step(url: str, prefix: str, n: int) -> list[Row]:
    """``n`` requests each way (alternating, after 10 warm-up requests)."""
    import openai

    from orchestrator.models.openai_model import OpenAIModel
    from orchestrator.session.sessions import create_session
    from orchestrator.turn import steps, tools, turns
    from tests.openai_server import serve

    store, _ = configure(url, prefix)
    null = NullDispatcher()
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = Path(tmp) / "fixtures"
        fixtures.mkdir()
        reply = {"replies": [{"text": ANSWER, "usage": [20, 12]}]}
        (fixtures / "bench.json").write_text(json.dumps(reply))
        (fixtures / "hold.json").write_text(json.dumps({"replies": [{"hold": "thinking"}]}))
        (fixtures / "stall.json").write_text(json.dumps({"replies": [{"stall": "headers"}]}))
        with serve(fixtures, Path(tmp) / "requests.jsonl") as served:
            client = openai.OpenAI(base_url=served.base_url, api_key="bench", max_retries=0)
            model = OpenAIModel(base_url=served.base_url, api_key="bench", model="bench")

            def fleet_step(prompt: str) -> float:
                sid = create_session(store, tmp).session_id
                tid = turns.start_turn(store, null, sid, prompt)
                t0 = time.perf_counter()
                outcome = steps.run_step(store, null, model, tools.run_tool, sid, tid, 0)
                took = time.perf_counter() - t0
                assert outcome == "completed", outcome
                return took

            prompt = "Answer briefly."
            for _ in range(10):
                _direct(client, prompt)
                fleet_step(prompt)
            direct, fleet = [], []
            for _ in range(n):
                direct.append(_direct(client, prompt))
                fleet.append(fleet_step(prompt))
            held = OpenAIModel(base_url=served.base_url, api_key="bench", model="hold")
            stalled = OpenAIModel(base_url=served.base_url, api_key="bench", model="stall")
            runs = max(5, n // 10)
            closes = [_stop_to_close(store, held, served, tmp) for _ in range(runs)]
            stalls = [_stop_to_close(store, stalled, served, tmp) for _ in range(runs)]
            # The held steps' watch and the gate's closure feed end on their own within a
            # second; stopping Redis before that would log a lost subscription.
            _until(lambda: not any(t.name in _SHARED_THREADS for t in threading.enumerate()))
    d, f = statistics.median(direct), statistics.median(fleet)
    return [
        (
            "10 model step: one streamed request straight through the SDK",
            f"n={n}",
            f"median {ms(d)}",
            "floor",
        ),
        (
            "10 model step through the fleet (gate, stores, events, usage)",
            f"n={n}",
            f"median {ms(f)}",
            f"ratio {f / d:.2f} (overhead {ms(f - d)} per step)",
        ),
        (
            "10 archive answered -> the server sees the held stream close",
            f"n={len(closes)}",
            f"median {ms(statistics.median(closes))}, max {ms(max(closes))}",
            "<= 50 ms (the step's stop poll)",
        ),
        (
            "10 archive answered -> the server sees a request stalled before its headers close",
            f"n={len(stalls)}",
            f"median {ms(statistics.median(stalls))}, max {ms(max(stalls))}",
            "at once (the request's socket is shut at any point)",
        ),
    ]


#: The threads one store's step watches and closure listeners share
# (orchestrator/storage/sharing.py).
_SHARED_THREADS = ("step-watch", "gate-feed")


def _stop_to_close(store: Any, model: Any, served: Any, cwd: str) -> float:
    """Seconds from an archive's answer to the server logging the held stream closed."""
    from orchestrator.archiving.archive import archive
    from orchestrator.session.sessions import create_session
    from orchestrator.turn import steps, tools, turns

    null = NullDispatcher()
    sid = create_session(store, cwd).session_id
    prompt = f"{model.model} {sid}"
    tid = turns.start_turn(store, null, sid, prompt)
    args = (store, null, model, tools.run_tool, sid, tid, 0)
    runner = threading.Thread(target=steps.run_step, args=args)
    runner.start()
    if model.model == "hold":
        _until(lambda: store.redis.llen(store.keys.history(sid)) >= 2)  # the first words landed
    else:
        _until(lambda: served.records(prompt=prompt))  # the server holds the request
    archive(store, null, sid, stop_activity=True)
    archived = time.time()
    _until(lambda: served.records("closed", prompt))
    runner.join(10)
    return float(served.records("closed", prompt)[0]["at"]) - archived


def _until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark 10: condition not reached")
        time.sleep(0.001)
