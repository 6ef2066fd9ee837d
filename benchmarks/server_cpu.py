"""CPU time of the servers a benchmark started itself (the broker's JVM, PostgreSQL's processes), and of
the whole machine, with the time its hypervisor took away (``HostCpu``), and how fast it is at the
moment (``calibration_ms``).

Read from ``/proc`` (Linux): a process's user and system time, with that of its children it has
waited for (``cutime``/``cstime``: a PostgreSQL backend that exited is in its postmaster's), plus the
same for every live descendant. The difference of two readings is the CPU the tree spent between
them, processes that came and went included.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_cpu_seconds(pid: int, *, waited_children: bool = False) -> float:
    """User + system CPU of ``pid`` (all its threads) so far, or, with ``waited_children``, of the
    children it has waited for (with theirs)."""
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    first = 13 if waited_children else 11  # cutime, cstime / utime, stime
    return (int(fields[first]) + int(fields[first + 1])) / CLOCK_TICKS


def _own_and_waited_ticks(fields: list[str]) -> int:
    return sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds of ``root`` and its live descendants (see the module's docstring); None if gone."""
    fields = _stat_fields(root)
    if fields is None:
        return None
    ticks = _own_and_waited_ticks(fields)
    children: dict[int, list[tuple[int, list[str]]]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (child := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(child[1]), []).append((int(entry.name), child))
    pending = [root]
    while pending:
        for pid, child in children.get(pending.pop(), []):
            ticks += _own_and_waited_ticks(child)
            pending.append(pid)
    return ticks / CLOCK_TICKS


def _first_line(path: Path) -> str:
    try:
        return path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return ""


def broker_pid(run_dir: Path) -> int | None:
    """The JVM of a broker ``deploy/local/kafka.sh`` started with ``KAFKA_RUN_DIR=run_dir``."""
    pid = _first_line(run_dir / "kafka.pid")
    return int(pid) if pid.isdigit() else None


def postmaster_pid(run_dir: Path) -> int | None:
    """The postmaster of a cluster ``deploy/local/postgres.sh`` started with ``PG_RUN_DIR=run_dir``."""
    base = _first_line(run_dir / "pgdata")
    pid = _first_line(Path(base) / "data" / "postmaster.pid") if base else ""
    return int(pid) if pid.isdigit() else None


class ServerCpu:
    """CPU seconds of named process trees between ``start()`` and ``stop()``."""

    def __init__(self, roots: dict[str, int]) -> None:
        self._roots = roots
        self._started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def start(self) -> None:
        self._started = {
            name: cpu for name, pid in self._roots.items() if (cpu := tree_cpu_seconds(pid)) is not None
        }

    def stop(self) -> None:
        for name, began in self._started.items():
            if (cpu := tree_cpu_seconds(self._roots[name])) is not None:
                self.seconds[name] = cpu - began


def host_cpu_seconds() -> dict[str, float]:
    """The machine's CPU seconds since boot, summed over its CPUs, from the ``cpu`` line of
    ``/proc/stat``: ``busy`` (user, nice, system, irq, softirq; guests are inside user), ``idle``
    (with iowait) and ``steal`` (while a vCPU had work, the hypervisor ran another machine's)."""
    ticks = [int(value) for value in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return {
        "busy": (user + nice + system + irq + softirq) / CLOCK_TICKS,
        "idle": (idle + iowait) / CLOCK_TICKS,
        "steal": steal / CLOCK_TICKS,
    }


class HostCpu:
    """The machine's CPU seconds between ``start()`` and ``stop()`` (``seconds``, by kind); with
    ``calibrate``, also ``calibration_ms`` and the 1-minute load average just before the start and
    just after the stop, outside the span.

    On a shared virtual machine the same code runs slower while the hypervisor gives the vCPUs to
    other machines (``steal``), and up to half as fast with no steal at all (docs/benchmarks.md,
    "Before you run one"); both beside a result let two runs be compared (``readings``).
    """

    def __init__(self, calibrate: bool = False) -> None:
        self._calibrate = calibrate
        self._started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.calibration_ms: list[float] = []
        self.load_average_1m: list[float] = []

    def start(self) -> HostCpu:
        self._mark()
        self._started = host_cpu_seconds()
        return self

    def stop(self) -> dict[str, float]:
        """The seconds by kind since ``start()``, rounded, also kept in ``seconds``."""
        now = host_cpu_seconds()
        self.seconds = {kind: round(now[kind] - began, 2) for kind, began in self._started.items()}
        self._mark()
        return self.seconds

    def readings(self) -> dict[str, Any]:
        """What a benchmark's JSON reports of the machine (after ``stop()``)."""
        marks = {"calibration_ms": self.calibration_ms, "load_average_1m": self.load_average_1m}
        return {"host_cpu_seconds": self.seconds, **(marks if self._calibrate else {})}

    def _mark(self) -> None:
        if self._calibrate:
            self.calibration_ms.append(calibration_ms())
            self.load_average_1m.append(round(os.getloadavg()[0], 2))


CALIBRATION_STEPS = 1_000_000


def calibration_ms() -> float:
    """Milliseconds this process takes for a fixed piece of pure-Python work, the best of three.

    The machine's speed at the moment: on a shared host it moves with the neighbours' load even when
    the hypervisor takes no time away (``steal`` stays near 0 while another machine's work on the
    same physical core slows this one), so a result is read beside the calibration taken with it.
    """
    best = math.inf
    for _ in range(3):
        began = time.perf_counter()
        table: dict[int, int] = {}
        for step in range(CALIBRATION_STEPS):
            table[step & 1023] = step * 7 % 13
        best = min(best, time.perf_counter() - began)
    return round(best * 1000, 2)
