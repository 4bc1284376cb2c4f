"""The step runtime: one model step of a turn, as a ``turn.step`` task runs it.

A step asks the gate and begins in one script (``turn_begin_step.lua``: no step is admitted
once an archive commits; a refused step ends its turn ``blocked`` with no model request), then
asks the model (``orchestrator/models/model.py``: it sees the conversation and the tools on offer,
streams its text and answers tool calls and whether the turn ends) and runs the tool calls,
under a ``StepWatch`` (``orchestrator/turn/stepwatch.py``), which keeps the step's lease alive and
polls the turn's state every ``CANCEL_POLL`` s: a stop (a user cancel, an archive) is seen
through the store within that time, whatever message its worker consumes, the model request
is aborted and its output dropped. The turn goes on with another step until the model ends
it or it reaches ``FLEET_MAX_TURN_REQUESTS`` steps (stop reason ``max_turn_requests``); the
text a step says last lands in the script that advances or ends the turn. Every write of the
step is conditional on its turn still running (``turns.record_update``, the guarded tool
launches, the turn's advance and end) and on this copy still owning the step: each copy
begins with a fresh fencing token (``orchestrator/session/fencing.py``), so a copy whose worker
froze
past its lease while another copy began writes nothing more; its watch sees it superseded,
cancels it and drops its output (outcome ``superseded``). A worker that starts shutting down
hands its step on: the request is aborted, the lease dropped and the same step sent again, so
another worker runs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.errors import SessionArchived, SessionNotFound, StepSuperseded, StoreUnavailable
from orchestrator.families import Dispatcher, send_step
from orchestrator.models import chat, usage
from orchestrator.models.model import (
    Model,
    ModelError,
    StepAnswer,
    StepRequest,
    StopReason,
    ToolCall,
)
from orchestrator.session.fencing import StepGuard, new_token
from orchestrator.session.gate import StepRefused, refusal
from orchestrator.session.titles import generated_title, set_title
from orchestrator.storage import metrics
from orchestrator.storage.store import Store, retried
from orchestrator.turn import scripts, toolbox
from orchestrator.turn.agentstep import prompt_agent
from orchestrator.turn.stepwatch import CANCEL_POLL as CANCEL_POLL
from orchestrator.turn.stepwatch import STEP_LEASE_MS as STEP_LEASE_MS
from orchestrator.turn.stepwatch import StepWatch
from orchestrator.turn.turns import (
    Turn,
    TurnState,
    announce_end,
    finish,
    record_update,
    start_turn,
)

log = logging.getLogger(__name__)

#: The step's watch, shared by the process's steps in flight (``orchestrator/turn/stepwatch.py``).
_StepWatch = StepWatch


#: Runs a tool call: (store, dispatcher, session id, the step copy's guard, call, cancel) ->
#: the result text, or ``None`` when the call was aborted (``cancel`` set, or the turn no
#: longer runs); raises ``StepSuperseded`` when another copy of the step began.
ToolRunner = Callable[[Store, Dispatcher, str, StepGuard, ToolCall, threading.Event], str | None]


@dataclass(frozen=True)
class _Ran:
    """A step that ran to its end: ``stop`` ends the turn, ``None`` asks for another step;
    ``said``: the JSON of its last words not landed yet (``""``: none), which land with the
    turn's advance or end, in the same script."""

    stop: StopReason | None
    said: str = ""


