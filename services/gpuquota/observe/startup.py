"""Start-up checks of the services: unknown ``GPUQUOTA_*`` variables, and unreachable dependencies.

A misspelt variable (``..._PROT`` for ``..._PORT``) used to be ignored silently:
:func:`unknown_variables` names each unknown variable with the closest known one. An unreachable
Kafka or PostgreSQL at start-up used to end in a long traceback: :func:`wait_for` retries each address
with the one back-off policy (``support.retry``), saying so in one line per try, and
:func:`run_service` turns a dependency that stays unreachable into one line on stderr naming the
address and exit code :data:`EXIT_UNREACHABLE`, without a traceback.

Shutdown: a service's stop is one ``await`` (:func:`drain`); one that takes longer than
:data:`SLOW_DRAIN_SECONDS` logs what it waits for (the chain of awaits it is parked in: an append
being written, an HTTP request being answered), again every second. Once it has drained, the process
ends at once (:func:`exit_process`): the interpreter's own teardown, which frees every module and
object one by one, took 0.2-1.2 s of an idle service's exit on a loaded 2-core machine, and grows
with the state in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

from gpuquota.config.environ import ENV_PREFIX
from gpuquota.config.settings import SERVICE_SETTINGS
from gpuquota.support.retry import Backoff, Failure

T = TypeVar("T")

log = logging.getLogger(__name__)

SLOW_DRAIN_SECONDS = 0.5
"""A stop that takes longer than this says what it waits for (an idle service stops in milliseconds)."""

EXIT_UNREACHABLE = 3
"""A dependency (Kafka, PostgreSQL) stayed unreachable at start-up (2 is a configuration error)."""

OTHER_VARIABLES = frozenset(
    {
        "GPUQUOTA_PORT",  # gpuquota up
        "GPUQUOTA_ENDPOINT",  # the client commands
        "GPUQUOTA_PURE_PYTHON",  # run the Python core even when the compiled one exists
        "GPUQUOTA_LOG_FORMAT",
        "GPUQUOTA_METRICS_PORT",
        "GPUQUOTA_STARTUP_TIMEOUT",
        "GPUQUOTA_SIM_DURATION_SECONDS",  # the simulated runtime
        "GPUQUOTA_SIM_EXIT_CODE",
        "GPUQUOTA_JOB_ID",  # set for each job's process by the node agent
        "GPUQUOTA_JOB_NAME",
        "GPUQUOTA_ATTEMPT",
        "GPUQUOTA_ATTEMPT_ID",
    }
)


def known_variables() -> frozenset[str]:
    names: set[str] = set(OTHER_VARIABLES)
    for settings in SERVICE_SETTINGS.values():
        names |= settings.ENV_VARS
    return frozenset(names)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``GPUQUOTA_*`` variable nothing reads, naming the closest known one."""
    known = known_variables()
    warnings = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.append(f"unknown variable {name} is ignored{hint}")
    return warnings


def warn_unknown_variables(prog: str, environ: Mapping[str, str]) -> None:
    for warning in unknown_variables(environ):
        print(f"{prog}: warning: {warning}", file=sys.stderr)


# ----- dependencies -------------------------------------------------------------------------------


class Unreachable(Exception):
    """A dependency did not answer within the start-up timeout; the message names it and its address."""


def kafka_addresses(bootstrap: str) -> list[tuple[str, str, int]]:
    """``("Kafka", host, port)`` per bootstrap server."""
    out = []
    for server in filter(None, (s.strip() for s in bootstrap.split(","))):
        host, _, port = server.rpartition(":")
        out.append(("Kafka", host, int(port)))
    return out


def database_address(url: str) -> tuple[str, str, int]:
    """``("PostgreSQL", host, port)`` of a ``postgresql://`` URL (its password never shown)."""
    parts = urlsplit(url)
    return ("PostgreSQL", parts.hostname or "localhost", parts.port or 5432)


async def _connect(host: str, port: int, timeout: float) -> None:
    _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    writer.close()


async def wait_for(
    prog: str,
    what: str,
    addresses: list[tuple[str, int]],
    timeout: float,
    *,
    first_delay: float = 0.5,
    max_delay: float = 5.0,
    connect: Callable[[str, int, float], Awaitable[None]] = _connect,
) -> None:
    """Wait until one of ``addresses`` accepts a TCP connection, retrying with back-off
    (:class:`~gpuquota.support.retry.Backoff`, one line per try) for at most ``timeout`` seconds;
    then raise :class:`Unreachable`."""
    deadline = time.monotonic() + timeout
    shown = ", ".join(f"{host}:{port}" for host, port in addresses)

    async def reach_one() -> None:
        problem = ""
        for host, port in addresses:
            try:
                await connect(host, port, min(3.0, max(0.1, deadline - time.monotonic())))
                return
            except (OSError, TimeoutError) as exc:
                problem = _reason(exc)
        raise _NoAnswer(problem)

    def say(failure: Failure) -> None:
        print(
            f"{prog}: {what} at {shown} unreachable ({failure.error}); retrying in {failure.delay:.1f} s",
            file=sys.stderr,
        )

    backoff = Backoff(_NoAnswer, initial=first_delay, longest=max_delay, bound=timeout)
    try:
        await backoff.call(reach_one, failed=say)
    except _NoAnswer as exc:
        raise Unreachable(f"cannot reach {what} at {shown} after {timeout:g} s: {exc}") from None


