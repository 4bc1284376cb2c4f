"""The README stays a front page: at most 150 lines, its two commands first (the second is
what ``.ci/run`` runs, verbatim), and every link in it leads to a page that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_readme_fits_on_a_screen_or_two() -> None:
    assert len(README.splitlines()) <= 150


def test_its_first_block_holds_the_two_commands_and_ci_runs_the_second() -> None:
    block = re.match(r"# agent-fleet\n\n```sh\n(.*?)```", README, re.S)
    assert block, "the README opens with its commands"
    install, test = block.group(1).splitlines()
    assert install.endswith("pip install -e '.[embedded]' && fleet demo")
    assert test == "pip install -e '.[test]' && pytest"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, ".ci/run runs the README's test command verbatim"


def test_every_link_of_the_readme_leads_to_a_file() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).is_file(), link
