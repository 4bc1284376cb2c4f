"""Entry point for Celery's own command line: ``celery -A workers.main worker -Q ...``.

Reads ``FleetSettings`` once from the environment (``FLEET_REDIS_URL`` is required: without
it the import raises ``MissingRedisUrl`` and the worker does not start), builds the app from
them and installs them as the worker's runtime. ``fleet worker`` does the same from its own
options and is the usual way to start a worker.
"""

from __future__ import annotations

from orchestrator.settings import FleetSettings
from workers.app import create_app
from workers.runtime import install

settings = FleetSettings()
app = create_app(settings)
install(settings, app)
