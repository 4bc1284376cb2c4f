"""The ``openai`` model's stop while it is still connecting: a listener whose accept queue is
full drops the SYN of a new connection, so ``connect`` hangs (for minutes: the client's
timeout); a stop must end the request at once all the same, whether ``cancel`` is the step's
``Cancel`` (its hook shuts the socket down) or a plain ``Event`` (polled)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.models.model import Cancel, StepAnswer, StepRequest, StopReason
from orchestrator.models.openai_model import OpenAIModel
from tests.helpers import wait_for

pytestmark = pytest.mark.unit

SYN_SENT = "02"


def _connecting_to(port: int) -> int:
    """How many sockets of this host are sending a SYN to ``port`` on loopback."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2].endswith(f":{port:04X}") and fields[3] == SYN_SENT:
            count += 1
    return count


@pytest.fixture
def full_listener() -> Iterator[int]:
    """The port of a loopback listener that never accepts, its queue filled."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = [socket.socket() for _ in range(2)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        wait_for(lambda: _connecting_to(port) >= 1, 5, message="the queue to be full")
        try:
            yield port
        finally:
            for filler in fillers:
                filler.close()


@pytest.mark.parametrize("kind", [Cancel, threading.Event])
def test_a_stop_ends_a_request_still_connecting(full_listener: int, kind: type) -> None:
    # Given a step whose request is connecting to a server that never answers the SYN
    model = OpenAIModel(base_url=f"http://127.0.0.1:{full_listener}/v1", model="m", timeout=600)
    request = StepRequest("sess_x", "turn_x", 0, [], [])
    cancel = kind()
    answers: list[StepAnswer] = []
    before = _connecting_to(full_listener)
    stepping = threading.Thread(target=lambda: answers.append(model.step(request, cancel, print)))
    stepping.start()
    wait_for(lambda: _connecting_to(full_listener) > before, 10, message="the connect")

    # When the step is stopped
    stopped = time.monotonic()
    cancel.set()

    # Then the request ends at once, cancelled, and its socket is gone
    stepping.join(2.0)
    assert not stepping.is_alive(), "the request still connects"
    assert time.monotonic() - stopped < 2.0
    assert [a.stop for a in answers] == [StopReason.CANCELLED]
    wait_for(lambda: _connecting_to(full_listener) == before, 5, message="the socket to go")
