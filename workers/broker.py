"""The Redis broker transport of the fleet: kombu's, made to ride out Redis restarts, failovers
and a full server instead of ending the worker.

``workers.app`` selects it with ``broker_transport = "workers.broker:Transport"`` (the URL stays
``redis://``), or ``"workers.broker:SentinelTransport"`` for a ``sentinel://`` URL (kombu's
Sentinel transport with the same changes). Four differences from
``kombu.transport.redis.Transport``, each for a failure seen with real processes (the
worker-broker fault tests, the fault soak):

* **More replies count as a lost connection.** Celery's consumer restarts (reconnects with
  back-off) only on the transport's ``connection_errors``; anything else is "Unrecoverable"
  and ends the worker. kombu lists ``BusyLoadingError`` (a restarted server loading its
  append-only file) but not ``OutOfMemoryError`` (``maxmemory`` with ``noeviction`` refuses the
  unacked-record write that follows every ``BRPOP``), ``ReadOnlyError`` (a failover left us on
  a replica), ``MasterDownError`` or ``NoReplicasError`` (a primary with
  ``min-replicas-to-write`` whose replicas are gone refuses ``BRPOP``, a write): all pass
  once the server recovers, so they are connection errors here
  (``orchestrator.storage.redisconn.TRANSIENT_REPLIES``).
* **A message popped but not recorded is handed back.** ``BRPOP`` is allowed on a full server
  but the write that records the message as unacknowledged is not, so the message would exist
  only in this process. It is held here and pushed back to the head of its queue before the
  reconnected consumer consumes again (while that fails, the consumer keeps reconnecting
  instead of popping more). A worker killed while it holds one loses it, as with kombu alone;
  the stuck-turn sweeper, reminder re-claims and the archive reconciler repair that.
* **An ack or reject Redis refuses still frees the message's prefetch slot.** kombu frees
  the slot only after the write that drops the unacked record; on a full server that write is
  refused, Celery logs "Couldn't ack" and goes on, and the slot stays taken. Once every slot
  was, the worker never asked for a message again (seen in the fault soak: a turn worker idle
  until shut down). The record stays and the message comes back after the visibility timeout.
* **A closed transport is a connection error, not an AttributeError.** On a lost connection
  Celery's consumer calls ``Connection.collect()``, which closes the default channel and then
  the transport (``transport.client = None``); when that channel's close failed half-way
  (Redis was down), the later ``connection.close()`` closes it again, and restoring its
  unacknowledged messages builds a new client pool from ``transport.client.hostname``:
  ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which ``ignore_errors``
  does not ignore, so the worker exited (celery/kombu#582 is the same path). Raising
  ``redis.ConnectionError`` there lets the close be ignored; the messages stay in the unacked
  hash and come back after the visibility timeout, as for any lost worker.

Two more, for speed:

* **A channel keeps one Redis client over its connection pool.** kombu builds a new client
  object for every publish, publish batch and queue operation (``conn_or_acquire``), which
  costs more CPU than building a message (redis-py sets up its reply parsers per client). A
  client over a pool is safe to share (each command checks a connection out of the pool), so
  the channel keeps one, and builds a new one when the pool is replaced (after a lost
  connection kombu drops its pools).
* **A pipeline goes out in one socket write.** redis-py cuts a pipeline into pieces of about
  6 kB and writes each; the server may read the first piece alone and, appending to its
  append-only file with ``appendfsync always``, fsync once per piece before it answers. A
  publish batch (an archive's four stops and their events are about 8 kB) is joined into one
  write, up to ``ONE_WRITE_MAX`` bytes, so it costs one fsync.

Nothing here patches kombu: these are subclasses wired in by configuration. They override or
call private parts of ``kombu.transport.redis``, which is why ``pyproject.toml`` pins ``kombu``
(and ``celery``) below their next minor, to be checked again on each upgrade:

- ``Channel._connparams`` (overridden), ``Channel._create_client`` and
  ``Channel._do_restore_message`` (called), ``Channel.conn_or_acquire`` (overridden),
  ``Channel.pool`` (read) and ``Channel.create_publish_batch`` (overridden);
- ``QoS.append``, ``QoS.ack`` and ``QoS.reject`` (overridden), with the slot bookkeeping of
  ``kombu.transport.virtual.QoS.ack`` called past the Redis QoS, and a message's ``_raw``;
- ``PublishBatch.publish`` and ``PublishBatch.add`` (overridden) and its ``_buffered``,
  ``_failed``, ``max_size`` and ``pipeline``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils.json import dumps
from redis import exceptions as redis_errors

from orchestrator.storage.redisconn import TRANSIENT_REPLIES

log = logging.getLogger(__name__)

#: The largest pipeline joined into one socket write (bytes); larger ones go as redis-py cuts them.
ONE_WRITE_MAX = 64 * 1024

_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    *kombu_redis.Transport.connection_errors,
    *TRANSIENT_REPLIES,
)


class _Held:
    """Messages popped from a queue whose unacknowledged record could not be written:
    ``(payload, exchange, routing key)``, oldest first, shared by the process's channels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[dict[str, Any], str, str]] = []

    def add(self, payload: dict[str, Any], exchange: str, routing_key: str) -> None:
        with self._lock:
            self._items.append((payload, exchange, routing_key))

    def give_back(self, channel: kombu_redis.Channel) -> None:
        """Push every held message back to the consuming end of its queue. Raises the
        connection error that stopped it; what was not pushed stays held."""
        with self._lock:
            if not self._items:
                return
            with channel.conn_or_acquire() as client:
                while self._items:
                    payload, exchange, routing_key = self._items[0]
                    channel._do_restore_message(payload, exchange, routing_key, client)
                    self._items.pop(0)
                    log.warning("gave a message back to %s after a refused ack record", routing_key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


HELD = _Held()


class QoS(kombu_redis.QoS):
    """kombu's QoS; a message whose unacked record is refused is held for re-queueing, and an
    ack or reject that Redis refuses still frees the message's prefetch slot. The record's
    two writes (``ZADD`` to the index, ``HSET`` of the message) go as a plain pipeline, not
    ``MULTI``/``EXEC``: one socket write whose commands Redis runs back to back, two commands
    fewer per message. On a full server both are refused (each may grow memory), as the
    transaction was. The ack's two deletions stay a transaction: Redis refuses a transaction
    on a full server, so the ack is refused and its record kept, as the refusal above
    describes."""

    def append(self, message: Any, delivery_tag: str) -> None:
        info = message.delivery_info
        record = dumps([message._raw, info["exchange"], info["routing_key"]])
        try:
            with self.channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
                pipe.hset(self.unacked_key, delivery_tag, record)
                pipe.execute()
        except _CONNECTION_ERRORS:
            HELD.add(message._raw, info["exchange"], info["routing_key"])
            log.warning("message %s held: its unacknowledged record was refused", delivery_tag)
            raise
        kombu_virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        try:
            super().ack(delivery_tag)
        except Exception:
            self._release(delivery_tag, "ack")
            raise

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)
        except Exception:
            self._release(delivery_tag, "reject")
            raise

    def _release(self, delivery_tag: str, what: str) -> None:
        """Free the slot of a message whose ack or reject Redis refused (a full server, a lost
        connection). kombu frees it only after the write, so each refusal kept one slot taken
        and, once all ``prefetch_count`` were, the consumer never asked for a message again:
        a worker stayed up and idle for good after a ``maxmemory`` squeeze. The message's
        unacked record stays, so it comes back after the visibility timeout, as a lost
        worker's do (a copy of a finished task, which the fleet's tasks drop)."""
        kombu_virtual.QoS.ack(self, delivery_tag)
        log.warning(
            "%s of message %s not written: slot freed; the message comes back after the "
            "visibility timeout",
            what,
            delivery_tag,
        )


