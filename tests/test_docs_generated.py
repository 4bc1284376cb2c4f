"""The documentation's generated pages match the code: the configuration reference is what
``python -m api.docs_gen`` writes from the settings model, the REST reference what it writes
from the OpenAPI document. A setting or a route changed without rerunning the generator fails
here, naming the page."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from api import docs_gen
from orchestrator.settings import FleetSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def _same(page: Path, text: str) -> None:
    committed = (ROOT / page).read_text()
    if committed != text:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{page} (committed)",
                tofile=f"{page} (generated)",
                n=1,
            )
        )
        pytest.fail(f"{page} is out of date: run `python -m api.docs_gen`\n{diff[:4000]}")


def test_the_configuration_reference_is_generated_from_the_settings_model() -> None:
    _same(docs_gen.CONFIG_PAGE, docs_gen.configuration_page())


def test_the_rest_reference_is_generated_from_the_openapi_document() -> None:
    _same(docs_gen.REST_PAGE, docs_gen.rest_page())


def test_every_setting_has_a_row_and_its_own_meaning() -> None:
    text = (ROOT / docs_gen.CONFIG_PAGE).read_text()
    for name in FleetSettings.model_fields:
        assert f"| `FLEET_{name.upper()}` |" in text, name
    comments = docs_gen.field_comments(FleetSettings)
    assert set(comments) == set(FleetSettings.model_fields)


def test_the_generator_does_not_depend_on_the_machine_it_runs_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Defaults computed at start-up (the state directory, the host name) are written as
    what they mean, not as this machine's values; ``FLEET_*`` variables of the environment
    do not leak into the page."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEET_API_PORT", "9999")
    monkeypatch.setenv("FLEET_HOSTNAME", "somewhere-else")
    text = docs_gen.configuration_page()
    assert str(tmp_path) not in text and os.uname().nodename not in text
    assert "9999" not in text and "somewhere-else" not in text


def test_a_setting_without_a_comment_is_refused() -> None:
    class Undocumented(BaseSettings):
        #: Documented.
        first: int = 1

        second: str = ""

    with pytest.raises(ValueError, match="'second'"):
        docs_gen.field_comments(Undocumented)


def test_check_mode_names_a_stale_page(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert docs_gen.main([]) == 0
    assert docs_gen.main(["--check"]) == 0
    (tmp_path / docs_gen.CONFIG_PAGE).write_text("stale\n")
    assert docs_gen.main(["--check"]) == 1
    assert str(docs_gen.CONFIG_PAGE) in capsys.readouterr().err
