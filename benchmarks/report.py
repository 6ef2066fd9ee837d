"""What every benchmark prints: one JSON object (``--json``), or one aligned ``key value`` line each."""

from __future__ import annotations

import json
from typing import Any


def print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    width = max(map(len, result), default=0)
    for key, value in result.items():
        print(f"{key:>{width}}: {value}")
