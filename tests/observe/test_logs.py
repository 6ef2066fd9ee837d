"""Log lines (I7): timestamps and levels always; ``GPUQUOTA_LOG_FORMAT=json`` one object per line with the
job, attempt, share and node ids as fields."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
from collections.abc import Iterator

import pytest

from gpuquota.observe.logs import bind, configure_logging

log = logging.getLogger("gpuquota.test")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


async def _attempt_task() -> None:
    bind(job_id="job-1", attempt_id="att-1")
    log.info("attempt %s started", "att-1")


def test_json_lines_carry_the_ids_as_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json")

    def node_agent() -> None:
        bind(node_id="node-7")

        async def main() -> None:
            await asyncio.create_task(_attempt_task())  # the ids bound in a task stay in that task
            log.warning("a line about a share", extra={"share": "jq/QS1"})

        asyncio.run(main())

    contextvars.copy_context().run(node_agent)  # what it binds stays there
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["message"] for line in lines] == ["attempt att-1 started", "a line about a share"]
    first, second = lines
    assert first["level"] == "INFO" and first["logger"] == "gpuquota.test"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$", first["time"])
    assert (first["job_id"], first["attempt_id"], first["node_id"]) == ("job-1", "att-1", "node-7")
    assert "job_id" not in second and second["share"] == "jq/QS1" and second["node_id"] == "node-7"


def test_text_lines_have_a_timestamp_a_level_and_the_ids(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("DEBUG", "text")
    log.debug("plain", extra={"job_id": "j-2"})
    line = capsys.readouterr().err.strip()
    assert re.match(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} DEBUG gpuquota.test: plain \[job_id=j-2\]$", line
    ), line


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text or json"):
        configure_logging("INFO", "yaml")
