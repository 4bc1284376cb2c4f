"""Cross-site WebSocket hijacking and cross-site archive, tried from a real browser (Debian's
chromium through Playwright): a page served by a second loopback HTTP server (another port,
so another origin) opens ``ws://127.0.0.1:<api port>/acp`` and lists sessions, and POSTs an
archive with ``fetch`` (``no-cors``: a simple request the browser sends without asking). The
API (``fleet api``, a real process, no token: the loopback default) refuses both and nothing
is archived; with the page's origin in ``FLEET_API_ALLOWED_ORIGINS`` both work. DNS rebinding:
the browser resolves a foreign name to 127.0.0.1 (``--host-resolver-rules``, as a rebinding
DNS answer would), so a page of that name is the API's "own" origin to the browser; the API
refuses its requests by their ``Host``.

Skipped, with the reason, only when chromium or the ``playwright`` package cannot be had."""

from __future__ import annotations

import http.server
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api_process import api_process
from tests.console.test_console import CHROMIUM, CHROMIUM_ARGS, sync_api

# Checked here too: without it, a whole-suite run without chromium reported this module's
# tests as errors (the browser launch failed) instead of skipping them.
if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(
        f"no chromium at {CHROMIUM} (as root: apt-get install -y chromium; .ci/run does it)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.redis

PAGE = b"<!doctype html><title>another site</title><p>nothing to see</p>"
#: Run in the other site's page: what a hostile page would do with the API.
ATTACK = """async ([api, sid]) => {
  const ws = await new Promise((resolve) => {
    const seen = [];
    const sock = new WebSocket(api.replace("http://", "ws://") + "/acp");
    sock.onopen = () => {
      sock.send(JSON.stringify(
        {jsonrpc: "2.0", id: 0, method: "initialize", params: {protocolVersion: 1}}));
      sock.send(JSON.stringify({jsonrpc: "2.0", id: 1, method: "session/list", params: {}}));
    };
    sock.onmessage = (e) => {
      const m = JSON.parse(e.data);
      seen.push(m);
      if (m.id === 1) sock.close(1000);
    };
    sock.onclose = (e) => resolve({code: e.code, reason: e.reason, messages: seen});
    setTimeout(() => resolve({timeout: true, messages: seen}), 8000);
  });
  let archive;
  try {
    const r = await fetch(api + "/sessions/" + sid + "/archive", {method: "POST", mode: "no-cors"});
    archive = r.type;
  } catch (e) { archive = "error: " + e; }
  return {ws, archive};
}"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def other_site() -> Iterator[str]:
    """Another origin: an HTTP server on another loopback port serving a plain page."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, name="other-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Any) -> Iterator[Any]:
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    try:
        yield b
    finally:
        b.close()


def _attack(browser: Any, site: str, api: str, sid: str) -> dict[str, Any]:
    page = browser.new_page()
    try:
        page.goto(site + "/")
        result: dict[str, Any] = page.evaluate(ATTACK, [api, sid])
        return result
    finally:
        page.close()


def _session(api: str) -> str:
    resp = httpx.post(f"{api}/sessions", json={"cwd": f"/tmp/fleet-origin/{uuid.uuid4().hex}"})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["sessionId"])


def _archived(api: str, sid: str) -> bool:
    resp = httpx.get(f"{api}/sessions/{sid}")
    assert resp.status_code == 200, resp.text
    return bool(resp.json()["archived"])


def test_a_page_of_another_origin_can_neither_list_nor_archive(
    browser: Any, other_site: str, tmp_path: Path
) -> None:
    # Given the API with no token (the loopback default) and a quiet session
    with api_process(tmp_path / "api.log") as api:
        sid = _session(api.base)
        # When a page of another origin opens /acp and POSTs an archive
        result = _attack(browser, other_site, api.base, sid)
        # Then the socket is closed with 1008 before it lists anything, and nothing is archived
        assert result["ws"].get("code") == 1008, result
        assert "origin_forbidden" in result["ws"]["reason"], result
        assert result["ws"]["messages"] == [], result
        assert not _archived(api.base, sid), result


def test_a_page_of_an_allowed_origin_can_list_and_archive(
    browser: Any, other_site: str, tmp_path: Path
) -> None:
    # Given the API with the other site listed in FLEET_API_ALLOWED_ORIGINS
    with api_process(tmp_path / "api.log", FLEET_API_ALLOWED_ORIGINS=other_site) as api:
        sid = _session(api.base)
        # When the same page opens /acp and POSTs an archive
        result = _attack(browser, other_site, api.base, sid)
        # Then it lists the sessions and the session is archived
        answer = next(m for m in result["ws"]["messages"] if m["id"] == 1)
        assert sid in [s["sessionId"] for s in answer["result"]["sessions"]], result
        assert _archived(api.base, sid), result


@pytest.fixture(scope="module")
def rebinding_browser(playwright: Any) -> Iterator[Any]:
    """A browser whose resolver answers 127.0.0.1 for ``REBOUND``, as a rebinding DNS does."""
    rule = f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, rule])
    try:
        yield b
    finally:
        b.close()


REBOUND = "rebound.example"
#: Run in a page of the rebound name: same origin as the API's port, to the browser.
REBIND = """async ([sid]) => {
  const out = {};
  const list = await fetch("/sessions");
  out.list = [list.status, await list.text()];
  const made = await fetch("/sessions", {method: "POST",
    headers: {"Content-Type": "application/json"}, body: JSON.stringify({cwd: "/tmp/rebound"})});
  out.create = made.status;
  out.archive = (await fetch("/sessions/" + sid + "/archive", {method: "POST"})).status;
  out.ws = await new Promise((resolve) => {
    const seen = [];
    const sock = new WebSocket("ws://" + location.host + "/acp");
    sock.onopen = () => sock.send(JSON.stringify(
      {jsonrpc: "2.0", id: 0, method: "initialize", params: {protocolVersion: 1}}));
    sock.onmessage = (e) => { seen.push(JSON.parse(e.data)); sock.close(1000); };
    sock.onclose = (e) => resolve({code: e.code, reason: e.reason, messages: seen});
    setTimeout(() => resolve({timeout: true, messages: seen}), 8000);
  });
  return out;
}"""


def test_a_page_whose_name_rebinds_to_loopback_can_neither_read_nor_act(
    rebinding_browser: Any, tmp_path: Path
) -> None:
    # Given the API with no token and a quiet session
    with api_process(tmp_path / "api.log") as api:
        sid = _session(api.base)
        # When a page of http://rebound.example:<api port> (resolved to 127.0.0.1) lists,
        # creates, archives and opens /acp, all same-origin to the browser
        page = rebinding_browser.new_page()
        try:
            page.goto(f"http://{REBOUND}:{api.port}/health")
            result: dict[str, Any] = page.evaluate(REBIND, [sid])
        finally:
            page.close()
        # Then every request is refused 403 host_forbidden, /acp is closed with 1008 before
        # it answers, and nothing is archived
        assert result["list"][0] == 403 and "host_forbidden" in result["list"][1], result
        assert sid not in result["list"][1], result
        assert (result["create"], result["archive"]) == (403, 403), result
        assert result["ws"].get("code") == 1008 and result["ws"]["messages"] == [], result
        assert result["ws"]["reason"].startswith("host_forbidden"), result
        assert not _archived(api.base, sid), result
