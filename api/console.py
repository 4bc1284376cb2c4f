"""The fleet console: one static page at ``/console`` (assets under ``/console/static/``),
shipped in the package, and ``/``, which redirects to it. The page holds no data and is
public; everything it shows comes from the REST API and ``GET /events`` with the bearer token
the user enters in the browser."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request

STATIC_DIR = Path(__file__).resolve().parent / "static" / "console"


def mount(app: FastAPI) -> None:
    """Add ``GET /`` (a redirect), ``GET /console`` and the static assets to ``app``."""

    async def root(request: Request) -> RedirectResponse:
        return RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/console")

    async def console(_: Request) -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.add_route("/", root, include_in_schema=False)
    app.add_route("/console", console, include_in_schema=False)
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
