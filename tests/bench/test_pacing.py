"""The paced (open-loop) client of benchmark 8: its arrival schedule, latency counted from each
request's scheduled time, the saturation stop rule, and the rows it prints.

The server here is a tiny local HTTP/1.1 server (the standard library's, keep-alive) that
answers one request at a time after a fixed service time, so a queue builds when requests
arrive faster than that; nothing needs Redis or the API.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.pacing import Paced, climb, paced_rows, run_paced, schedule, sustainable

pytestmark = pytest.mark.unit

SERVICE = 0.05  # seconds the fake server takes per request


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, service: float, status: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.service, self.status = service, status
        self.serial = threading.Lock()  # one request served at a time
        self.paths: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.serial:
            self.server.paths.append(self.path)
            time.sleep(self.server.service)  # the service time being modelled
        body = b"{}"
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def _serve(service: float, status: int = 200) -> Iterator[tuple[str, _Server]]:
    server = _Server(service, status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def slow() -> Iterator[tuple[str, _Server]]:
    yield from _serve(SERVICE)


def _run(rate: float, achieved: float, p99: float) -> Paced:
    # 100 latencies: the 99th (nearest rank) and the 100th are p99, the median half of it.
    return Paced(offered=rate, achieved=achieved, latencies=[p99 / 2] * 98 + [p99] * 2)


def test_the_schedule_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    assert schedule(300, 2.0, seed=7) == schedule(300, 2.0, seed=7)
    assert schedule(300, 2.0, seed=7) != schedule(300, 2.0, seed=8)


def test_the_schedule_offers_the_rate_with_poisson_gaps() -> None:
    # Given a long schedule at 500 a second
    arrivals = schedule(500, 20.0, seed=1)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    # Then it holds rate x duration arrivals, in order, within the duration
    assert len(arrivals) == 10_000
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0 and arrivals[-1] < 20.0
    # and its gaps average 1/rate, spread as exponential ones are (standard deviation equal
    # to the mean), not evenly
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 500, rel=0.02)
    assert statistics.pstdev(gaps) == pytest.approx(mean, rel=0.05)


def test_latency_runs_from_the_scheduled_time_so_waiting_for_a_connection_counts(
    slow: tuple[str, _Server],
) -> None:
    # Given five requests all due at once and one connection to a server taking 50 ms each
    base, server = slow
    targets = [f"/r/{i}" for i in range(5)]
    # When they are paced
    run = run_paced(base, targets, [0.0] * 5, 0.01, b"{}", connections=1)
    # Then each waited for those before it: the k-th answered is at least k+1 services late,
    # though each took one service once sent
    for k, latency in enumerate(sorted(run.latencies)):
        assert latency >= (k + 1) * SERVICE * 0.99, run.latencies
    assert sorted(server.paths) == targets


def test_a_server_slower_than_the_schedule_achieves_less_than_offered(
    slow: tuple[str, _Server],
) -> None:
    # Given 100 a second offered for 0.1 s to a server that answers 20 a second
    arrivals = schedule(100, 0.1)
    run = run_paced(slow[0], ["/r"] * len(arrivals), arrivals, 0.1, b"{}", connections=4)
    # Then the run lasts until the last answer and counts as saturated
    assert run.offered == pytest.approx(100)
    assert run.achieved <= 1 / SERVICE
    assert run.saturated


def test_an_answer_other_than_200_fails_the_run() -> None:
    for base, _ in _serve(0.0, status=409):
        with pytest.raises(RuntimeError, match="2 of 2 failed"):
            run_paced(base, ["/a", "/b"], [0.0, 0.0], 0.01, b"{}", connections=2)


def test_climbing_stops_after_the_first_rate_achieved_below_90_percent() -> None:
    # Given a server that keeps up to 300 a second and then falls behind
    achieved = {100: 100.0, 200: 199.0, 300: 271.0, 400: 320.0, 500: 330.0}
    tried: list[float] = []

    def measure(rate: float) -> Paced:
        tried.append(rate)
        return _run(rate, achieved[int(rate)], 0.005)

    # When the rates are climbed
    runs = climb([100, 200, 300, 400, 500], measure)
    # Then 300 (270 would be 90%: 271 is not below) is kept, 400 saturates and 500 is not tried
    assert tried == [100, 200, 300, 400]
    assert [r.saturated for r in runs] == [False, False, False, True]


def test_the_sustainable_rate_is_the_highest_unsaturated_one_with_p99_within_20_ms() -> None:
    runs = [_run(100, 100, 0.004), _run(200, 200, 0.019), _run(300, 300, 0.03)]
    assert sustainable(runs) is runs[1]
    assert sustainable([_run(100, 80, 0.004)]) is None


def test_the_rows_give_achieved_rate_median_p99_per_rate_and_the_sustainable_rate() -> None:
    runs = [_run(100, 100, 0.004), _run(200, 150, 0.9)]
    runs[0].cpu, runs[0].busy = 0.004, 41.0
    rows = paced_rows("archive, 2 API processes", runs, 2.0, "goal: MISSED")
    assert rows[0] == (
        "8 paced, archive, 2 API processes, 100/s offered",
        "n=100 in 2 s",
        "achieved 100/s, median 2.000 ms, p99 4.000 ms",
        "machine 41% busy; API CPU 4.000 ms per request (250/s per core)",
    )
    assert rows[1][2] == "achieved 150/s, median 450.000 ms, p99 900.000 ms"
    assert rows[1][3].endswith("saturated (achieved < 90% of offered)")
    assert rows[2] == (
        "8 paced, archive, 2 API processes: sustainable rate at p99 <= 20 ms",
        "",
        "100/s",
        "goal: MISSED",
    )
