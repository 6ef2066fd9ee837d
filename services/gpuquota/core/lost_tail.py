"""Outcomes the log lost: a node reports SUCCEEDED for an attempt the log does not assign to it.

Theory of operation
-------------------
The log is the truth about what the scheduler *assigned*, the nodes about what *ran* (``core.nodes``).
A log shorter than what the scheduler acted on (a database crash without durable commits, a failover
to an asynchronous replica, a restore from backup) has lost decisions that were carried out: a
dispatch, and the reports of the attempt the node then ran. The scheduler reads the inputs of the lost
records from Kafka again (the node's reports among them), but decides them on the shorter log, where
the job may be RUNNABLE (its dispatch lost) or dispatched again, under the same attempt id (an
attempt id is the job id and the attempt's number, ``core.schedule``), to another node.

**Adoption.** A *finished-elsewhere* report: a node reports SUCCEEDED (an ``AttemptReport``, or an
attempt listed by its registration or heartbeat) for an attempt of a live job that the log never
dispatched (its number is above the job's attempt number), or that the log dispatched again, as the
job's current attempt, to other nodes than the one reporting it. The job then SUCCEEDED with that
attempt (``JobSucceeded``, legal from RUNNABLE for this reason): a job that finished is never run again
because the log lost its end.

Why it never applies without a loss: every attempt a node can report was dispatched by the log, a
job's attempt numbers only grow and an attempt keeps its placements, so a reported attempt is either
older than the job's current one or the current one on the nodes it was placed on. An older attempt,
or the current one requeued (its node was lost), is a late report, ignored as before (S5.7).

What adoption leaves to the other rules: the job's current attempt, if the log dispatched it again, is
released with the job; the node that runs it then runs an attempt the log no longer assigns, and its
next heartbeat fences it (``core.nodes``, step 2). FAILED and STOPPED reports of such attempts are not
adopted: the job runs again, as a retry would.
"""

from __future__ import annotations

from gpuquota.core.records import JobRecord


def attempt_number(attempt_id: str) -> int | None:
    """The number of attempt ``<job id>#<n>`` (None: not an attempt id the core made)."""
    _, sep, number = attempt_id.rpartition("#")
    return int(number) if sep and number.isdigit() else None


def assigned_to(job: JobRecord, node_id: str, attempt_id: str) -> bool:
    """The log assigns ``attempt_id`` of ``job`` to ``node_id``: its current attempt, placed there."""
    return job.attempt_id == attempt_id and any(p.node_id == node_id for p in job.placements)


def finished_elsewhere(job: JobRecord | None, node_id: str, attempt_id: str, status: str) -> bool:
    """A node's SUCCEEDED for an attempt of live ``job`` that the log lost (see the module doc)."""
    if job is None or status != "SUCCEEDED" or assigned_to(job, node_id, attempt_id):
        return False
    number = attempt_number(attempt_id)
    if number is None or attempt_id != f"{job.job_id}#{number}":
        return False
    if number > job.attempt_number:
        return True  # never dispatched by the log: the dispatch was lost
    return attempt_id == job.attempt_id and job.dispatched  # dispatched again, elsewhere