class _NoAnswer(Exception):
    """No address of a dependency accepted a connection this try; the message says why (the last's)."""


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return re.sub(r"^\[Errno -?\d+\] ", "", text)


async def wait_for_dependencies(
    prog: str, timeout: float, kafka: str | None = None, database_url: str | None = None
) -> None:
    """Kafka's bootstrap servers and the database, each within ``timeout`` seconds (or ``Unreachable``)."""
    if kafka:
        await wait_for(prog, "Kafka", [(h, p) for _, h, p in kafka_addresses(kafka)], timeout)
    if database_url:
        _, host, port = database_address(database_url)
        await wait_for(prog, "PostgreSQL", [(host, port)], timeout)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop's event loop where it is installed (a dependency on Linux): its
    sockets, timers and callbacks cost the services' loops about a tenth less CPU than asyncio's own
    (the gateway's: 0.243-0.284 against 0.267-0.317 ms per submission, docs/benchmarks.md)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop :func:`run_loop` runs on, for a stack in a thread of its own (``gpuquota demo``), so
    that it runs as the services do."""
    factory = _loop_factory()
    return factory() if factory is not None else asyncio.new_event_loop()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on this platform: asyncio's loop
        return None
    return uvloop.new_event_loop


def run_service(prog: str, main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """``run_loop(main())``, with a dependency lost during start-up as one line and an exit code."""
    try:
        return run_loop(main())
    except Unreachable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (OSError, ConnectionError) as exc:
        print(f"{prog}: {_reason(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except Exception as exc:
        if _is_connection_error(exc):
            print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        raise


def _is_connection_error(exc: BaseException) -> bool:
    """aiokafka's and the event store's connection errors (not imported here: optional at import time)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"KafkaConnectionError", "TransientStoreError", "NoBrokersAvailable"})


# ----- shutdown -----------------------------------------------------------------------------------


async def drain(stop: Callable[[], Awaitable[None]], every: float = 1.0) -> None:
    """``await stop()``; past :data:`SLOW_DRAIN_SECONDS`, and then every ``every`` seconds, log what it
    is waiting for (:func:`waits`)."""
    began = time.monotonic()
    stopping = asyncio.ensure_future(stop())
    wait = SLOW_DRAIN_SECONDS
    while not (await asyncio.wait({stopping}, timeout=wait))[0]:
        log.warning("still stopping after %.1f s: %s", time.monotonic() - began, waits(stopping))
        wait = every
    stopping.result()


def waits(stopping: asyncio.Future[Any]) -> str:
    """What a slow stop waits for: where it is parked, and where the other tasks of this code are (a
    request being answered, an append being written, a loop not yet cancelled), at most eight."""
    here = asyncio.current_task()
    others = (t for t in asyncio.all_tasks() if t is not stopping and t is not here and not t.done())
    busy = sorted(f"{task.get_name()} ({chain})" for task in others if (chain := awaiting(task, ours=True)))
    text = f"waiting for {awaiting(stopping)}"
    return text + (f"; other tasks: {'; '.join(busy[:8])}" if busy else "")


def awaiting(task: asyncio.Future[Any], *, ours: bool = False) -> str:
    """Where ``task`` is parked: the chain of coroutines it awaits, innermost last, through the tasks
    it awaits (``EmbeddedStack.stop > SchedulerShell.stop > task shell-batches: ...``). With ``ours``,
    only the steps in gpuquota's own modules and the innermost one ("" if none is ours)."""
    steps: list[str] = []
    mine = False
    skipped = ""  # the last step left out (with ``ours``): the one that awaits the future, if any
    awaited: Any = task.get_coro() if isinstance(task, asyncio.Task) else task
    while awaited is not None and len(steps) < 40:
        if isinstance(awaited, asyncio.Task):
            steps.append(f"task {awaited.get_name()}:")
            awaited = awaited.get_coro()
            continue
        code = getattr(awaited, "cr_code", None) or getattr(awaited, "gi_code", None)
        if code is None:  # a future: the step before is what waits on it (``wait_for``, ``sleep``)
            steps.extend(filter(None, (skipped, type(awaited).__name__)))
            break
        inner = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        own = _OWN_CODE in code.co_filename
        mine = mine or own
        skipped = "" if own or not ours else code.co_qualname
        if not skipped:
            steps.append(code.co_qualname)
        awaited = inner
    return " > ".join(steps) if mine or not ours else ""


_OWN_CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The directory of the ``gpuquota`` package: where a frame of this code comes from."""


def exit_process(code: int) -> NoReturn:
    """End the process with ``code`` now, once its service has stopped: what it owns is closed (the
    event log committed and closed, the agents' records written, the brokers' clients stopped), so
    the interpreter's teardown would only delay the exit. Logs and standard streams are flushed;
    ``atexit`` handlers do not run (the services register none)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
