"""The fleet console: one static page at ``/console`` (assets under ``/console/static/``),
shipped in the package, and ``/``, which redirects to it. The page holds no data and is
public; everything it shows comes from the REST API and ``GET /events`` with the bearer token
the user enters in the browser."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request

from orchestrator import families

STATIC_DIR = Path(__file__).resolve().parent / "static" / "console"


def mount(app: FastAPI) -> None:
    """Add ``GET /`` (a redirect), ``GET /console`` and the static assets to ``app``."""

    async def root(request: Request) -> RedirectResponse:
        return RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/console")

    async def console(_: Request) -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def family_labels(_: Request) -> Response:
        return Response(
            families_module(),
            media_type="text/javascript",
            headers={"Cache-Control": "no-cache"},
        )

    app.add_route("/", root, include_in_schema=False)
    app.add_route("/console", console, include_in_schema=False)
    app.add_route("/console/families.js", family_labels, include_in_schema=False)
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")


def families_module() -> str:
    """The console's family labels as an ES module, from the family registry:
    ``export const FAMILIES = {name: {display, plural, status}}`` in registry order."""
    labels = {
        spec.name: {"display": spec.display, "plural": spec.plural, "status": spec.status}
        for spec in families.families()
    }
    return f"export const FAMILIES = {json.dumps(labels)};\n"
