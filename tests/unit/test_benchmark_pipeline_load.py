"""The pipeline benchmark's load generator writes and reads what the wire models say, at less cost.

Its templates write exactly the bytes ``encode`` writes for the models they replace; it tells a
record's kind from its ``type`` header without parsing the value; a job's second dispatch counts once
per distinct event id; and the CPU of the servers it started is read for the whole process tree.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiokafka.structs import ConsumerRecord

from benchmarks import server_cpu
from benchmarks.pipeline_load import Watch, _observe, dispatch_of, message_of_type
from benchmarks.pipeline_workload import report, report_json, submission, submission_json
from gpuquota.adapters.kafka import encode, message_headers
from gpuquota.wire.base import Placement
from gpuquota.wire.events import JobDispatched
from gpuquota.wire.inputs import AttemptReport, SubmitJob

AT = 1_796_186_173_825


@pytest.mark.parametrize("index", [0, 1, 7, 2_999_999])
@pytest.mark.parametrize("run", ["abcd1234", "0f0f0f0f"])
def test_a_submission_from_the_template_is_the_models_encoding(run: str, index: int) -> None:
    written = submission_json(run, index, AT)
    assert written == encode(submission(run, index, AT))
    assert SubmitJob.model_validate_json(written) == submission(run, index, AT)


@pytest.mark.parametrize(
    ("attempt_id", "node_id", "job"),
    [
        ("abcd1234-job-7/1", "node-3", "abcd1234-job-7"),
        ('quote " and \\ back/slash', "nœud-\t1", "job-\u0001-é"),
    ],
)
def test_a_report_from_the_template_is_the_models_encoding(attempt_id: str, node_id: str, job: str) -> None:
    written = report_json(attempt_id, node_id, job, AT)
    model = report(attempt_id, node_id, job, AT)
    assert written == encode(model)
    assert AttemptReport.model_validate_json(written) == model


def record(value: bytes, headers: list[tuple[str, bytes]], key: bytes = b"j") -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="t",
        partition=0,
        offset=0,
        timestamp=AT,
        timestamp_type=0,
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=len(key),
        serialized_value_size=len(value),
        headers=headers,
    )


def test_a_record_of_the_kind_named_by_its_header_is_parsed() -> None:
    value = b'{"type":"RunAttempt","attempt_id":"a"}'
    headers = [("schema_version", b"1"), ("type", b"RunAttempt")]
    assert message_of_type(record(value, headers), b"RunAttempt") == {"type": "RunAttempt", "attempt_id": "a"}


def test_a_record_of_another_kind_by_its_header_is_not_parsed() -> None:
    not_json = b"the value is never read"
    assert message_of_type(record(not_json, [("type", b"StopAttempt")]), b"RunAttempt") is None


def test_without_a_type_header_the_values_type_decides() -> None:
    dispatched = b'{"type":"JobDispatched","job_id":"j","event_id":"e"}'
    assert message_of_type(record(dispatched, []), b"JobDispatched") == {
        "type": "JobDispatched",
        "job_id": "j",
        "event_id": "e",
    }
    assert message_of_type(record(b'{"type":"JobStarting"}', []), b"JobDispatched") is None


def test_a_second_dispatch_counts_once_per_distinct_event_id_and_the_first_read_is_kept() -> None:
    watch = Watch()
    watch.submitted.update(j1=1.0, j2=2.0)
    watch.dispatched("j1", "e1", read_at=10.0, published_at=9.0)
    watch.dispatched("j1", "e1", read_at=11.0, published_at=9.5)  # the same event read again
    watch.dispatched("j2", "e2", read_at=12.0, published_at=11.0)
    assert watch.duplicate_dispatches() == 0
    watch.dispatched("j1", "e3", read_at=13.0, published_at=12.0)
    watch.dispatched("j1", "e4", read_at=14.0, published_at=13.0)
    watch.dispatched("j1", "e3", read_at=15.0, published_at=14.0)
    assert watch.duplicate_dispatches() == 2
    assert (watch.scheduled["j1"], watch.published["j1"], watch.last_scheduled) == (10.0, 9.0, 12.0)


def test_after_the_warm_up_only_the_measured_jobs_are_watched() -> None:
    watch = Watch()
    watch.submitted["warm"] = 1.0
    watch.dispatched("warm", "e1", read_at=2.0, published_at=1.5)
    watch.restart()
    watch.submitted["j1"] = 3.0
    watch.dispatched("warm", "e2", read_at=4.0, published_at=3.5)  # a warm-up job's, read late
    watch.dispatched("j1", "e3", read_at=5.0, published_at=4.5)
    assert (watch.scheduled, watch.duplicate_dispatches(), watch.last_scheduled) == ({"j1": 5.0}, 0, 5.0)


def write_stat(proc: Path, pid: int, ppid: int, utime: int, stime: int, cutime: int, cstime: int) -> None:
    (proc / str(pid)).mkdir()
    rest = ["S", str(ppid), *["0"] * 9, str(utime), str(stime), str(cutime), str(cstime), *["0"] * 30]
    (proc / str(pid) / "stat").write_text(f"{pid} (postgres: a (b)) {' '.join(rest)}\n")


def test_a_process_trees_cpu_adds_its_live_descendants_and_what_they_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_stat(tmp_path, 100, 1, utime=10, stime=5, cutime=7, cstime=3)  # the postmaster
    write_stat(tmp_path, 101, 100, utime=20, stime=10, cutime=0, cstime=0)  # a backend
    write_stat(tmp_path, 102, 101, utime=1, stime=1, cutime=0, cstime=0)  # its child
    write_stat(tmp_path, 200, 1, utime=1000, stime=1000, cutime=0, cstime=0)  # another process
    (tmp_path / "self").mkdir()
    monkeypatch.setattr(server_cpu, "PROC", tmp_path)
    ticks = 10 + 5 + 7 + 3 + 20 + 10 + 1 + 1
    assert server_cpu.tree_cpu_seconds(100) == ticks / server_cpu.CLOCK_TICKS
    assert server_cpu.tree_cpu_seconds(300) is None


def test_the_servers_pids_come_from_the_run_dirs_of_deploy_local(tmp_path: Path) -> None:
    kafka_run, pg_run, pg_base = tmp_path / "kafka", tmp_path / "pg", tmp_path / "pgbase"
    for folder in (kafka_run, pg_run, pg_base / "data"):
        folder.mkdir(parents=True)
    assert (server_cpu.broker_pid(kafka_run), server_cpu.postmaster_pid(pg_run)) == (None, None)
    (kafka_run / "kafka.pid").write_text("4242\n")
    (pg_run / "pgdata").write_text(f"{pg_base}\n")
    (pg_base / "data" / "postmaster.pid").write_text(f"4343\n{pg_base}/data\n1700000000\n5432\n")
    assert (server_cpu.broker_pid(kafka_run), server_cpu.postmaster_pid(pg_run)) == (4242, 4343)


def test_the_cpu_between_two_readings_of_a_live_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([1.0, 3.5])
    monkeypatch.setattr(server_cpu, "tree_cpu_seconds", lambda pid: next(readings) if pid == 7 else None)
    cpu = server_cpu.ServerCpu({"broker": 7, "database": 8})
    cpu.start()
    cpu.stop()
    assert cpu.seconds == {"broker": 2.5}


def test_the_machines_cpu_between_two_readings_counts_the_hypervisors_steal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_cpu, "PROC", tmp_path)
    tick = 1 / server_cpu.CLOCK_TICKS
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 1 20 500 5 0 4 30 0 0\ncpu0 50 0 10 250 2 0 2 15 0 0\nintr 1\n")
    host = server_cpu.HostCpu().start()
    stat.write_text("cpu  160 1 40 700 15 0 6 130 0 0\ncpu0 80 0 20 350 7 0 3 65 0 0\nintr 1\n")
    expected = {"busy": 82 * tick, "idle": 210 * tick, "steal": 100 * tick}
    assert host.stop() == {kind: round(seconds, 2) for kind, seconds in expected.items()}
    assert host.seconds["steal"] == round(100 * tick, 2)


def dispatched(event_id: str) -> JobDispatched:
    placement = Placement(node_id="node-1", slots=(3,))
    return JobDispatched(
        event_id=event_id,
        occurred_at=AT,
        job_id="run-job-1",
        attempt_id="run-job-1/1",
        attempt_number=1,
        unit="ml.g5.xlarge",
        count=1,
        placements=(placement,),
        phase="IN_QUOTA",
        borrowed=0,
    )


@pytest.mark.parametrize("event_id", ["run/submit/1/dispatch", 'with "quotes", \\ and é'])
def test_a_published_dispatch_gives_its_job_id_and_event_id(event_id: str) -> None:
    event = dispatched(event_id)
    published = record(encode(event), message_headers(event), key=event.job_id.encode())
    assert dispatch_of(published) == (event.job_id, event_id)


def test_a_dispatch_is_read_from_its_value_when_the_event_id_is_not_first_or_there_is_no_header() -> None:
    value = b'{"type":"JobDispatched","job_id":"j","event_id":"e"}'
    assert dispatch_of(record(value, [("type", b"JobDispatched")])) == ("j", "e")
    assert dispatch_of(record(value, [])) == ("j", "e")
    spaced = b'{"event_id": "e", "type": "JobDispatched", "job_id": "j"}'
    assert dispatch_of(record(spaced, [("type", b"JobDispatched")])) == ("j", "e")


def test_other_job_state_records_are_not_dispatches() -> None:
    assert dispatch_of(record(b"never read", [("type", b"JobAccepted")])) is None
    assert dispatch_of(record(b'{"type":"JobSucceeded","job_id":"j","event_id":"e"}', [])) is None


def test_a_slots_round_trip_runs_from_its_jobs_dispatch_to_its_success_as_published() -> None:
    watch = Watch()
    watch.submitted.update(j1=1.0, j2=1.0)
    ended = record(b"never read", [("type", b"JobSucceeded")], key=b"j1")
    _observe([ended], read_at=2.0, watch=watch)  # not dispatched yet: not a slot's round trip
    watch.dispatched("j1", "e1", read_at=10.0, published_at=9.0)
    late = record(b"never read", [("type", b"JobSucceeded")], key=b"j1")
    other = record(b"never read", [("type", b"JobRunning")], key=b"j2")
    _observe([late, other], read_at=11.0, watch=watch)
    assert watch.ended == {"j1": late.timestamp / 1000}
    watch.restart()
    assert watch.ended == {}


def test_a_calibrated_host_reading_marks_the_machine_outside_its_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_cpu, "PROC", tmp_path)
    (tmp_path / "stat").write_text("cpu  100 0 0 100 0 0 0 0 0 0\n")
    marks = iter([50.0, 90.0])
    monkeypatch.setattr(server_cpu, "calibration_ms", lambda: next(marks))
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 0.0, 0.0))
    host = server_cpu.HostCpu(calibrate=True).start()
    host.stop()
    assert host.readings() == {
        "host_cpu_seconds": {"busy": 0.0, "idle": 0.0, "steal": 0.0},
        "calibration_ms": [50.0, 90.0],
        "load_average_1m": [1.23, 1.23],
    }
    assert server_cpu.HostCpu().start().readings().keys() == {"host_cpu_seconds"}
