"""The Celery app: broker, queues (declared with kombu), routing and events.

Importing this module builds no app and imports no task code: ``create_app(settings)`` builds
one from the settings its entry point read (``fleet worker``, ``fleet beat``, ``fleet flower``,
``celery -A workers.main``, or the dispatcher the interfaces send through). Workers load the
task modules through ``include`` (they declare ``shared_task``, so they bind to the app the
worker runs), while the interfaces only send tasks by name (``workers.dispatch``).

Queues, task modules and queue lists per family come from the family registry
(``orchestrator.families``). Every worker lists its control queue before its work queue and
the Redis transport polls them in that order (``queue_order_strategy: priority``), so a stop
never waits behind queued work. Steps are acknowledged late and rejected on worker loss, so a
step whose worker died is redelivered and meets the gate again.
"""

from __future__ import annotations

from typing import Any

import click
from celery import Celery
from kombu.entity import Queue

from orchestrator import families
from orchestrator.families import Family
from orchestrator.settings import FleetSettings
from orchestrator.storage.keys import BROKER_UNACKED, Keys
from orchestrator.storage.redisconn import SentinelOptions, connection_options, is_sentinel

TASK_MODULES = [
    *(spec.task_module for spec in families.families()),
    "workers.tasks.maintenance",
    "workers.tasks.ops",
    "workers.heartbeat",
    # Not tasks: the background loops of each family's workers (started on worker_ready):
    # the turn sweeper of turn workers (the poller and the reconciler register beside their
    # tasks).
    "workers.periodic",
    "workers.sweeper",
    # Not tasks: connects Celery's setup_logging signal (loaded before logging is set up).
    "workers.logs",
]


def static_queues() -> list[Queue]:
    """Every queue whose name does not depend on a host, each family's in registry order."""
    names = dict.fromkeys(q for spec in families.families() for q in spec.static_queues())
    return [Queue(name, routing_key=name) for name in names]


def worker_queues(family: str, host: str) -> list[str]:
    """The queues a worker of ``family`` on ``host`` consumes, control queues first (its
    registry entry's ``worker_queues``). Raises ``UnknownFamily``."""
    return families.get(family).worker_queues(host)


#: Seconds a reply on a broker connection may take before the connection counts as lost
#: (a ``redis.TimeoutError``: the consumer reconnects, a publish is retried on a new
#: connection). Without one, a connection that went silent (a primary hung or gone without a
#: reset) held the worker's main thread forever in the reply to an event's PUBLISH. Longer
#: than kombu's server-side BRPOP wait (1 s) and than a slow fsync of ``appendfsync always``.
BROKER_SOCKET_TIMEOUT = 5.0
#: Seconds to open a broker connection.
BROKER_CONNECT_TIMEOUT = 2.0
#: Seconds between kombu's checks of the consumer's BRPOP and pub/sub connections (a BRPOP
#: reply overdue by this much more than the 1 s wait drops the connection; two unanswered
#: PINGs drop a pub/sub one), and the idle time after which redis-py PINGs a broker
#: connection before using it: a consumer on a silent connection reconnects within about
#: 1 + 2 x this.
BROKER_HEALTH_CHECK_INTERVAL = 5


def broker_connection_options() -> dict[str, Any]:
    """kombu transport options bounding every broker connection: ``BROKER_SOCKET_TIMEOUT``,
    ``BROKER_CONNECT_TIMEOUT``, TCP keepalive and ``BROKER_HEALTH_CHECK_INTERVAL``
    (``orchestrator.storage.redisconn.connection_options``)."""
    return connection_options(
        BROKER_SOCKET_TIMEOUT, BROKER_CONNECT_TIMEOUT, BROKER_HEALTH_CHECK_INTERVAL
    )


def broker_transport(url: str) -> str:
    """The fleet's transport class for a broker ``url`` (``sentinel://`` or one Redis)."""
    return "workers.broker:SentinelTransport" if is_sentinel(url) else "workers.broker:Transport"