class _OneWrite:
    """Mixed into the broker's Redis connection class: a command packed in several pieces
    (a pipeline) of at most ``ONE_WRITE_MAX`` bytes in all is written in one piece."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if (
            isinstance(command, list)
            and len(command) > 1
            and sum(len(piece) for piece in command) <= ONE_WRITE_MAX
        ):
            command = [b"".join(command)]
        super().send_packed_command(command, check_health)  # type: ignore[misc]


def _one_write(connection_class: type) -> type:
    """``connection_class`` with ``_OneWrite`` mixed in (made when a pool is made: kombu
    makes a class of its own for each asynchronous pool)."""
    return type(f"OneWrite{connection_class.__name__}", (_OneWrite, connection_class), {})


class PublishBatch(kombu_redis.PublishBatch):
    """kombu's publish batch (one pipeline for a producer batch), which can also record the
    commands of each message it buffers and buffer commands rendered elsewhere
    (``workers.messages``) in the same pipeline."""

    #: When a list, the commands of each message published are appended to it (one list per
    #: message), as they are buffered to be written.
    recording: list[list[Any]] | None = None
    _current: list[Any] | None = None

    def publish(self, message: Any, **kwargs: Any) -> Any:
        if self.recording is None:
            return super().publish(message, **kwargs)
        self._current = []
        try:
            result = super().publish(message, **kwargs)
            self.recording.append(self._current)
        finally:
            self._current = None
        return result

    def add(self, name: str, *args: Any) -> None:
        super().add(name, *args)
        if self._current is not None:
            self._current.append((name, args))

    def put(self, commands: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Buffer ``commands`` (``(name, args)``, as ``add`` takes them) as one message's,
        flushing as ``publish`` does when the batch is full. Raises what the pipeline raises;
        the batch is then unusable, as after a failed ``publish``."""
        self._check_usable()
        if self._buffered and self._buffered + len(commands) > self.max_size:
            self.flush()
        try:
            for name, args in commands:
                getattr(self.pipeline, name)(*args)
        except BaseException as exc:
            self._failed = exc
            self._buffered = 0
            self.pipeline.reset()
            raise
        self._buffered += len(commands)
        if self._buffered >= self.max_size:
            self.flush()


