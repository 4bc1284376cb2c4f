"""Property-based fuzzing of the REST API with schemathesis, from the OpenAPI document of
``api.rest.create_app()`` served in process (ASGI), against the real test Redis.

Every operation but the SSE stream (``GET /events`` never ends) and the readiness probe (503
by design when no workers run) is called with generated inputs, valid and invalid (schema
mutations), and each answer is checked: no 5xx (``not_a_server_error``), the status and body
conform to the document (``status_code_conformance``, ``response_schema_conformance``; every
error is documented as the one shape ``{"error": {"code", "message", "data"}}``), and an error
message is never empty nor "Internal Server Error". Celery is replaced by a
``RecordingDispatcher`` so that nothing is sent to workers.

The number of inputs per operation is printed (run with ``-s`` to see it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

import api.rest
from orchestrator.settings import FleetSettings
from tests.helpers import RecordingDispatcher

pytestmark = pytest.mark.redis

SKIPPED = {("GET", "/events"), ("GET", "/ready")}
PER_OPERATION = 50
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    settings = FleetSettings(api_token="")
    yield api.rest.create_app(settings, dispatcher=RecordingDispatcher())


def _operations(schema: Any) -> list[Any]:
    out = []
    for result in schema.get_all_operations():
        op = result.ok()
        if (op.method.upper(), op.path) not in SKIPPED:
            out.append(op)
    return out


def _negative(op: Any) -> Any:
    """Invalid inputs (schema mutations) for ``op``; none when nothing in it can be broken."""
    try:
        return op.as_strategy(GenerationMode.NEGATIVE)
    except Exception:  # an operation without parameters has nothing to mutate
        return st.nothing()


STATUSES: Counter[int] = Counter()


def _fuzzer(op: Any, label: str, counts: dict[str, int]) -> Any:
    @settings(
        max_examples=PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(op.as_strategy(GenerationMode.POSITIVE), _negative(op)))
    def run(case: Any) -> None:
        counts[label] += 1
        response = case.call()
        STATUSES[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)
        if response.status_code >= 400:
            # schemathesis's headers map a name to a list of values.
            kind = " ".join(response.headers.get("content-type") or [])
            assert "application/json" in kind, (response.status_code, kind, response.text)
            message = response.json()["error"]["message"]
            assert message.strip() and message != "Internal Server Error", response.text

    return run


def test_rest_api_survives_fuzzing(app: Any) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = _operations(schema)
    assert len(operations) >= 15, [o.path for o in operations]
    counts: dict[str, int] = {}
    failures: list[str] = []

    for op in operations:
        label = f"{op.method.upper()} {op.path}"
        counts[label] = 0

        run = _fuzzer(op, label, counts)
        try:
            run()
        except Exception as exc:  # keep fuzzing the other operations; report them all
            failures.append(f"{label}: {exc}")

    total = sum(counts.values())
    print(f"\nREST fuzz inputs per operation ({total} in all):")
    for label, n in sorted(counts.items()):
        print(f"  {n:4d}  {label}")
    print("  statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(STATUSES.items())))
    assert not failures, "\n\n".join(failures)
