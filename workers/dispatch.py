"""``Dispatcher`` for Celery: sends a task by name to a named queue and returns.

``send_many`` publishes the messages of one operation (an archive's stops, a batch of
reminder fires) through kombu's producer batch: every message and its ``task-sent`` event is
buffered, then written in one pipelined round trip to Redis. The messages are ordinary Celery
messages, as Celery builds and publishes them (``app.amqp.create_task_message`` and
``app.amqp.send_task_message``, the two halves of ``send_task``): workers consume them
unchanged and Flower sees them. What ``send_task`` would work out again for every message is
worked out once per dispatcher instead:

* the route of a (task, queue) pair (``app.amqp.router``), its queue bound to a channel once,
  so kombu's declaration cache is consulted without copying the queue for every publish;
* one ``task-sent`` event dispatcher, its exchange bound the same way;
* the message itself, as a template (``workers.messages``): the first message of a (task,
  queue) pair is built and published by Celery while the batch records the commands it
  writes; later ones are rendered from what was recorded, filling in only what varies (ids,
  arguments, clock, time), and buffered in the same pipeline. A pair whose first message
  cannot be rendered back byte for byte stays with Celery.

Templates are not used, and every message is built by Celery, while anything could make
Celery write something else: task protocol other than 2 (the configuration is read at the
first batch), a serializer other than ``json``,
compression, a receiver of ``before_task_publish``/``after_task_publish``/``task_sent``, a
result backend that acts on each send, events of sent tasks turned off, or a broker transport
other than the fleet's Redis one (``workers.broker``).

Where ``send_task`` would do more than that for a message, the message is sent with
``send_task`` itself: inside a worker task (the message carries the task's root and parent
ids), for a task registered in this process (its options apply), or when ``task_routes`` is
configured (a router may look at the arguments).

Transient broker errors are retried with tenacity for a short, bounded time (three attempts,
none begun after ``PUBLISH_RETRY_WINDOW``; each bounded by the broker's socket timeout,
``workers.app``); the last error is raised to the caller (``send``) or reported per message
(``send_many``). A retried batch may
publish some of its messages twice; every message this is used for is idempotent (a stop names
the exact items it stops, a reminder fire spends the reminder once).
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

from celery import Celery, signals
from celery.backends.base import BaseBackend
from celery.events.dispatcher import EventDispatcher
from celery.utils import uuid
from celery.utils.time import utcoffset
from kombu.exceptions import OperationalError
from kombu.messaging import Producer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from orchestrator.families import Message, message_id
from orchestrator.storage.redisconn import TRANSIENT_REPLIES
from workers import messages
from workers.app import BROKER_SOCKET_TIMEOUT
from workers.broker import PublishBatch

#: Seconds after which a failed publish is not tried again: a publish that failed because
#: its connection went silent took ``BROKER_SOCKET_TIMEOUT`` (5 s) and is tried once more on a
#: new connection, so a broker that never answers costs a caller (an archive's stop fan-out
#: in the API, already written) about 10 s, not three timeouts.
PUBLISH_RETRY_WINDOW = 1.5 * BROKER_SOCKET_TIMEOUT

_transient = retry(
    retry=retry_if_exception_type(
        (OperationalError, RedisConnectionError, RedisTimeoutError, *TRANSIENT_REPLIES)
    ),
    stop=stop_after_attempt(3) | stop_after_delay(PUBLISH_RETRY_WINDOW),
    wait=wait_exponential(multiplier=0.05, max=0.3),
    reraise=True,
)

#: The publish options of a (task, queue) pair (``send_task_message`` keywords), or ``None``
#: when its messages go through ``send_task``.
_Route = dict[str, Any] | None


class CeleryDispatcher:
    """Publishes through ``app`` by task name (no task code imported)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._routes: dict[tuple[str, str], _Route] = {}
        self._events: EventDispatcher | None = None
        self._templates = messages.Templates()
        self._configured_for_templates: bool | None = None

    @_transient
    def send(self, task: str, args: list[Any], queue: str) -> None:
        """Send ``task`` with positional ``args`` to ``queue``. Raises the broker's error after
        three attempts."""
        self._send_task(None, task, args, queue)

    def send_many(self, messages: list[Message]) -> list[Exception | None]:
        """Publish ``(task, args, queue)`` messages in one pipelined write; return, per
        message, the error that kept it from being published (the batch's last error, after
        three attempts) or ``None``. Never raises."""
        if not messages:
            return []
        try:
            self._publish_batch(messages)
        except Exception as exc:  # contained: reported per message, as the protocol says
            return [exc] * len(messages)
        return [None] * len(messages)

    @_transient
    def _publish_batch(self, messages: list[Message]) -> None:
        app = self.app
        with app.producer_or_acquire() as producer, producer.batch() as batch:
            if app.current_worker_task is not None:
                for task, args, queue in messages:
                    self._send_task(producer, task, args, queue)
                return
            events = self._event_dispatcher(producer)
            session = self._template_session(producer, batch)
            declared: set[str] = set()
            for task, args, queue in messages:
                options = self._route(producer, task, queue)
                if options is None:
                    self._send_task(producer, task, args, queue)
                    continue
                template = None if session is None else self._templates.get((task, queue))
                if template is None:
                    learn = session if not self._templates.known((task, queue)) else None
                    self._send_built(producer, (task, queue), args, options, events, learn)
                    continue
                assert session is not None
                if not declared:  # as Celery declares the event exchange for each event
                    producer.maybe_declare(events.exchange)
                if queue not in declared:
                    producer.maybe_declare(options["queue"])
                    declared.add(queue)
                session.put(
                    template.commands(
                        message_id(task, args) or uuid(),
                        args,
                        app.thread_oid,
                        (uuid(), uuid()),
                        events.clock.forward(),
                        time.time(),
                        utcoffset(),
                    )
                )

    def _send_built(
        self,
        producer: Producer,
        pair: tuple[str, str],
        args: list[Any],
        options: dict[str, Any],
        events: EventDispatcher,
        learn: PublishBatch | None = None,
    ) -> None:
        """Build and publish one message as ``send_task`` would for a task it does not know,
        sent from outside any task (the same message, the same ``task-sent`` event); with
        ``learn`` (the batch it goes through), record what it writes and learn the pair's
        template from it."""
        app, task = self.app, pair[0]
        task_id, reply_to = message_id(task, args) or uuid(), app.thread_oid
        message = app.amqp.create_task_message(
            task_id,
            task,
            args,
            None,
            reply_to=reply_to,
            create_sent_event=app.conf.task_send_sent_event,
            ignore_result=None,
        )
        app.backend.on_task_call(producer, task_id)
        if learn is None:
            app.amqp.send_task_message(producer, task, message, event_dispatcher=events, **options)
            return
        recorded: list[list[Any]] = []
        learn.recording = recorded
        try:
            app.amqp.send_task_message(producer, task, message, event_dispatcher=events, **options)
        finally:
            learn.recording = None
        template = messages.learn(recorded, task_id, args, reply_to, self._reprs())
        self._templates.put(pair, template)

    def _template_session(self, producer: Producer, batch: Any) -> PublishBatch | None:
        """The fleet's publish batch of ``batch`` when templates may be used (the module
        docstring lists when not), else ``None``."""
        if self._configured_for_templates is None:
            # Read at the first batch, like the routes: configuration is set before sending
            # (a template holds the options of its first message as they were then).
            app, conf = self.app, self.app.conf
            self._configured_for_templates = not (
                conf.task_protocol != 2
                or conf.task_serializer != "json"
                or conf.task_compression
                or not conf.task_send_sent_event
                or type(app.backend).on_task_call is not BaseBackend.on_task_call
            )
        if (
            not self._configured_for_templates
            or signals.before_task_publish.receivers
            or signals.after_task_publish.receivers
            or signals.task_sent.receivers
        ):
            return None
        # kombu's producer batch makes its transport's batch on the first publish; asked for
        # it here, it makes it now (the same one the publishes below go through).
        session = batch.state._get_session(producer.channel)
        return session if isinstance(session, PublishBatch) else None

    def _reprs(self) -> Any:
        """``argsrepr`` as this app's ``create_task_message`` writes it."""
        app = self.app
        return partial(
            messages.args_repr,
            maxlen=app.amqp.argsrepr_maxsize,
            maxlevels=app.conf.task_repr_maxlevels,
        )

    def _send_task(self, producer: Producer | None, task: str, args: list[Any], queue: str) -> None:
        """``send_task`` of one message, through ``producer`` (``None``: one of the app's
        pool)."""
        self.app.send_task(
            task,
            args=args,
            queue=queue,
            routing_key=queue,
            retry=False,
            producer=producer,
            task_id=message_id(task, args),
        )

    def _route(self, producer: Producer, task: str, queue: str) -> _Route:
        """The publish options ``send_task`` would use for ``task`` to ``queue`` (worked out
        once), or ``None`` when ``send_task`` must decide per message."""
        key = (task, queue)
        if key not in self._routes:
            app = self.app
            if app.conf.task_routes or (app.finalized and task in app.tasks):
                self._routes[key] = None
            else:
                options = app.amqp.router.route(
                    {"queue": queue, "routing_key": queue, "retry": False}, task
                )
                # Bound once: kombu then checks its per-connection declaration cache without
                # binding a fresh copy of the queue for each message (the declaration itself
                # is made on the publishing channel).
                options["queue"] = options["queue"].bind(producer.channel)
                self._routes[key] = options
        return self._routes[key]

    def _event_dispatcher(self, producer: Producer) -> EventDispatcher:
        """One ``task-sent`` dispatcher per process (an event names its sender's pid), its
        exchange bound once (as the queues are)."""
        events = self._events
        if events is None or events.pid != os.getpid():
            events = self.app.events.Dispatcher(enabled=False)
            events.exchange = events.exchange.bind(producer.channel)
            self._events = events
        return events
