"""A trace read in a child process gives the same jobs, the same replay and the same errors."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from gpuquota.sim import prefetch
from gpuquota.sim.config import load_configuration
from gpuquota.sim.engine import simulate
from gpuquota.sim.generate import Workload, generate
from gpuquota.sim.prefetch import TraceRow, prefetched, trace_reader
from gpuquota.sim.trace import TraceError, read_trace, write_trace

CONFIG = load_configuration(Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml")
WORKLOAD = Workload(jobs=300, rate_per_hour=600, checkpoint_every=60, preemption_retries=2, seed=3)


def test_prefetched_jobs_and_their_replay_are_those_read_here(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with path.open("w") as out:
        write_trace(generate(WORKLOAD), out)
    here = list(read_trace(path))
    # a small batch, so that the jobs cross the pipe in several messages
    there = list(prefetched(functools.partial(read_trace, path), batch=64))
    assert there == [TraceRow(*job.model_dump().values()) for job in here]
    replayed = simulate(CONFIG, iter(there), record_decisions=True)
    assert replayed.decisions == simulate(CONFIG, here, record_decisions=True).decisions


def test_a_bad_line_read_in_the_child_is_the_parents_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.jsonl"
    with path.open("w") as out:
        write_trace(generate(WORKLOAD), out)
        out.write('{"submitted_at": 1e9, "share": "QS1", "unit": "u"}\n')
    monkeypatch.setattr(prefetch, "PREFETCH_BYTES", 1)  # read this small file in a child
    jobs = trace_reader(path)
    assert not isinstance(jobs, list) and "prefetched" in repr(jobs)
    with pytest.raises(TraceError, match=r"trace.jsonl:301: duration: Field required"):
        list(jobs)
