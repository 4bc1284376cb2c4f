"""The fleet console: one static page at ``/console`` (assets under ``/console/static/``),
shipped in the package. The page holds no data and is public; everything it shows comes from
the REST API and ``GET /events`` with the bearer token the user enters in the browser."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static" / "console"


def mount(app: FastAPI) -> None:
    """Add ``GET /console`` and the static assets to ``app``."""

    @app.get("/console", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
