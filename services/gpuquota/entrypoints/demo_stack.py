"""The embedded stack ``gpuquota demo`` drives when it is given no ``--endpoint``: ``gpuquota up`` in
a background thread with its own event loop, on a free port.

The demo (``gpuquota.ctl.demo``) is a client of the gateway and imports no server; the command line
(``entrypoints.cli``) hands it :class:`BackgroundStack` to start one.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from gpuquota.ctl.demo_scenario import G5
from gpuquota.entrypoints.embedded import EmbeddedStack
from gpuquota.observe.startup import new_event_loop


class BackgroundStack:
    """An embedded stack on a free port, in a thread with its own event loop."""

    def __init__(self, data_dir: Path, runtime: str, nodes: str = f"{G5}=3") -> None:
        self.loop = new_event_loop()  # the services' (uvloop's), as gpuquota up runs
        self.thread = threading.Thread(target=self.loop.run_forever, name="gpuquota-demo-stack", daemon=True)
        self.thread.start()
        self.stack = EmbeddedStack(data_dir, port=0, nodes=nodes, runtime=runtime, preemption_grace=10.0)
        try:
            asyncio.run_coroutine_threadsafe(self.stack.start(), self.loop).result(60)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return self.stack.url

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.stack.stop(), self.loop).result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
