"""How often the pipeline may dump a large state as a snapshot (``Pipeline._dump``)."""

from __future__ import annotations


def snapshot_pace(began: float, ended: float, share: float) -> float:
    """When the next snapshot may be dumped, after one that held the event loop from ``began`` to
    ``ended`` (``time.monotonic``), so that dumps hold the loop at most ``share`` of the time.

    The loop's time, not the thread's CPU, is what the waiting inputs see: on a machine that gives the
    scheduler half a CPU, a dump holds the loop twice its CPU time. Paced by CPU, a backlog's ever
    larger state was dumped ever more often (py-spy: 10 % of the scheduler at 1,000 jobs/s offered on a
    loaded machine), which slowed the draining of the backlog that made it large.
    """
    return ended + (ended - began) / share
