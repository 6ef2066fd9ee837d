"""Read (or generate) a trace in a child process while the replay runs: the second core does the parsing.

A replay spends most of its time in the core's ``step``, which only the main process can run; reading
a trace line (``TraceJob.model_validate_json``) or drawing a generated job costs a further 10 % or more
of a replay, and needs nothing from it. ``prefetched(source)`` runs ``source()`` in a child process
(spawned: it imports only what it needs and shares no threads or locks with the parent) that sends the
jobs in batches of plain tuples through a pipe; the parent turns them into ``TraceRow`` named tuples
(the same fields as ``TraceJob``). The pipe blocks the child once a few batches wait unread, so memory
stays bounded whatever the trace's length. A ``TraceError`` raised while reading is raised again in the
parent, with its message; the child is stopped when the parent stops reading early.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple

from gpuquota.sim.trace import TraceError, TraceJob, read_trace

PREFETCH_BYTES = 2_000_000
"""Trace files from this size on (about 10,000 jobs) are read in a child process: starting it costs
about half a second."""
BATCH = 4_096
"""Jobs a message: large enough that pickling costs little per job, small enough to start at once."""


class TraceRow(NamedTuple):
    """One job of a trace, as ``TraceJob`` without pydantic (the values were validated in the child)."""

    submitted_at: float
    share: str
    priority: int
    unit: str
    instances: int
    duration: float
    exit_code: int
    job_name: str | None
    checkpoint_every: float | None
    preemption_retries: int | None


TraceSource = Callable[[], Iterable[TraceJob]]
"""What the child runs: picklable (a module-level function, or ``functools.partial`` of one)."""


def trace_reader(path: str | Path) -> Iterable[TraceJob | TraceRow]:
    """The jobs of the trace file at ``path``: read here when small (or standard input), else prefetched."""
    try:
        large = str(path) != "-" and os.path.getsize(path) >= PREFETCH_BYTES
    except OSError:
        large = False  # read_trace says why it cannot read it
    return prefetched(functools.partial(read_trace, path)) if large else read_trace(path)


def prefetched(source: TraceSource, batch: int = BATCH) -> Iterator[TraceRow]:
    """The jobs of ``source()``, read in a child process (see the module's docstring)."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_produce, args=(source, sender, batch), daemon=True)
    child.start()
    sender.close()
    try:
        yield from _receive(receiver)
    finally:
        receiver.close()
        if child.is_alive():
            child.terminate()
        child.join()


def _receive(receiver: Connection) -> Iterator[TraceRow]:
    make = TraceRow._make
    while True:
        kind, payload = receiver.recv()
        if kind == "rows":
            for row in payload:
                yield make(row)
        elif kind == "error":
            raise TraceError(payload)
        else:
            return


def _produce(source: TraceSource, sender: Connection, batch: int) -> None:
    rows: list[tuple[object, ...]] = []
    try:
        for job in source():
            rows.append(
                (
                    job.submitted_at,
                    job.share,
                    job.priority,
                    job.unit,
                    job.instances,
                    job.duration,
                    job.exit_code,
                    job.job_name,
                    job.checkpoint_every,
                    job.preemption_retries,
                )
            )
            if len(rows) >= batch:
                sender.send(("rows", rows))
                rows = []
        sender.send(("rows", rows))
        sender.send(("end", None))
    except TraceError as error:
        sender.send(("rows", rows))
        sender.send(("error", str(error)))
    except (BrokenPipeError, KeyboardInterrupt):
        pass  # the parent stopped reading
    finally:
        sender.close()
