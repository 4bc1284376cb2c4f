"""Tokens never reach a log: a real API process (``fleet api``, and uvicorn started on the app
factory with its own logging) is sent its token on every surface (REST ``Authorization``
header, ``?token=`` on ``GET /events`` and on ``/acp``), wrong tokens too, and a credential in
an ``access_token`` parameter; everything the process wrote (stdout and stderr, the access log
included) is then read, and no token is in it, while the requests themselves are."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from orchestrator.logs import REDACTED, RedactSecrets, redact
from tests.api_process import api_process

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("command", ["fleet api", "uvicorn"])
def test_a_token_sent_on_every_surface_never_reaches_the_log(tmp_path: Path, command: str) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    wrong = f"wrong-{uuid.uuid4().hex}"
    other = f"other-{uuid.uuid4().hex}"
    log_path = tmp_path / "api.log"
    # Given a real API process with a token, logging at INFO (access log on)
    with api_process(log_path, command, FLEET_API_TOKEN=token, FLEET_LOG_FORMAT="json") as api:
        # When the token is sent as a header, as ?token= on /events and on /acp, and wrong
        # tokens and an access_token are sent the same ways
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{api.base}/sessions", headers=auth).status_code == 200
        assert (
            httpx.get(
                f"{api.base}/sessions", headers={"Authorization": f"Bearer {wrong}"}
            ).status_code
            == 401
        )
        # (not a parameter /sessions takes: refused 422, and still logged redacted)
        assert (
            httpx.get(f"{api.base}/sessions?access_token={other}", headers=auth).status_code == 422
        )
        with httpx.stream("GET", f"{api.base}/events?token={token}", timeout=10) as stream:
            assert stream.status_code == 200
            next(stream.iter_text())  # ": connected"
        assert httpx.get(f"{api.base}/events?token={wrong}").status_code == 401
        with connect(f"ws://127.0.0.1:{api.port}/acp?token={token}", open_timeout=10) as ws:
            ws.send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}')
            assert '"protocolVersion"' in ws.recv(timeout=10)
        with (
            pytest.raises((InvalidStatus, ConnectionClosed)),  # refused: 4401 before accept
            connect(f"ws://127.0.0.1:{api.port}/acp?token={wrong}", open_timeout=10) as ws,
        ):
            ws.recv(timeout=10)
        api.stop()
        text = api.log()
    # Then the access log has the requests, and no token, wrong or right, is anywhere in it
    assert "/events?token=" + REDACTED in text, text[-3000:]
    assert "/acp?token=" + REDACTED in text, text[-3000:]
    assert "access_token=" + REDACTED in text, text[-3000:]
    for secret in (token, wrong, other):
        assert secret not in text, f"{secret} in the log:\n{text[-3000:]}"


def test_redact_knows_the_credential_shapes() -> None:
    cases = {
        "GET /events?token=abc&sessionId=s": f"GET /events?token={REDACTED}&sessionId=s",
        "/acp?access_token=abc": f"/acp?access_token={REDACTED}",
        "Authorization: Bearer abc.def": f"Authorization: Bearer {REDACTED}",
        "'authorization': 'xyz'": f"'authorization': '{REDACTED}'",
        "Basic dXNlcjpwYXNzd29yZA==": f"Basic {REDACTED}",
        "redis://:pw@host:6379/0": f"redis://:{REDACTED}@host:6379/0",
        "rediss://user:pw@host/0": f"rediss://user:{REDACTED}@host/0",
        "redis://host:6379/0 and basic auth": "redis://host:6379/0 and basic auth",
    }
    for text, expected in cases.items():
        assert redact(text) == expected, text


def test_the_filter_redacts_arguments_and_tracebacks() -> None:
    record = logging.LogRecord(
        "t", logging.ERROR, __file__, 1, "%s - %s", ("GET", "/x?token=s3"), None
    )
    try:
        raise ConnectionError("Error connecting to redis://:s3cret@host:6379")
    except ConnectionError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactSecrets().filter(record)
    assert record.args == ("GET", f"/x?token={REDACTED}")  # uvicorn's formatter reads args
    assert "s3cret" not in (record.exc_text or "") and REDACTED in (record.exc_text or "")
