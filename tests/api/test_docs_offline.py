"""The API's doors: ``/docs`` works offline, its page referring only to
assets the API serves itself, and ``/`` leads to the console."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

from tests.helpers import rest_client

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with rest_client() as c:
        yield c


def _references(html: str) -> list[str]:
    """Every URL the page loads or points at: ``src``/``href`` attributes and the string
    literals of its script that look like URLs or paths."""
    found = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    found += re.findall(r"""\burl\s*:\s*['"]([^'"]+)['"]""", html)
    found += re.findall(r"""['"]((?:https?:)?//[^'"]+)['"]""", html)
    return found


def test_the_docs_page_refers_only_to_local_assets_and_they_answer(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    refs = _references(page.text)
    assert any(r.endswith(".js") for r in refs) and any(r.endswith(".css") for r in refs), refs
    for ref in refs:
        assert ref.startswith("/") and not ref.startswith("//"), f"{ref} is not local"
        resp = client.get(urljoin("http://testserver/docs", ref))
        assert resp.status_code == 200, ref
    assert "/openapi.json" in refs


def test_the_swagger_ui_licence_is_served_beside_its_assets(client: TestClient) -> None:
    resp = client.get("/docs/assets/LICENSE")
    assert resp.status_code == 200
    assert "Apache License" in resp.text


def test_the_root_redirects_to_the_console(client: TestClient) -> None:
    resp = client.get("/", follow_redirects=False)
    assert resp.status_code in (302, 303, 307, 308)
    assert resp.headers["location"] == "/console"
    followed = client.get("/")
    assert followed.status_code == 200
    assert followed.headers["content-type"].startswith("text/html")