class _Emit:
    """The ``emit`` a model step streams its text to. The first piece becomes an
    ``agent_message_chunk`` at once; pieces arriving faster than every ``CANCEL_POLL`` s are
    joined into one chunk, landed by the next piece after that time, the step watch's tick or
    the step's end (``flush``, or ``take`` for the script that advances or ends the turn), so
    a token stream does not cost one conversation entry and one write per token. ``dropped``
    once a chunk could not land (the turn stopped). The step's text is bounded: the piece
    that passes ``max_bytes`` (UTF-8) lands cut to the bound and raises ``ModelError`` (the
    backend stops its request; the turn ends ``failed``)."""

    def __init__(self, store: Store, session_id: str, guard: StepGuard, max_bytes: int) -> None:
        self.store, self.session_id, self.guard = store, session_id, guard
        self.max_bytes = max_bytes
        self.dropped = False
        self._said = 0  # UTF-8 bytes said so far
        self._pending: str | None = None
        self._landed = 0.0  # monotonic time of the last chunk landed (0: none yet)
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            data = text.encode("utf-8", "surrogatepass")
            if self._said + len(data) > self.max_bytes:
                room = max(0, self.max_bytes - self._said)
                self._said = self.max_bytes
                self._pending = (self._pending or "") + data[:room].decode("utf-8", "ignore")
                self._land()
                raise ModelError(
                    f"the model's answer passed {self.max_bytes} bytes of text in one step "
                    "(FLEET_MODEL_TEXT_MAX_BYTES); its request was stopped"
                )
            self._said += len(data)
            self._pending = (self._pending or "") + text
            if time.monotonic() - self._landed >= CANCEL_POLL:
                self._land()

    def flush(self) -> None:
        """Land the text held back, if any."""
        with self._lock:
            self._land()

    def take(self) -> str:
        """The text held back as an update's JSON (``""``: none, or the turn stopped), now
        the caller's to land."""
        with self._lock:
            text, self._pending = self._pending, None
            if text is None or self.dropped:
                return ""
            return json.dumps(_chunk(self.guard.turn_id, text))

    def _land(self) -> None:
        text, self._pending = self._pending, None
        if text is None or self.dropped:
            return
        self._landed = time.monotonic()
        if not _say(self.store, self.session_id, self.guard, text):
            self.dropped = True


def run_step(
    store: Store,
    dispatcher: Dispatcher,
    model: Model,
    tools: ToolRunner,
    session_id: str,
    turn_id: str,
    index: int,
    *,
    stopping: threading.Event | None = None,
) -> str:
    """Run step ``index`` of a turn: gate and step start (one script), model request, tool
    call, then dispatch the next step or end the turn. Safe to run twice for the same step (a
    redelivery): a step that already ran is dropped as ``stale``, one running now as
    ``inflight``, and a copy that began before another one (its worker froze past its lease)
    writes nothing more and is dropped as ``superseded`` (``orchestrator/session/fencing.py``).
    ``stopping`` is the worker's shutdown event: once it is set mid-step the model request is
    aborted, the lease dropped and the same step sent again for another worker (the turn stays
    running at ``index``).

    Returns the outcome: ``ran``, ``completed``, ``refused``, ``cancelled``, ``failed``,
    ``stale``, ``inflight``, ``superseded``, ``handed_off`` or the turn's state when it was no
    longer running. Raises ``StoreUnavailable`` when Redis cannot be read before the step
    began (the caller retries the step later; nothing ran).
    """
    extra = {"session_id": session_id, "turn_id": turn_id}
    guard = StepGuard(turn_id, new_token())
    try:
        began = _begin_step(store, dispatcher, session_id, guard, index)
    except StepRefused as refused:
        metrics.incr(store, metrics.GATE_REFUSALS, refused.reason)
        log.info(
            "step %d of turn %s refused by the gate (%s %s)",
            index,
            turn_id,
            refused.reason,
            refused.holder or "",
            extra=extra,
        )
        return "refused"
    if began != "ok":
        if began == TurnState.CANCELLING.value:
            finish(store, dispatcher, turn_id, TurnState.CANCELLED)
        log.info("step %d of turn %s dropped: %s", index, turn_id, began, extra=extra)
        return str(began)
    try:
        return _run_begun(store, dispatcher, model, tools, guard, began, stopping)
    except StepSuperseded:
        log.warning(
            "step %d of turn %s superseded: another copy began (this worker stalled past its "
            "lease); its output is dropped",
            index,
            turn_id,
            extra=extra,
        )
        return "superseded"
    except StoreUnavailable:
        # Release the step (best effort) so the retried task can begin it again.
        with contextlib.suppress(StoreUnavailable):
            scripts.turn_advance(store, turn_id=turn_id, index=index, token=guard.token)
        raise


