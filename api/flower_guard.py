"""What ``fleet flower`` changes in Flower before it serves without authentication (on
loopback only, read only).

Flower, started without auth and with ``FLOWER_UNAUTHENTICATED_API`` (needed for its HTTP API
to answer at all), sends ``Access-Control-Allow-Origin: *`` on every answer: any web page the
user opens could read task arguments, reminder prompts and job commands through the browser.
It has no setting to turn that off, so ``guard_unauthenticated`` changes its handlers' base
class in this process, before the server starts:

- no CORS header on any answer: a page of another origin cannot read what Flower answers (the
  Flower UI is served from Flower's own origin and needs none);
- a ``Host`` that does not name this machine (DNS rebinding: a page whose name was made to
  point at 127.0.0.1 is its own origin to the browser) answers 403, by the API's own rule
  (``api.guards.host_named``: loopback, or the address Flower binds to).

With basic auth Flower sends no CORS header itself and checks origins on writes; nothing is
changed then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from api.guards import allowed_hosts, host_named

#: The CORS headers Flower sets for unauthenticated instances.
CORS_HEADERS = (
    "Access-Control-Allow-Origin",
    "Access-Control-Allow-Headers",
    "Access-Control-Allow-Methods",
)


def guard_unauthenticated(address: str) -> None:
    """Make Flower's handlers (``flower.views.BaseHandler`` and its API handlers) send no
    CORS header and refuse with 403 a ``Host`` that is neither loopback nor ``address``.
    Call once, in the process that then starts Flower."""
    import tornado.web
    from flower.api import BaseApiHandler
    from flower.views import BaseHandler

    names = allowed_hosts("", address)
    set_default_headers = BaseHandler.set_default_headers

    def without_cors(self: Any) -> None:
        set_default_headers(self)
        for name in CORS_HEADERS:
            self.clear_header(name)

    def host_checked(prepare: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def checked(self: Any) -> Any:
            if not host_named(self.request.headers.get("Host"), names):
                raise tornado.web.HTTPError(
                    403, "Host does not name this Flower (only loopback names are served)"
                )
            return prepare(self)

        return checked

    BaseHandler.set_default_headers = without_cors
    BaseHandler.prepare = host_checked(tornado.web.RequestHandler.prepare)
    BaseApiHandler.prepare = host_checked(BaseApiHandler.prepare)
