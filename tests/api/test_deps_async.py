"""Every dependency the routes take from ``api/deps.py`` is a coroutine function: FastAPI runs
a plain ``def`` dependency in its thread pool, a thread hop per dependency per request (the
archive route paid seven before this)."""

from __future__ import annotations

import inspect
from typing import Any, get_args

import pytest

from api import deps

pytestmark = pytest.mark.unit


def _call(annotated: Any) -> Any:
    return get_args(annotated)[1].dependency


@pytest.mark.parametrize(
    "dependency",
    [
        deps.authorize,
        deps.strict_request,
        *(
            _call(annotated)
            for annotated in (deps.StoreDep, deps.DispatcherDep, deps.SettingsDep, deps.WiringDep)
        ),
    ],
    ids=lambda d: d.__name__,
)
def test_a_route_dependency_runs_on_the_event_loop(dependency: Any) -> None:
    assert inspect.iscoroutinefunction(dependency)


def test_every_auth_dependency_is_a_coroutine_function() -> None:
    assert all(inspect.iscoroutinefunction(d.dependency) for d in deps.AUTH)