def _run_begun(
    store: Store,
    dispatcher: Dispatcher,
    model: Model,
    tools: ToolRunner,
    guard: StepGuard,
    began: _Began,
    stopping: threading.Event | None,
) -> str:
    """The step once begun: model request and tool call under a watch, then what follows.
    Raises ``StepSuperseded``, ``StoreUnavailable``."""
    turn, index = began.turn, began.turn.step
    if index == 0 and turn.source == "prompt" and not began.session_title:
        _generate_title(store, turn.session_id, turn.prompt)
    emit = _Emit(store, turn.session_id, guard, store.settings.model_text_max_bytes)
    with _StepWatch(store, guard, stopping, emit.flush, turn.session_id) as watch:
        try:
            if began.agent:
                stop = prompt_agent(store, turn, began.agent, emit, watch.cancel)
                result = None if stop is None else _Ran(stop, emit.take())
            else:
                result = _act(store, dispatcher, model, tools, began, emit, watch.cancel)
        except ModelError as exc:
            _say(store, turn.session_id, guard, f"error: {exc}")
            finish(store, dispatcher, guard.turn_id, TurnState.FAILED, str(exc), token=guard.token)
            return "failed"
    if watch.superseded:
        raise StepSuperseded(guard.turn_id)
    return _after_step(store, dispatcher, turn, guard, index, result, watch)


class _Began(str):
    """What ``_begin_step`` answers: ``ok`` or why the step is dropped (compared as a
    string); once ``ok``, what the step needs, read by the script that began it: ``turn`` (as
    it runs: its session, prompt, source and step index), the session's title
    (``session_title``), ``model`` and ``agent`` (``""`` when unset)."""

    turn: Turn
    session_title: str
    model: str
    agent: str


def _begin_step(
    store: Store, dispatcher: Dispatcher, session_id: str, guard: StepGuard, index: int
) -> _Began:
    """Ask the gate and begin this copy of the step in one script (``turn_begin_step.lua``,
    which also publishes what it writes to the conversation), its lease holding
    ``guard.token``. Returns ``ok`` (with what the step needs) or why the step is dropped;
    raises ``StepRefused`` once the refused turn has ended."""
    turn_id = guard.turn_id
    result = scripts.turn_begin_step(
        store, turn_id=turn_id, index=index, lease_ms=STEP_LEASE_MS, token=guard.token
    )
    if isinstance(result, scripts.GateRefused):
        reason = result.reason
        announce_end(store, session_id, turn_id, result.ended, f"gate: {reason}")
        if result.promoted:
            send_step(dispatcher, session_id, result.promoted, 0)
        raise refusal(session_id, reason)
    if isinstance(result, scripts.Dropped):
        return _Began(result.why)
    began = _Began("ok")
    began.session_title, began.model, began.agent = result.title, result.model, result.agent
    began.turn = Turn(
        turn_id, result.session_id, TurnState.RUNNING, result.prompt, result.source, index, "", ""
    )
    return began


def _chunk(turn_id: str, text: str) -> dict[str, object]:
    """The ``agent_message_chunk`` update of ``text``."""
    return {
        "sessionUpdate": "agent_message_chunk",
        "turnId": turn_id,
        "content": {"type": "text", "text": text},
    }


def _say(store: Store, session_id: str, guard: StepGuard, text: str) -> bool:
    return record_update(store, session_id, _chunk(guard.turn_id, text), token=guard.token)


