from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest

from gpuquota.sim.generate import DAY, Workload, generate
from gpuquota.sim.trace import TraceError, TraceJob, parse_lines, read_trace, write_trace

GOOD = (
    '{"submitted_at": 1.5, "share": "QS1", "priority": 3, "unit": "ml.g5.xlarge", "instances": 2, '
    '"duration": 60, "exit_code": 0}'
)


def test_a_line_of_the_interface_format_parses() -> None:
    (job,) = parse_lines([GOOD])
    assert (job.submitted_at, job.share, job.priority, job.unit, job.instances, job.duration) == (
        1.5,
        "QS1",
        3,
        "ml.g5.xlarge",
        2,
        60.0,
    )
    assert job.checkpoint_every is None and job.job_name is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"submitted_at": 1, "share": "QS1", "unit": "u"}', "trace:3: duration: Field required"),
        (
            GOOD.replace('"instances": 2', '"instances": 0'),
            "trace:3: instances: Input should be greater than or equal to 1",
        ),
        (
            GOOD.replace('"exit_code": 0', '"exit_code": 0, "colour": "red"'),
            "trace:3: colour: Extra inputs are not permitted",
        ),
        ("not json", "trace:3: Invalid JSON"),
        (
            GOOD.replace('"submitted_at": 1.5', '"submitted_at": 0.5'),
            "trace:3: submitted_at 0.5 is before the previous line's 1.5",
        ),
    ],
)
def test_a_bad_line_is_rejected_with_its_line_number(line: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        list(parse_lines([GOOD, "", line]))
    assert str(caught.value).startswith(message)


def test_reading_is_lazy(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\nbroken\n")
    jobs = read_trace(path)
    assert next(jobs).share == "QS1"  # the bad second line is not read yet
    with pytest.raises(TraceError, match="t.jsonl:2"):
        next(jobs)


def test_a_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        next(read_trace(tmp_path / "missing.jsonl"))


def test_written_traces_read_back() -> None:
    jobs = list(generate(Workload(jobs=50, checkpoint_every=60, preemption_retries=2)))
    out = io.StringIO()
    assert write_trace(jobs, out) == 50
    assert list(parse_lines(out.getvalue().splitlines())) == jobs


def test_generation_is_seeded_and_follows_its_parameters() -> None:
    workload = Workload(
        jobs=3000, shares="A:3,B:1", gang_sizes="1:1,8:1", priorities="0:1,9:1", rate_per_hour=120
    )
    first, second = list(generate(workload)), list(generate(workload))
    assert first == second
    assert first != list(generate(Workload(**{**workload.__dict__, "seed": 2})))
    shares = [j.share for j in first]
    assert 0.7 < shares.count("A") / len(shares) < 0.8
    assert {j.instances for j in first} == {1, 8} and {j.priority for j in first} == {0, 9}
    durations = sorted(j.duration for j in first)
    median = durations[len(durations) // 2]
    assert 1500 < median < 2100  # log-normal around the 1,800 s median ...
    assert durations[-1] > 10 * median  # ... with a heavy tail
    hours = (first[-1].submitted_at - first[0].submitted_at) / 3600
    assert 20 < hours < 30  # 3,000 jobs at 120 an hour


def test_arrivals_follow_the_daily_cycle() -> None:
    jobs = list(generate(Workload(jobs=20_000, rate_per_hour=200, cycle=0.8)))
    by_hour = [0] * 24
    for job in jobs:
        by_hour[int(job.submitted_at % DAY // 3600)] += 1
    assert by_hour[15] > 3 * by_hour[3]  # peak at 15:00, trough at 03:00
    assert all(b >= a for a, b in itertools.pairwise([j.submitted_at for j in jobs]))


def test_trace_job_lines_omit_absent_options() -> None:
    job = TraceJob(submitted_at=0, share="S", unit="u", duration=1)
    assert (
        job.line() == '{"submitted_at": 0.0, "share": "S", "priority": 0, "unit": "u", "instances": 1, '
        '"duration": 1.0, "exit_code": 0}'
    )
