"""The settings model stays small and documented: at most ``MOST_SETTINGS`` ``FLEET_*``
variables, each with its ``#:`` comment and its row in the generated configuration reference.
A bound that no operator would change is a named constant beside its use, a worker's role an
option of the command that starts it."""

from __future__ import annotations

from pathlib import Path

from api import docs_gen
from orchestrator.settings import FleetSettings

ROOT = Path(__file__).resolve().parents[2]
#: The most ``FLEET_*`` settings the fleet may have.
MOST_SETTINGS = 38


def test_the_settings_stay_few() -> None:
    names = sorted(FleetSettings.model_fields)
    assert len(names) <= MOST_SETTINGS, (len(names), names)


def test_every_setting_has_its_comment_and_its_row_in_the_reference() -> None:
    comments = docs_gen.field_comments(FleetSettings)  # raises naming a field without one
    page = (ROOT / docs_gen.CONFIG_PAGE).read_text()
    for name in FleetSettings.model_fields:
        assert comments[name].strip(), name
        assert f"| `FLEET_{name.upper()}` |" in page, name