def _act(
    store: Store,
    dispatcher: Dispatcher,
    model: Model,
    tools: ToolRunner,
    began: _Began,
    emit: _Emit,
    cancel: threading.Event,
) -> _Ran | None:
    """The model request and the tool calls it asks for. Returns how the step ended, or
    ``None`` when it was aborted (``cancel``) or its turn no longer runs (its output is
    dropped). Raises ``ModelError`` (counted as a failed request)."""
    sid, tid, index = began.turn.session_id, began.turn.turn_id, began.turn.step
    guard = emit.guard

    def may_send() -> bool:
        state = scripts.turn_watch(store, turn_id=tid, lease_ms=None, token=guard.token)
        return state == TurnState.RUNNING.value

    request = StepRequest(
        sid,
        tid,
        index,
        chat.conversation(store, sid),
        toolbox.offered_specs(store.settings.tools),
        began.model,
        may_send,
    )
    started = time.monotonic()
    try:
        try:
            answer = model.step(request, cancel, emit)
        except (ModelError, StoreUnavailable, StepSuperseded):
            raise
        except Exception as exc:
            # A backend that broke on what its server sent (or on a fault of its own) fails
            # its turn once, with what broke: resuming the step would only ask again.
            log.exception("model step of turn %s broke", tid, extra={"session_id": sid})
            raise ModelError(
                f"the model backend broke ({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
    except ModelError:
        usage.record(store, sid, tid, StepAnswer().usage, "failed", time.monotonic() - started)
        emit.flush()
        raise
    aborted = cancel.is_set() or answer.stop is StopReason.CANCELLED
    if aborted or answer.tool_calls:  # the text lands now, before the calls it led to
        emit.flush()
    aborted = aborted or emit.dropped
    outcome = "cancelled" if aborted else "ok"
    usage.record(store, sid, tid, answer.usage, outcome, time.monotonic() - started)
    if aborted:
        return None
    for call in answer.tool_calls:
        if tools(store, dispatcher, sid, guard, call, cancel) is None:
            return None
    return _Ran(answer.stop, emit.take())


def _after_step(
    store: Store,
    dispatcher: Dispatcher,
    turn: Turn,
    guard: StepGuard,
    index: int,
    result: _Ran | None,
    watch: _StepWatch,
) -> str:
    """Dispatch the next step, hand this one on, or end the turn (each only while this copy
    owns the step: ``StepSuperseded`` otherwise)."""
    sid, tid, token = turn.session_id, turn.turn_id, guard.token
    if result is None and watch.handed_off and not watch.stopped:
        # The worker is shutting down: the same step, re-offered, runs on another worker.
        if _advance(store, guard, index) == "ok":
            send_step(dispatcher, sid, tid, index)
            log.info("step %d of turn %s handed on: worker stopping", index, tid)
            return "handed_off"
        finish(store, dispatcher, tid, TurnState.CANCELLED, token=token)
        return "cancelled"
    if result is None or watch.stopped:
        finish(store, dispatcher, tid, TurnState.CANCELLED, token=token)
        return "cancelled"
    stop = result.stop
    if stop is None:
        if index + 1 < store.settings.max_turn_requests:
            if _advance(store, guard, index + 1, result.said) == "ok":
                send_step(dispatcher, sid, tid, index + 1)
                return "ran"
            finish(store, dispatcher, tid, TurnState.CANCELLED, token=token)
            return "cancelled"
        stop = StopReason.MAX_TURN_REQUESTS
    ended = finish(
        store, dispatcher, tid, TurnState.COMPLETED, token=token, stop_reason=stop, said=result.said
    )
    if not ended:
        finish(store, dispatcher, tid, TurnState.CANCELLED, token=token)
        return "cancelled"
    _after_completion(store, dispatcher, turn)
    return "completed"


def _advance(store: Store, guard: StepGuard, next_index: int, said: str = "") -> str:
    """Move the turn to ``next_index`` and drop this copy's lease (``turn_advance.lua``), with
    ``said`` (an update's JSON: the step's last words) landed first. Returns ``ok`` or the
    turn's state; raises ``StepSuperseded``."""
    outcome = scripts.turn_advance(
        store, turn_id=guard.turn_id, index=next_index, token=guard.token, said=said
    )
    if outcome == "superseded":
        raise StepSuperseded(guard.turn_id)
    return outcome


def _generate_title(store: Store, session_id: str, prompt: str) -> None:
    """An untitled session (as its step began) gets a title from its first prompt. The write
    is discarded if a client set a title meanwhile (checked atomically by
    ``titles.set_title``)."""
    try:
        title = generated_title(prompt)
        if title:
            set_title(store, session_id, title, source="generated")
    except StoreUnavailable as exc:  # a title is a nicety; the step goes on
        log.warning("no title generated: %s", exc, extra={"session_id": session_id})


def _after_completion(store: Store, dispatcher: Dispatcher, turn: Turn) -> None:
    """A subagent's finished turn wakes its parent with a short report (a turn of its own,
    which meets the gate like any other)."""
    if turn.source != "subagent":
        return
    parent = _session_field(store, turn.session_id, "parentId")
    if not parent:
        return
    report = f"say subagent {turn.session_id} finished"
    try:
        start_turn(store, dispatcher, parent, report, source="subagent_result")
    except (SessionNotFound, SessionArchived) as exc:
        log.info(
            "parent %s not woken: %s", parent, exc.message, extra={"session_id": turn.session_id}
        )


@retried
def _session_field(store: Store, session_id: str, name: str) -> str | None:
    value: str | None = store.redis.hget(store.keys.session(session_id), name)
    return value
