"""One settings object for every process of agent-fleet, read from ``FLEET_*`` variables.

Every variable is listed in the documentation's configuration reference
(``docs/reference/configuration.md``), which ``python -m api.docs_gen`` writes from the ``#:``
comments below; the names are the field names upper-cased with the ``FLEET_`` prefix
(``redis_url`` -> ``FLEET_REDIS_URL``).
"""

from __future__ import annotations

import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The longest duration a ``*_seconds`` setting (or a CLI option in seconds) may name: about 31
#: years. Longer ones are refused: converted to milliseconds they overflow Redis's integers
#: and Python's dates.
MAX_SECONDS = 10**9
#: A duration in seconds, 0 allowed (a finite number: ``inf`` and ``nan`` are refused).
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
#: A duration in seconds greater than 0.
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


#: The tools a model may be offered (``FLEET_TOOLS``), in ``orchestrator/turn/toolbox.py``'s order;
#: named here so a setting naming another is refused when it is read (the registry imports
#: the settings, not the other way round).
TOOL_NAMES = ("shell", "start_job", "spawn_subagent", "set_reminder")


def _known_tools(value: str) -> str:
    """``FLEET_TOOLS`` as given, once every name in it is a tool of ``TOOL_NAMES``: a misspelt
    tool would otherwise be left out without a word, and the fleet run without it."""
    unknown = [n.strip() for n in value.split(",") if n.strip() and n.strip() not in TOOL_NAMES]
    if unknown:
        said = ("unknown tool " if len(unknown) == 1 else "unknown tools ") + ", ".join(
            repr(n) for n in unknown
        )
        raise PydanticCustomError(
            "unknown_tool",
            "{said} (the tools are {known}; a comma list of them, or empty for none)",
            {"said": said, "known": ", ".join(TOOL_NAMES)},
        )
    return value


class MissingRedisUrl(ValueError):
    """No ``FLEET_REDIS_URL`` (or one of another scheme) where a process needs Redis: every
    command but ``fleet up`` and ``fleet demo`` refuses to start without one."""


#: The URL schemes ``FLEET_REDIS_URL`` may have (``sentinel://``: see
# ``orchestrator.storage.redisconn``).
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "sentinel://")


