"""``state.json`` from records encoded once each (``Attempt.encoded``, ``AttemptBook.encode``): the file
reads back as the records it was given, and a record is encoded again whenever one of its fields changed."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from gpuquota.node_agent.launch import Outcome
from gpuquota.node_agent.records import Attempt, AttemptBook
from gpuquota.node_agent.runtime import EndedHandle
from gpuquota.wire.inputs import AttemptReport
from tests.node_agent.conftest import NODE, run_cmd
from tests.node_agent.test_simulated_and_restart import sim_payload


def decoded(att: Attempt) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(att.encoded("process"))
    return record


def test_a_record_is_encoded_again_after_each_change(tmp_path: Path) -> None:
    att = Attempt(command=run_cmd(sim_payload(1)))
    first = decoded(att)
    assert first["command"] == att.command.model_dump(mode="json")
    assert first["pid"] is None and first["status"] == "STARTING" and first["final"] is None
    assert att.encoded("process") is att.encoded("process")  # unchanged: not encoded again

    att.handle = EndedHandle(Outcome(exit_code=0))
    att.started_at = time.time() + 1
    att.status = "RUNNING"
    running = decoded(att)
    assert running["status"] == "RUNNING" and running["started_at"] == att.started_at

    att.final = AttemptReport(
        event_id=str(uuid.uuid4()),
        occurred_at=0,
        node_id=NODE,
        job_id="job-1",
        attempt_id=att.command.attempt_id,
        status="SUCCEEDED",
        exit_code=0,
    )
    assert decoded(att)["final"] == att.final.model_dump(mode="json")


def test_the_book_reads_back_the_records_it_wrote(tmp_path: Path) -> None:
    book = AttemptBook(tmp_path, NODE)
    attempts = [Attempt(command=run_cmd(sim_payload(1), job_id=f"job-{i}")) for i in range(3)]
    book.save({a.command.attempt_id: a.encoded("process") for a in attempts})
    assert book.load() == {a.command.attempt_id: decoded(a) for a in attempts}
    assert json.loads(book.state_path.read_text())["node_id"] == NODE
