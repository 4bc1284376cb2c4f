"""The API's documentation pages, served offline: ``/docs`` (Swagger UI) loads its script,
style sheet and icon from ``/docs/assets/``, the Swagger UI distribution that the
``swagger-ui-py`` package ships (Apache-2.0; its ``LICENSE`` is served beside the assets at
``/docs/assets/LICENSE``), never from a CDN. ``/openapi.json`` is FastAPI's own. The pages
hold no fleet data and take no token."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse

#: Where the Swagger UI distribution files are (``swagger-ui-bundle.js``, ``swagger-ui.css``,
#: ``favicon-32x32.png``, ``LICENSE``).
SWAGGER_UI_DIR = Path(str(files("swagger_ui") / "static"))
#: URL prefix the distribution files are served under.
ASSETS = "/docs/assets"
DOCS = "/docs"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"


def mount(app: FastAPI) -> None:
    """Add ``GET /docs``, ``GET /docs/oauth2-redirect`` and the assets to ``app`` (made with
    ``docs_url=None``, so FastAPI's CDN page is not served)."""
    openapi_url = app.openapi_url or "/openapi.json"

    async def swagger_page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + OAUTH2_REDIRECT,
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon-32x32.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    async def oauth2_redirect(_: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    app.add_route(DOCS, swagger_page, include_in_schema=False)
    app.add_route(OAUTH2_REDIRECT, oauth2_redirect, include_in_schema=False)
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_UI_DIR), name="docs-assets")