class FleetSettings(BaseSettings):
    """Process configuration (pydantic-settings, environment prefix ``FLEET_``)."""

    model_config = SettingsConfigDict(env_prefix="FLEET_", extra="ignore", allow_inf_nan=False)

    #: Redis for state and as the Celery broker: ``redis://``, ``rediss://``, ``unix://``, or
    #: Sentinels as ``sentinel://[[user]:password@]host:26379[/db];sentinel://host2:26379;...``
    #: (kombu's form; the credentials and database of the first address are the primary's).
    #: Unset: ``fleet up``/``fleet demo`` start an embedded server; other commands use the
    #: ``fleet up`` published in ``FLEET_STATE_DIR/fleet.json``, else stop saying what to do
    #: (``fleet worker``, ``beat``, ``api`` and ``celery -A workers.main`` require it).
    redis_url: str | None = None
    #: With a ``sentinel://`` URL (orchestrator/storage/redisconn.py): the primary's name as the
    #: Sentinels monitor it.
    redis_sentinel_master: str = "mymaster"
    #: With a ``sentinel://`` URL: the Sentinels' own credentials, when they require them, as
    #: ``user:password`` (``:password`` for a password alone, needed when it holds a ``:``;
    #: without any ``:`` the value is the password). Empty: none.
    redis_sentinel_auth: str = ""
    #: Replicas that must acknowledge each lifecycle write (archive, unarchive, delete, bulk
    #: batches, client titles, session creation) within a second (Redis ``WAIT``, after
    #: ``WAITAOF``); fewer answer 503 ``write_unconfirmed``. 0: no replica is waited for.
    redis_min_replicas_ack: int = Field(default=0, ge=0)
    #: Prefix of every key agent-fleet writes (state and broker), so several fleets or test
    #: runs can share one Redis database without touching each other's data.
    key_prefix: str = "fleet:"
    #: Where the embedded Redis keeps its data (append-only file), the local runners their
    #: worker logs, and a running ``fleet up`` its ``fleet.json`` (where it runs).
    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".fleet")
    #: Name of this host as job workers report it; stops for a job are routed to it.
    hostname: str = Field(default_factory=socket.gethostname)
    #: Seconds a job's liveness lease lasts; a job worker refreshes it while the process runs,
    #: so a job whose worker died stops counting as live once the lease runs out.
    job_lease_seconds: PositiveSeconds = 5.0
    #: Seconds a job may stay frozen while Redis does not answer: a job whose lease renewals
    #: fail only because Redis is stalled (a slow ``fsync``, a paused server) is frozen
    #: (``cgroup.freeze``, else SIGSTOP of its tree) instead of killed once a third of its
    #: lease is left, and thawed when Redis answers and confirms the job may still run (not
    #: archived, still this worker's); frozen longer than this, it is killed and recorded
    #: ``lost``. ``0``: never frozen, killed at once as when its worker is frozen.
    job_freeze_max_seconds: Seconds = 120.0
    #: Seconds a claimed reminder waits for its turn to be created before the poller claims
    #: it again and re-sends its fire (at-least-once delivery; the turn is created once); the
    #: wait doubles per re-claim, up to 8x.
    reminder_refire_seconds: PositiveSeconds = 30.0
    #: Host the HTTP API binds to.
    api_host: str = "127.0.0.1"
    #: Port the HTTP API binds to.
    api_port: int = Field(default=8765, ge=1, le=65535)
    #: Bearer token the API requires (compared in constant time); empty: none, and then
    #: ``fleet api`` binds only to loopback.
    api_token: str = ""
    #: Browser origins (``scheme://host:port``, comma-separated) besides the API's own that
    #: may change state (POST/PUT/PATCH/DELETE) and open ``/acp``; other origins get 403.
    api_allowed_origins: str = ""
    #: Without a token: host names (comma-separated; a port given is ignored) besides
    #: loopback (``localhost``, ``127.0.0.0/8``, ``[::1]``) and ``api_host`` that a request
    #: may name in its ``Host`` header; any other answers 403 ``host_forbidden`` (a page whose
    #: DNS name rebinds to this machine). With a token every name is served.
    api_allowed_hosts: str = ""
    #: ``user:password`` Flower asks for (``fleet flower``); required unless Flower binds to
    #: loopback (where, without it, Flower is read only).
    flower_basic_auth: str = ""
    #: Most sessions a bulk-archive filter may select (``POST /sessions/archive``, ``fleet
    #: archive --bulk``); a filter matching more is refused. The auto-archive policy takes at
    #: most this many per run (the oldest first) and the rest on its next run.
    bulk_filter_max: int = Field(default=50_000, ge=1)
    #: Seconds between two passes of the archive reconciler: every reminder worker runs one
    #: itself (so archives converge with no scheduler deployed) and ``fleet beat`` schedules
    #: ``archive.reconcile`` as often; an archive hazard is retried every 10 intervals. 0: no
    #: periodic pass (``fleet reconcile`` runs one).
    reconcile_interval_seconds: Seconds = 10.0
    #: Seconds after an archive before the reconciler looks at it (the fan-out's own stops
    #: get this long to drain the work).
    reconcile_grace_seconds: Seconds = 5.0
    #: Seconds before the broker redelivers an unacknowledged message (a step whose worker
    #: died); Celery's Redis transport ``visibility_timeout``.
    visibility_timeout_seconds: PositiveSeconds = 60.0
    #: Most ``GET /events`` streams one API process serves at once (each holds a Redis
    #: connection); one more answers 503 ``too_many_streams`` with ``Retry-After``.
    api_max_event_streams: int = Field(default=500, ge=1)
    #: Seconds without progress (no step begun, no advance) after which the sweeper looks at a
    #: running or cancelling turn: one whose step lease is gone is resumed (or settled),
    #: unless its step's message still waits in the broker.
    turn_stuck_seconds: PositiveSeconds = 30.0
    #: Seconds a client's idempotency key (``Idempotency-Key`` on a session's creation or a
    #: prompt) is remembered: a retry with it within this time answers what the first did.
    idempotency_ttl_seconds: PositiveSeconds = 86_400.0
    #: Log format: ``json`` (one JSON object per line) or ``text`` (for a terminal); empty
    #: picks ``text`` when stderr is a terminal and ``json`` otherwise.
    log_format: Literal["", "json", "text"] = ""
    # Limits (docs/security.md, "Limits"). An instruction over one is a failed tool call in
    # its turn naming the limit and the current count; 0 forbids the kind altogether.
    #: Live jobs (starting or running) one session may have; a ``start_job`` (the scripted
    #: ``run``) beyond is a failed tool call.
    max_jobs_per_session: int = Field(default=16, ge=0)
    #: Live job processes one job host (``FLEET_HOSTNAME``) runs; a job its worker takes
    #: beyond that ends ``refused`` with the reason.
    max_jobs_per_host: int = Field(default=64, ge=0)
    #: Live reminders (armed or firing) one session may have; a ``remind`` beyond is refused.
    max_reminders_per_session: int = Field(default=100, ge=0)
    #: Deepest subagent nesting: a top-level session is at depth 0, its subagent at 1; a
    #: ``spawn`` that would create one deeper is refused.
    max_subagent_depth: int = Field(default=5, ge=0)
    #: Live direct subagents (not deleted, with live work) one session may have; a ``spawn``
    #: beyond is refused.
    max_subagents_per_session: int = Field(default=32, ge=0)
    #: The model backend turn workers use: ``scripted`` (deterministic, no network) or
    #: ``openai`` (any OpenAI-compatible Chat Completions server, ``FLEET_OPENAI_*``; the
    #: server and its key are the OpenAI SDK's own ``OPENAI_BASE_URL``, e.g.
    #: ``http://127.0.0.1:11434/v1`` for Ollama, and ``OPENAI_API_KEY``; unset: api.openai.com).
    model: Literal["scripted", "openai"] = "scripted"
    #: Model name asked for when a session names none (``POST /sessions`` ``model``).
    openai_model: str = ""
    #: Times a request that met a 429, a 5xx or a connection error is tried again (with
    #: exponential back-off from 0.2 s up to 5 s) before its turn ends ``failed``.
    openai_max_retries: int = Field(default=4, ge=0, le=20)
    #: Model output is untrusted input (``orchestrator/untrusted.py``). Most UTF-8 bytes of
    #: text one model step may say: past them the request is stopped and the turn ends
    #: ``failed`` (what was said up to the bound is kept).
    model_text_max_bytes: int = Field(default=1_048_576, ge=1)
    #: Model steps one turn may take; the turn then ends with ``max_turn_requests``.
    max_turn_requests: int = Field(default=500, ge=1)
    #: Tools offered to models: a comma list of ``shell``, ``start_job``, ``spawn_subagent``,
    #: ``set_reminder`` (``orchestrator/turn/toolbox.py``'s tools); empty: none. Any other name is
    #: refused at startup (exit status 2, naming it and the known ones).
    tools: str = ",".join(TOOL_NAMES)
    #: How the process trees of jobs and ``shell`` tool calls are contained
    #: (``orchestrator/process/containment.py``): ``auto`` (the first the host allows), ``cgroup``,
    #: ``pid-namespace``, ``subreaper`` or ``process-group``.
    containment: Literal["auto", "cgroup", "pid-namespace", "subreaper", "process-group"] = "auto"

    #: The TOML file describing the external agents sessions may run (Codex, Claude Code,
    #: Gemini CLI, any ACP agent: ``orchestrator/agents/definitions.py``); unset: none.
    agents_file: Path | None = None
    #: The agent a new session runs when it names none (one of ``FLEET_AGENTS_FILE``); empty:
    #: the built-in model (``FLEET_MODEL``).
    agent: str = ""

    _check_tools = field_validator("tools")(_known_tools)

    def require_redis_url(self) -> str:
        """``redis_url``, checked: raises ``MissingRedisUrl`` (with what to do) when it is
        unset or not a ``redis://``, ``rediss://``, ``unix://`` or ``sentinel://`` URL."""
        url = self.redis_url
        if not url:
            raise MissingRedisUrl(
                "FLEET_REDIS_URL is not set. Point it at your Redis (redis://host:6379/0), or "
                "use `fleet up` / `fleet demo`, which start an embedded Redis."
            )
        if not url.startswith(REDIS_SCHEMES):
            raise MissingRedisUrl(
                "FLEET_REDIS_URL must start with redis://, rediss://, unix:// or sentinel:// "
                f"(got {url!r})."
            )
        return url


@lru_cache(maxsize=1)
def get_settings() -> FleetSettings:
    """The settings of the environment, read once per process, for the entry points of
    ``api/`` (the CLI's commands, ``create_app`` without settings); ``orchestrator/`` reads
    none itself: it is handed the settings (``Store.settings``) or the values."""
    return FleetSettings()
