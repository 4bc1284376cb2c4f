"""The fleet console (``/console``) in a real headless browser (Debian's chromium through
Playwright), against the API served by uvicorn in a subprocess and real workers (``fleet``)
for busy sessions. Screenshots of the main views go to ``tests/artifacts/console/``.

Skipped, with the reason, only when chromium or the ``playwright`` package cannot be had."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.helpers import STARTUP_TIMEOUT, fail_if_a_worker_died

CHROMIUM = os.environ.get("FLEET_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "console-test-token"
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "tests" / "artifacts" / "console"
BUSY_PROMPT = "spawn think 30|say done\nrun 60\nremind 60 say later\nthink 60"
FAMILIES = {"turn", "job", "subagent", "reminder"}

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="the playwright package is not installed (pip install -e '.[test]')",
)
if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(
        f"no chromium at {CHROMIUM} (as root: apt-get install -y chromium; .ci/run does it)",
        allow_module_level=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``uvicorn api.rest:create_app`` in a subprocess, plus a tiny REST client."""

    def __init__(self, prefix: str, token: str | None, log: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.token = token
        env = dict(os.environ, FLEET_KEY_PREFIX=prefix, FLEET_API_TOKEN=token or "")
        env["FLEET_LOG_FORMAT"] = "text"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "api.rest:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                urllib.request.urlopen(self.base + "/health", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"API did not start; see {log}") from None
                time.sleep(0.1)

    def call(self, method: str, path: str, body: Any = None, token: str | None = "") -> Any:
        """JSON request; answers ``(status, body)``."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        tok = self.token if token == "" else token
        if tok:
            req.add_header("Authorization", f"Bearer {tok}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                return res.status, json.loads(res.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, out = self.call(method, path, body)
        assert 200 <= status < 300, (method, path, status, out)
        return out

    def session(self, title: str, cwd: str = "/tmp/console-test") -> str:
        sid = str(self.ok("POST", "/sessions", {"cwd": cwd})["sessionId"])
        self.ok("PUT", f"/sessions/{sid}/title", {"title": title})
        return sid

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _wait(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        fail_if_a_worker_died(what)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def server(key_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(key_prefix, TOKEN, tmp_path_factory.mktemp("console") / "api.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page whose tab already holds the token (as after answering the prompt once)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.add_init_script(f"sessionStorage.setItem('fleetConsoleToken', {json.dumps(TOKEN)})")
    p = ctx.new_page()
    p.set_default_timeout(10_000)
    yield p
    ctx.close()


def _row(page: Any, sid: str) -> Any:
    return page.locator(f'.row[data-session-id="{sid}"]')


def _menu(page: Any, sid: str) -> Any:
    _row(page, sid).locator("button.more").click()
    return _row(page, sid).locator('[role="menu"]')


def test_events_take_a_token_query_parameter_and_nothing_else_does(server: Server) -> None:
    """EventSource cannot send headers: ``GET /events?token=`` is accepted, a wrong one is
    401, and no other route takes the token from the query string (it is a parameter those
    routes do not take: 422 naming it, nothing served)."""
    with urllib.request.urlopen(f"{server.base}/events?token={TOKEN}", timeout=5) as res:
        assert res.status == 200
        assert res.readline().startswith(b": connected")
    for path in ("/events?token=nope", "/events"):
        status, body = server.call("GET", path, token=None)
        assert status == 401 and body["error"]["code"] == "unauthorized", path
    status, body = server.call("GET", f"/sessions?token={TOKEN}", token=None)
    assert status == 422 and body["error"]["data"]["param"] == "token", body


def test_token_prompt_then_quiet_archive_without_dialog(server: Server, browser: Any) -> None:
    sid = server.session("Quiet one")
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    page.set_default_timeout(10_000)
    try:
        page.goto(server.base + "/console")
        # The page is public; the API answers 401, so the page asks for the token once.
        page.locator("#token-dialog").wait_for(state="visible")
        page.fill("#token-input", TOKEN)
        page.keyboard.press("Enter")
        _row(page, sid).wait_for()
        assert page.evaluate("sessionStorage.getItem('fleetConsoleToken')") == TOKEN
        menu = _menu(page, sid)
        labels = menu.get_by_role("menuitem").all_inner_texts()
        # One move out of the row's state, first, among non-destructive actions; Delete is
        # set apart after a separator, never next to Archive.
        assert labels[0] == "Archive" and "Restore" not in labels
        assert labels[-1].startswith("Delete") and labels[-2] != "Archive"
        page.screenshot(path=str(SHOTS / "row-menu.png"))
        menu.get_by_role("menuitem", name="Archive").click()
        page.locator("#notice-text").get_by_text("Archived “Quiet one”.").wait_for()
        assert page.locator("#refusal").is_visible() is False
        assert page.locator("#notice-undo").is_visible()
        _row(page, sid).wait_for(state="detached")
        assert server.ok("GET", f"/sessions/{sid}")["archived"] is True
    finally:
        ctx.close()


def test_busy_archive_refusal_dialog_confirm_then_undo(
    server: Server, page: Any, fleet: Any
) -> None:
    sid = server.session("Busy one")
    server.ok("POST", f"/sessions/{sid}/prompt", {"prompt": BUSY_PROMPT})

    def live() -> list[dict[str, Any]]:
        return list(server.ok("GET", f"/sessions/{sid}/activity")["activity"])

    _wait(lambda: {i["family"] for i in live()} == FAMILIES, 30, "four live families")
    page.goto(server.base + "/console")
    status = _row(page, sid).locator(".status")
    page.wait_for_function(
        "el => /turn running/.test(el.textContent) && /job/.test(el.textContent)"
        " && /subagent/.test(el.textContent) && /reminder/.test(el.textContent)",
        arg=status.element_handle(),
    )
    # The subagent is reachable under its parent.
    child_rows = page.locator(f'.row[data-session-id="{sid}"] ~ ul .row')
    assert child_rows.count() >= 1

    # Plain archive first: the 409 opens the dialog with the server's live items.
    _menu(page, sid).get_by_role("menuitem", name="Archive").click()
    dialog = page.locator("#refusal")
    dialog.wait_for(state="visible")
    shown = dialog.locator("#refusal-items li")
    status_code, refusal = server.call("POST", f"/sessions/{sid}/archive", {})
    assert status_code == 409
    server_items = refusal["error"]["data"]["activity"]
    assert {li.get_attribute("data-family") for li in shown.all()} == FAMILIES
    assert shown.count() == len(server_items)
    texts = shown.all_inner_texts()
    for item in server_items:
        assert any(t.startswith(item["family"]) and item["label"] in t for t in texts), item
    page.screenshot(path=str(SHOTS / "refusal-dialog.png"))
    # Keyboard: focus stays in the dialog, Escape closes it and archives nothing.
    for _ in range(5):
        page.keyboard.press("Tab")
        assert page.evaluate("document.querySelector('#refusal').contains(document.activeElement)")
    page.keyboard.press("Escape")
    dialog.wait_for(state="hidden")
    assert server.ok("GET", f"/sessions/{sid}")["archived"] is False

    # Again from the session view; confirming resends with stopActivity.
    _row(page, sid).locator("button.open").click()
    page.locator(f'#detail .card[data-session-id="{sid}"]').wait_for()
    page.locator("#detail").get_by_role("button", name="Archive").click()
    dialog.wait_for(state="visible")
    page.locator("#refusal-confirm").click()
    page.locator("#notice-text").get_by_text("Archived “Busy one” and stopped").wait_for()
    assert server.ok("GET", f"/sessions/{sid}")["archived"] is True
    page.locator('#detail .card[data-archived="true"]').wait_for()
    _wait(lambda: not live(), 20, "the stopped work to drain")

    page.locator("#notice-undo").click()
    notice = page.locator("#notice-text")
    notice.get_by_text("Restored “Busy one”.").wait_for()
    assert "not resumed" in notice.inner_text()
    page.screenshot(path=str(SHOTS / "undo-notice.png"))
    assert server.ok("GET", f"/sessions/{sid}")["archived"] is False
    page.locator('#detail .card[data-archived="false"]').wait_for()
    # Restored, nothing resumed: a prompt sent after the undo runs to its end (the workers
    # took messages sent after it) and the session is idle again
    server.ok("POST", f"/sessions/{sid}/prompt", {"prompt": "say after"})
    _wait(lambda: live() == [], 30, "the prompt sent after the undo to end")
    assert live() == []


def test_archive_door_at_zero_says_nothing_archived(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, browser: Any
) -> None:
    prefix = f"fleet-console-empty-{uuid.uuid4().hex[:8]}:"
    empty = Server(prefix, None, tmp_path_factory.mktemp("console-empty") / "api.log")
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        page = ctx.new_page()
        page.set_default_timeout(10_000)
        page.goto(empty.base + "/console")
        page.locator("#list-empty").get_by_text("No active sessions").wait_for()
        door = page.locator("#door")
        assert door.is_visible() and door.get_attribute("aria-pressed") == "false"
        assert not any(ch.isdigit() for ch in door.inner_text())  # no count
        door.focus()
        page.keyboard.press("Enter")
        page.locator("#list-empty").get_by_text("Nothing archived").wait_for()
        assert door.get_attribute("aria-pressed") == "true"
        page.screenshot(path=str(SHOTS / "archive-empty-phone.png"))
        door.click()
        page.locator("#list-empty").get_by_text("No active sessions").wait_for()
    finally:
        ctx.close()
        empty.stop()
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


def test_archived_link_lands_on_a_read_only_card(server: Server, page: Any, fleet: Any) -> None:
    # Given a session with a finished conversation, archived
    sid = server.session("Cold card", cwd="/tmp/console-cold")
    tid = server.ok("POST", f"/sessions/{sid}/prompt", {"prompt": "say hello from the past"})[
        "turnId"
    ]
    _wait(lambda: server.ok("GET", f"/turns/{tid}")["state"] == "completed", 20, "the turn")
    server.ok("POST", f"/sessions/{sid}/archive", {})
    page.goto(f"{server.base}/console#/session/{sid}")
    card = page.locator(f'#detail .card[data-session-id="{sid}"][data-archived="true"]')
    card.wait_for()
    page.locator('#door[aria-pressed="true"]').wait_for()
    page.locator("#list-title").get_by_text("Archived sessions").wait_for()
    _row(page, sid).wait_for()
    assert "Cold card" in card.locator("h2").inner_text()
    assert "/tmp/console-cold" in card.inner_text()
    assert "read-only" in card.inner_text()
    # The card keeps the conversation: the prompt and the answer
    talk = card.locator("#conversation .conversation")
    talk.wait_for()
    assert "say hello from the past" in talk.inner_text()
    assert "hello from the past" in talk.locator(".from-agent").inner_text()
    assert any(
        s in card.inner_text() for s in ("Went quiet", "Not yet recorded quiet", "Archive hazard")
    )
    names = card.get_by_role("button").all_inner_texts()
    assert names == ["Back to list", "Restore"]  # Restore is its only lifecycle action
    assert card.locator("textarea, input").count() == 0
    page.screenshot(path=str(SHOTS / "archived-card.png"))
    # The row menu on the archived side names the move out: Restore.
    labels = _menu(page, sid).get_by_role("menuitem").all_inner_texts()
    assert labels[0] == "Restore" and "Archive" not in labels
    page.keyboard.press("Escape")
    card.get_by_role("button", name="Restore").click()
    page.locator(f'#detail .card[data-session-id="{sid}"][data-archived="false"]').wait_for()
    assert server.ok("GET", f"/sessions/{sid}")["archived"] is False


def test_rename_in_place_shows_the_normalized_title_and_errors(server: Server, page: Any) -> None:
    sid = server.session("Before")
    page.goto(f"{server.base}/console#/session/{sid}")
    card = page.locator(f'#detail .card[data-session-id="{sid}"]')
    card.wait_for()
    card.get_by_role("button", name="Rename").click()
    page.fill("#title-input", "  a\n b  ")
    page.locator("#detail").get_by_role("button", name="Save").click()
    page.wait_for_function("document.querySelector('#detail-title')?.textContent === 'a b'")
    assert server.ok("GET", f"/sessions/{sid}")["title"] == "a b"
    _row(page, sid).locator(".t").get_by_text("a b", exact=True).wait_for()

    page.locator("#detail").get_by_role("button", name="Rename").click()
    page.fill("#title-input", "   ")
    page.keyboard.press("Enter")
    page.locator("#title-error").get_by_text("Title must not be empty.").wait_for()
    page.screenshot(path=str(SHOTS / "rename-error.png"))
    assert server.ok("GET", f"/sessions/{sid}")["title"] == "a b"
    page.keyboard.press("Escape")
    page.wait_for_function("document.querySelector('#detail-title')?.textContent === 'a b'")


def test_list_updates_live_when_another_client_archives(server: Server, page: Any) -> None:
    sid = server.session("Live row")
    page.goto(server.base + "/console")
    _row(page, sid).wait_for()
    page.locator('#live[data-state="live"]').wait_for()
    page.evaluate("window.__sameDocument = true")
    page.screenshot(path=str(SHOTS / "list.png"))
    server.ok("POST", f"/sessions/{sid}/archive", {})  # another client, over REST
    _row(page, sid).wait_for(state="detached", timeout=5_000)
    assert page.evaluate("window.__sameDocument") is True  # no reload
    # On the archived side, its row follows another client's unarchive live too.
    page.locator("#door").click()
    _row(page, sid).wait_for()
    server.ok("POST", f"/sessions/{sid}/unarchive")
    _row(page, sid).wait_for(state="detached", timeout=5_000)


def test_a_session_another_client_deletes_leaves_the_list_and_its_open_view(
    server: Server, page: Any
) -> None:
    # Given a session open in the console, with another one listed beside it
    other = server.session("Stays listed")
    sid = server.session("Deleted elsewhere")
    page.goto(f"{server.base}/console#/session/{sid}")
    card = page.locator(f'#detail .card[data-session-id="{sid}"]')
    card.wait_for()
    _row(page, sid).wait_for()
    page.locator('#live[data-state="live"]').wait_for()
    page.evaluate("window.__sameDocument = true")
    # When another client deletes it, Then its row and its view go, live (its deleted event)
    server.ok("DELETE", f"/sessions/{sid}")
    _row(page, sid).wait_for(state="detached", timeout=5_000)
    card.wait_for(state="detached", timeout=5_000)
    page.wait_for_function("location.hash === '#/'")
    _row(page, other).wait_for()
    assert page.evaluate("window.__sameDocument") is True  # no reload


def test_delete_asks_for_confirmation_and_cancel_keeps_the_session(
    server: Server, page: Any
) -> None:
    sid = server.session("Delete me")
    page.goto(server.base + "/console")
    _row(page, sid).wait_for()
    # Cancel keeps it
    _menu(page, sid).get_by_role("menuitem", name="Delete…").click()
    page.locator("#confirm-delete").wait_for(state="visible")
    page.locator("#delete-cancel").click()
    assert server.call("GET", f"/sessions/{sid}")[0] == 200
    # Confirming deletes it
    _menu(page, sid).get_by_role("menuitem", name="Delete…").click()
    page.locator("#delete-confirm").click()
    _row(page, sid).wait_for(state="detached")
    assert server.call("GET", f"/sessions/{sid}")[0] == 404


def test_a_refresh_of_the_list_keeps_the_rows_and_the_open_menu_under_the_pointer(
    server: Server, page: Any
) -> None:
    # Given a list with two sessions, one of them with its row menu open
    other = server.session("Refreshed neighbour")
    sid = server.session("Menu stays open")
    page.goto(server.base + "/console")
    _row(page, other).wait_for()
    page.locator('#live[data-state="live"]').wait_for()
    menu = _menu(page, sid)
    menu.wait_for()
    page.evaluate(
        'sid => { window.__menu = document.querySelector(`.row[data-session-id="${sid}"]'
        " [role=menu]`); window.__row = window.__menu.closest('li'); }",
        sid,
    )
    assert page.evaluate("window.__menu.contains(document.activeElement)")
    # When another client renames the other session and creates a third, and the list
    # refreshes live
    server.ok("PUT", f"/sessions/{other}/title", {"title": "Renamed neighbour"})
    _row(page, other).locator(".t").get_by_text("Renamed neighbour", exact=True).wait_for()
    _row(page, server.session("Newcomer")).wait_for()
    # Then the open menu is the same element, still open and focused, in the same row
    assert page.evaluate("window.__menu.isConnected && window.__row.isConnected")
    assert page.evaluate("window.__menu.contains(document.activeElement)")
    assert _row(page, sid).locator("button.more").get_attribute("aria-expanded") == "true"
    assert menu.count() == 1
    assert page.evaluate(
        'sid => document.querySelector(`.row[data-session-id="${sid}"] [role=menu]`)'
        " === window.__menu",
        sid,
    )
    # And a click in it acts on its session
    menu.get_by_role("menuitem", name="Delete…").click(timeout=5_000)
    page.locator("#confirm-delete").wait_for(state="visible")
    page.locator("#delete-cancel").click()
    assert server.call("GET", f"/sessions/{sid}")[0] == 200


def test_refusal_dialog_asks_again_when_the_work_changed_before_confirming(
    server: Server, page: Any, store: Any
) -> None:
    from orchestrator.turn import turns
    from tests.helpers import RecordingDispatcher

    recorder = RecordingDispatcher()  # the turns run nowhere: only this test moves them
    sid = server.session("Changing one")
    t1 = turns.start_turn(store, recorder, sid, "think 30")
    page.goto(server.base + "/console")
    _menu(page, sid).get_by_role("menuitem", name="Archive").click()
    dialog = page.locator("#refusal")
    dialog.wait_for(state="visible")
    assert dialog.locator("#refusal-items li").all_inner_texts()[0].startswith("turn")
    # While the dialog shows T1, T1 ends and T2 starts
    turns.cancel_turns(store, recorder, sid, [t1])
    t2 = turns.start_turn(store, recorder, sid, "think 60")
    shown = [
        (li.get_attribute("data-family"), li.get_attribute("data-id"))
        for li in dialog.locator("#refusal-items li").all()
    ]
    assert shown == [("turn", t1)]
    # What gets confirmed is exactly the refusal's items, as the dialog showed them.
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/archive")) as req:
        page.locator("#refusal-confirm").click()
    sent = req.value.post_data_json
    assert sent["stopActivity"] is True
    assert [(i["family"], i["id"]) for i in sent["confirmedActivity"]] == shown
    # The server refused the old list: the dialog shows what runs now and nothing was stopped
    page.locator("#refusal-title").get_by_text("The work changed").wait_for()
    assert dialog.is_visible()
    assert "think 60" in " ".join(dialog.locator("#refusal-items li").all_inner_texts())
    assert server.ok("GET", f"/sessions/{sid}")["archived"] is False
    assert server.ok("GET", f"/turns/{t2}")["state"] == "running"
    # Confirming the new list archives and stops T2
    page.locator("#refusal-confirm").click()
    page.locator("#notice-text").get_by_text("Archived “Changing one” and stopped").wait_for()
    assert server.ok("GET", f"/sessions/{sid}")["archived"] is True
    assert server.ok("GET", f"/turns/{t2}")["state"] == "cancelled"


# ------------------------------------------------------------------ the list and the session view


def test_list_header_holds_three_equal_pills_and_new_asks_for_the_cwd(
    server: Server, page: Any
) -> None:
    page.goto(server.base + "/console")
    pills = page.locator(".list-head > button.pill")
    pills.first.wait_for()
    names = [n.strip() for n in pills.all_inner_texts()]
    assert [n.split()[-1] for n in names] == ["New", "Search", "Archive"]  # the door third
    assert pills.nth(2).get_attribute("id") == "door"
    widths = {round(pills.nth(i).bounding_box()["width"]) for i in range(3)}
    heights = {round(pills.nth(i).bounding_box()["height"]) for i in range(3)}
    assert len(widths) == 1 and len(heights) == 1, (widths, heights)
    # New asks for the working directory; a relative one is refused in the dialog.
    page.get_by_role("button", name="New session").click()
    dialog = page.locator("#new-dialog")
    dialog.wait_for(state="visible")
    assert page.evaluate("document.activeElement.id") == "new-cwd"
    page.fill("#new-cwd", "relative/dir")
    page.keyboard.press("Enter")
    page.locator("#new-error").get_by_text("absolute path").wait_for()
    assert dialog.is_visible()
    page.screenshot(path=str(SHOTS / "new-session.png"))
    page.fill("#new-cwd", "/tmp/console-new")
    page.keyboard.press("Enter")
    dialog.wait_for(state="hidden")
    card = page.locator('#detail .card[data-archived="false"]')
    card.wait_for()
    sid = card.get_attribute("data-session-id")
    assert sid and server.ok("GET", f"/sessions/{sid}")["cwd"] == "/tmp/console-new"
    _row(page, sid).wait_for()


def test_search_from_the_active_side_finds_an_archived_title_and_opens_it_there(
    server: Server, page: Any
) -> None:
    cold = server.session("Zebra only in the archive")
    server.ok("POST", f"/sessions/{cold}/archive", {})
    warm = server.session("Zebra still active")
    page.goto(server.base + "/console")
    _row(page, warm).wait_for()
    assert page.locator("#door").get_attribute("aria-pressed") == "false"
    page.get_by_role("button", name="Search").click()
    assert page.evaluate("document.activeElement.id") == "q"
    page.keyboard.type("zebra only")
    _row(page, cold).wait_for()
    assert "archived" in _row(page, cold).locator(".status").inner_text()
    _row(page, warm).wait_for(state="detached")
    page.screenshot(path=str(SHOTS / "search-archived.png"))
    _row(page, cold).locator("button.open").click()
    page.locator(f'#detail .card[data-session-id="{cold}"][data-archived="true"]').wait_for()
    # It opens on the side that holds it: the archive, with its row in the list.
    page.locator('#door[aria-pressed="true"]').wait_for()
    page.locator("#list-title").get_by_text("Archived sessions").wait_for()
    _row(page, cold).wait_for()
    # An active match opens on the active side.
    page.get_by_role("button", name="Search").click()
    page.keyboard.type("zebra still")
    _row(page, warm).locator("button.open").click()
    page.locator(f'#detail .card[data-session-id="{warm}"][data-archived="false"]').wait_for()
    page.locator('#door[aria-pressed="false"]').wait_for()
    page.locator("#list-title").get_by_text("Active sessions").wait_for()
    _row(page, warm).wait_for()


def test_right_click_on_a_row_opens_the_row_menu(server: Server, page: Any) -> None:
    sid = server.session("Right-clicked")
    page.goto(server.base + "/console")
    _row(page, sid).wait_for()
    by_button = _menu(page, sid).get_by_role("menuitem").all_inner_texts()
    page.keyboard.press("Escape")
    _row(page, sid).locator('[role="menu"]').wait_for(state="detached")
    _row(page, sid).locator("button.open").click(button="right")
    menu = _row(page, sid).locator('[role="menu"]')
    menu.wait_for()
    assert menu.get_by_role("menuitem").all_inner_texts() == by_button
    assert _row(page, sid).locator("button.more").get_attribute("aria-expanded") == "true"
    # Keyboard reachable like the button's: focus on the first item, arrows move.
    assert page.evaluate("document.activeElement.textContent") == by_button[0]
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.activeElement.textContent") == by_button[1]
    page.keyboard.press("Escape")
    menu.wait_for(state="detached")


def test_the_archived_list_is_flat_without_counts(server: Server, page: Any) -> None:
    parent = server.session("Flat parent")
    child = str(
        server.ok("POST", "/sessions", {"cwd": "/tmp/console-test", "parentId": parent})[
            "sessionId"
        ]
    )
    page.goto(server.base + "/console")
    # On the active side the subagent is under its parent.
    nested = f'.row[data-session-id="{parent}"] ~ ul .row[data-session-id="{child}"]'
    page.locator(nested).wait_for()
    server.ok("POST", f"/sessions/{parent}/archive", {})  # archives the subtree
    page.locator("#door").click()
    for sid in (parent, child):  # the archived side's rows, not the active side's
        _row(page, sid).locator(".status").get_by_text("archived").wait_for()
    assert page.locator("#rows ul").count() == 0  # no nesting
    assert page.locator("#rows > li > .row").count() == page.locator("#rows .row").count()
    for sid in (parent, child):
        status = _row(page, sid).locator(".status").inner_text()
        assert status == "archived" and not any(c.isdigit() for c in status)
    head = page.locator(".list-head").inner_text() + page.locator("#list-title").inner_text()
    assert not any(c.isdigit() for c in head)


def test_times_read_relative_with_local_time_on_hover(server: Server, browser: Any) -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    sid = server.session("Timed")
    info = server.ok("GET", f"/sessions/{sid}")
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, timezone_id="Asia/Tokyo")
    ctx.add_init_script(f"sessionStorage.setItem('fleetConsoleToken', {json.dumps(TOKEN)})")
    page = ctx.new_page()
    page.set_default_timeout(10_000)
    try:
        page.clock.install()
        page.goto(f"{server.base}/console#/session/{sid}")
        when = _row(page, sid).locator("time")
        when.wait_for()
        assert when.inner_text() == "just now"
        assert when.get_attribute("datetime") == info["updatedAt"]
        local = datetime.fromisoformat(info["updatedAt"].replace("Z", "+00:00")).astimezone(
            ZoneInfo("Asia/Tokyo")
        )
        hover = when.get_attribute("title") or ""
        assert f"{local.hour % 12 or 12}:{local.minute:02d}" in hover and "GMT+9" in hover
        last = page.locator("#detail dd time").first
        last.wait_for()
        assert last.inner_text() == "just now" and last.get_attribute("title") == hover
        assert info["updatedAt"] not in page.locator("#detail").inner_text()  # no raw ISO
        page.clock.fast_forward("03:10")
        page.wait_for_function("el => el.textContent === '3 min ago'", arg=when.element_handle())
        assert last.inner_text() == "3 min ago"
    finally:
        ctx.close()


def test_session_view_shows_token_usage_only_when_the_session_carries_it(
    server: Server, page: Any
) -> None:
    with_usage = server.session("Counted")
    without = server.session("Uncounted")

    def add_usage(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        body["usage"] = {"inputTokens": 12345, "outputTokens": 678}
        route.fulfill(response=response, json=body)

    page.route(f"**/sessions/{with_usage}", add_usage)
    page.goto(f"{server.base}/console#/session/{with_usage}")
    card = page.locator(f'#detail .card[data-session-id="{with_usage}"]')
    card.wait_for()
    tokens = card.locator("dd.usage")
    tokens.wait_for()
    assert re.fullmatch(r"12\D?345 in · 678 out", tokens.inner_text())  # the reader's locale
    assert "Tokens" in card.locator("dl").inner_text()
    page.goto(f"{server.base}/console#/session/{without}")
    card = page.locator(f'#detail .card[data-session-id="{without}"]')
    card.wait_for()
    assert card.locator("dd.usage").count() == 0
    assert "Tokens" not in card.locator("dl").inner_text()


def test_new_session_sends_an_idempotency_key_and_retries_a_lost_answer_with_it(
    server: Server, page: Any
) -> None:
    cwd = f"/tmp/console-idem-{uuid.uuid4().hex[:8]}"
    keys: list[str | None] = []

    def answer_lost_once(route: Any) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        keys.append(route.request.headers.get("idempotency-key"))
        created = route.fetch()  # the server creates the session either way
        if len(keys) == 1:  # the first answer is lost: the server's 503 for a lost reply
            lost = {"code": "write_outcome_unknown", "message": "may have been applied", "data": {}}
            route.fulfill(status=503, json={"error": lost})
        else:
            route.fulfill(response=created)

    page.route("**/sessions", answer_lost_once)
    page.goto(server.base + "/console")
    page.get_by_role("button", name="New session").click()
    page.fill("#new-cwd", cwd)
    page.keyboard.press("Enter")
    page.locator("#new-dialog").wait_for(state="hidden")
    card = page.locator('#detail .card[data-archived="false"]')
    card.wait_for()
    # The console sent its key and retried with it: one session, the one it opened.
    assert len(keys) == 2 and keys[0] and keys[0] == keys[1], keys
    listed = server.ok("GET", f"/sessions?cwd={cwd}")["sessions"]
    assert [s["sessionId"] for s in listed] == [card.get_attribute("data-session-id")]
