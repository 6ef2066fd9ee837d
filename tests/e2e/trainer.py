"""The training job of the end-to-end tests, run by the node agents' process runtime.

It counts steps and checkpoints the count in ``$SM_CHECKPOINT_DIR/step`` every 20 ms, until SIGTERM
(it saves the checkpoint and exits 0) or until ``$OUT_DIR/<job name>.finish`` exists (it exits 0).
A later attempt resumes from the checkpoint. The test reads what happened from ``$OUT_DIR``:

* ``<job name>.<attempt number>.start``: JSON ``pid``, ``node``, ``attempt_id``, ``resumed_from``
  (written once the SIGTERM handler is installed);
* ``<job name>.<attempt number>.term``: JSON ``step`` saved on SIGTERM;
* ``<job name>.<attempt number>.done``: JSON ``step`` when it finished by itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

OUT = Path(os.environ["OUT_DIR"])
CHECKPOINT = Path(os.environ["SM_CHECKPOINT_DIR"]) / "step"
NAME = os.environ["GPUQUOTA_JOB_NAME"]
TAG = f"{NAME}.{os.environ['GPUQUOTA_ATTEMPT']}"


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def report(kind: str, **doc: object) -> None:
    atomic_write(OUT / f"{TAG}.{kind}", json.dumps(doc))


step = int(CHECKPOINT.read_text()) if CHECKPOINT.exists() else 0


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    atomic_write(CHECKPOINT, str(step))
    report("term", step=step)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
report(
    "start",
    pid=os.getpid(),
    node=os.environ["GPUQUOTA_NODE_ID"],
    attempt_id=os.environ["GPUQUOTA_ATTEMPT_ID"],
    resumed_from=step,
)
finish = OUT / f"{NAME}.finish"
while not finish.exists():
    step += 1
    atomic_write(CHECKPOINT, str(step))
    time.sleep(0.02)
report("done", step=step)
