"""docs/configuration.md names every variable and flag the code reads (gpuquota.entrypoints.docs_config)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.config.settings import SERVICE_SETTINGS
from gpuquota.entrypoints import docs_config
from gpuquota.entrypoints.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
SOURCES = ROOT / "services" / "gpuquota"

#: placeholders in docstrings, not variables
NOT_VARIABLES = {"GPUQUOTA_FOO"}
REGENERATE = "python -m gpuquota.entrypoints.docs_config --write docs/configuration.md updates the tables"


def _variables_in_code() -> set[str]:
    found: set[str] = set()
    for path in SOURCES.rglob("*.py"):
        found.update(re.findall(r"\bGPUQUOTA_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return found - NOT_VARIABLES


def _commands(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, f"{prog} {name}")


def test_page_names_every_variable_the_code_mentions() -> None:
    page = PAGE.read_text()
    settings_vars = set().union(*(cls.ENV_VARS for cls in SERVICE_SETTINGS.values()))
    missing = sorted(v for v in settings_vars | _variables_in_code() if f"`{v}`" not in page)
    assert not missing, f"docs/configuration.md does not name {missing} ({REGENERATE})"


@pytest.mark.parametrize("prog", [prog for prog, _ in _commands(build_parser(), "gpuquota")])
def test_page_names_every_flag(prog: str) -> None:
    page = PAGE.read_text()
    parser = dict(_commands(build_parser(), "gpuquota"))[prog]
    flags = [o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]
    section = page.split(f"### `{prog}`\n", 1)
    assert not flags or len(section) == 2, f"docs/configuration.md has no section for {prog}"
    missing = [flag for flag in flags if f"`{flag}`" not in section[-1].split("\n### ", 1)[0]]
    assert not missing, f"docs/configuration.md does not document {prog} {missing} ({REGENERATE})"


def test_settings_docstring_explains_every_variable() -> None:
    meanings = docs_config.settings_meanings()
    for cls in SERVICE_SETTINGS.values():
        missing = cls.ENV_VARS - meanings.keys()
        assert not missing, f"gpuquota.config.settings' variable table lacks {sorted(missing)}"


def test_generator_replaces_only_its_block(capsys: pytest.CaptureFixture[str]) -> None:
    page = PAGE.read_text()
    block = docs_config.generate()
    updated = docs_config.replace_block(page, block)
    assert updated.startswith(page[: page.index(docs_config.BEGIN)])
    assert updated.endswith(page[page.index(docs_config.END) + len(docs_config.END) :].lstrip("\n"))
    assert docs_config.main([]) == 0
    assert capsys.readouterr().out == block