def sentinel_transport_options(url: str, settings: FleetSettings) -> dict[str, Any]:
    """kombu's Sentinel options for ``url`` (none for one Redis): the primary's name and the
    Sentinels' own credentials and timeouts."""
    if not is_sentinel(url):
        return {}
    options = SentinelOptions.from_settings(settings)
    timeouts = connection_options(2.0, 1.0)
    return {"master_name": options.master, "sentinel_kwargs": options.sentinel_kwargs(timeouts)}


def configure(app: Celery, settings: FleetSettings) -> None:
    """Apply agent-fleet's Celery configuration for ``settings`` to ``app``. Raises
    ``MissingRedisUrl`` when ``settings.redis_url`` is unset (there is no default broker)."""
    url = settings.require_redis_url()
    keys = Keys(settings.key_prefix)
    app.conf.update(
        broker_url=url,
        # kombu's Redis transport, made to reconnect on a restarting, failed-over or full
        # server instead of ending the worker (workers/broker.py says why); its Sentinel
        # variant for a sentinel:// URL (orchestrator/storage/redisconn.py).
        broker_transport=broker_transport(url),
        broker_connection_retry_on_startup=True,
        # A worker never gives up on the broker: it reconnects with back-off for as long as
        # Redis is away (the default ends the worker after 100 failed attempts).
        broker_connection_max_retries=None,
        broker_connection_timeout=BROKER_CONNECT_TIMEOUT,
        broker_transport_options={
            # Every broker connection (consumer, producers, events, remote control) is
            # bounded: a silent connection is noticed within seconds and replaced.
            **broker_connection_options(),
            # Broker keys live under the fleet's prefix, beside its state, named by
            # orchestrator/storage/keys.py (the turn sweeper looks for a step's message in them).
            "global_keyprefix": keys.broker_prefix,
            "unacked_key": BROKER_UNACKED,
            "queue_order_strategy": "priority",
            "visibility_timeout": settings.visibility_timeout_seconds,
            # kombu sweeps for messages past the visibility timeout only every interval x
            # throttle seconds (100 s by default), whatever the timeout: sweep every third of
            # it (at most 10 s) so a step whose worker died comes back about on time.
            "unacked_restore_interval": min(
                10.0, max(1.0, settings.visibility_timeout_seconds / 3)
            ),
            "unacked_restore_throttle": 1,
            **sentinel_transport_options(url, settings),
        },
        task_queues=static_queues(),
        task_default_queue=families.work_queue(Family.TURN),
        task_create_missing_queues=True,
        task_ignore_result=True,
        task_acks_late=True,
        # Retrying a task republishes it: wait out a Redis restart (about 20 s) before
        # giving up. A retry whose publish still fails ends as Reject(requeue=False); what
        # repairs that work is listed in workers/retry.py.
        task_publish_retry_policy={
            "max_retries": 20,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 2.0,
        },
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        # Task events go out 0.1 s late, several to a publish (workers/events.py).
        worker_consumer="workers.events:Consumer",
        task_send_sent_event=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        enable_utc=True,
    )


def create_app(settings: FleetSettings) -> Celery:
    """A Celery app for ``settings``: agent-fleet's configuration, the task modules to load in
    a worker, every task a ``FleetTask`` (retries on store and broker failures,
    workers/retry.py) and the heartbeat bootstep in each consumer. Raises ``MissingRedisUrl``
    without a Redis URL."""
    app = Celery("agent_fleet", include=TASK_MODULES, task_cls="workers.retry:FleetTask")
    configure(app, settings)
    # By name: the heartbeat module needs the worker's runtime, which needs this app.
    app.steps["consumer"].add("workers.heartbeat:Heartbeat")
    # The worker's role (workers.runtime.Role, read as it starts): options of its command line.
    app.user_options["worker"].add(
        click.Option(
            ["--family"],
            default="",
            help="The family this worker serves: turn, job, subagent or reminder.",
        )
    )
    app.user_options["worker"].add(
        click.Option(
            ["--control"],
            is_flag=True,
            default=False,
            help="Consume only the family's control queue (<family>.ctl, beside -Q and -n).",
        )
    )
    return app
