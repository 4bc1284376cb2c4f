"""Benchmark 7: the fleet's overhead per model step.

The same streamed chat-completion request, against the same local OpenAI-compatible server
(``tests/openai_server.py`` replaying a short answer), sent two ways: straight through the
``openai`` SDK, and as a whole model step of a one-step turn (``steps.run_step`` with the
``openai`` model: the gate and step start, the conversation read, the streamed chunks recorded
and published, usage and metrics, the turn's end). Printed: both medians and their ratio.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import NullDispatcher, Row, configure, ms

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

    from orchestrator import steps, tools, turns
    from orchestrator.openai_model import OpenAIModel
    from orchestrator.sessions import create_session
    from tests.openai_server import serve

    store, _ = configure(url, prefix)
    null = NullDispatcher()
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = Path(tmp) / "fixtures"
        fixtures.mkdir()
        reply = {"replies": [{"text": ANSWER, "usage": [20, 12]}]}
        (fixtures / "bench.json").write_text(json.dumps(reply))
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
    d, f = statistics.median(direct), statistics.median(fleet)
    return [
        (
            "7 model step: one streamed request straight through the SDK",
            f"n={n}",
            f"median {ms(d)}",
            "floor",
        ),
        (
            "7 model step through the fleet (gate, stores, events, usage)",
            f"n={n}",
            f"median {ms(f)}",
            f"ratio {f / d:.2f} (overhead {ms(f - d)} per step)",
        ),
    ]
