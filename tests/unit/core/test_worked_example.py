"""S8, the worked example from AWS's quota-management notebook, as a scenario test."""

from __future__ import annotations

from tests.builders import Harness, job


def test_worked_example_s8() -> None:
    h = Harness.worked_example()

    # 1. high runs in quota, med borrows QS2's idle instance, low waits (QS3's instance is reserved).
    h.submit(
        job("qs1_job_high").share("QS1").priority(3),
        job("qs1_job_med").share("QS1").priority(2),
        job("qs1_job_low").share("QS1").priority(1),
    )
    assert h.statuses("qs1_job_high", "qs1_job_med", "qs1_job_low") == {
        "qs1_job_high": "SCHEDULED",
        "qs1_job_med": "SCHEDULED",
        "qs1_job_low": "RUNNABLE",
    }
    h.running("qs1_job_high", "qs1_job_med")
    assert h.explain("qs1_job_low") == "IDLE_CAPACITY_RESERVED"

    # 2. qs2_job_1 reclaims QS2's instance: med is preempted; once it stops, qs2_job_1 runs.
    h.submit(job("qs2_job_1").share("QS2").priority(1))
    assert h.preempted() == [("qs1_job_med", "qs2_job_1", "CROSS_SHARE")]
    assert h.explain("qs2_job_1") == "WAITING_FOR_PREEMPTION"
    h.stop_all_preempted()
    assert h.statuses("qs1_job_med", "qs2_job_1") == {"qs1_job_med": "RUNNABLE", "qs2_job_1": "SCHEDULED"}
    assert h.state.jobs["qs1_job_med"].preempted_count == 1
    h.running("qs2_job_1")

    # 3. Raising low to 4 preempts high in-share; low runs; med stays RUNNABLE.
    h.set_priority("qs1_job_low", 4)
    assert h.preempted()[-1] == ("qs1_job_high", "qs1_job_low", "IN_SHARE")
    h.stop_all_preempted()
    assert h.statuses("qs1_job_high", "qs1_job_med", "qs1_job_low", "qs2_job_1") == {
        "qs1_job_high": "RUNNABLE",
        "qs1_job_med": "RUNNABLE",
        "qs1_job_low": "SCHEDULED",
        "qs2_job_1": "RUNNING",
    }
    assert (
        h.state.jobs["qs1_job_high"].status_reason
    ) == "Preempted (in-share): higher priority job qs1_job_low (priority 4 > 3)"