class _FleetChannel:
    """What both channels add to kombu's (the module docstring): a closed transport is a
    connection error, and held messages go back before consuming."""

    QoS = QoS
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """``client`` when given, else the channel's client over its current pool (built
        once per pool, as kombu builds one per call)."""
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:  # type: ignore[attr-defined]
            shared = self._shared_client = self._create_client()  # type: ignore[attr-defined]
        yield shared

    def _connparams(self, asynchronous: bool = False) -> Any:
        transport = self.connection  # type: ignore[attr-defined]
        if transport is None or transport.client is None:
            raise redis_errors.ConnectionError("the broker connection is closed")
        params = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]
        params["connection_class"] = _one_write(params["connection_class"])
        return params

    def create_publish_batch(self, max_size: int) -> PublishBatch:
        """A ``PublishBatch`` (above) for a producer batch of at most ``max_size`` commands."""
        return PublishBatch(self, max_size)

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        # Held messages go back first; until they can, consuming more would only hold more.
        HELD.give_back(self)  # type: ignore[arg-type]
        return super().basic_consume(queue, *args, **kwargs)  # type: ignore[misc]


class Channel(_FleetChannel, kombu_redis.Channel):
    """kombu's Redis channel with the fixes described in the module docstring."""


class SentinelChannel(_FleetChannel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (the primary's address is asked of the Sentinels for each new
    connection) with the same fixes."""


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with ``Channel`` above and ``TRANSIENT_REPLIES`` counted as
    connection errors."""

    Channel = Channel
    connection_errors = _CONNECTION_ERRORS


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport (``sentinel://`` URLs, ``master_name`` transport option)
    with ``SentinelChannel`` above and the same connection errors. During a failover the
    old primary's connections fail (refused, or ``READONLY`` once it is a replica, which
    redis-py's Sentinel connection turns into a connection error): the consumer reconnects
    and the Sentinels name the new primary."""

    Channel = SentinelChannel
    connection_errors = _CONNECTION_ERRORS  # type: ignore[assignment]
