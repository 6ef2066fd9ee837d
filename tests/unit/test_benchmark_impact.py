"""`python -m benchmarks.impact --json` prints its figures, and a small queue's impact is complete."""

from __future__ import annotations

import json
import subprocess
import sys


def test_prints_one_json_object_with_the_figures() -> None:
    command = [sys.executable, "-m", "benchmarks.impact", "--queued", "100", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    figures = json.loads(result.stdout)
    assert figures["changed_shares"] == 10 and figures["complete"] is True
    assert figures["copy_s"] >= 0 and figures["impact_s"] > 0
    assert figures["becomes_borrowing"] > 0  # halved limits turn the shares' jobs above them into borrowers
