"""The worked example (S8) up to its second step, on an embedded stack, for the operator's-side tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import StackThread, wait_for
from tests.gateway.helpers import G5, status, submit, worked_example

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def stack(**options: Any) -> StackThread:
    """An embedded stack with one node of 3 x ml.g5.xlarge whose simulated jobs run until stopped."""
    return StackThread(**{"nodes": f"{G5}=3", "runtime": "simulated", "tick_seconds": 0.05, **options})


def two_steps(batch: Any) -> dict[str, str]:
    """S8 steps 1 and 2: QS1's high runs, med was reclaimed by QS2's job, low waits; the job ids."""
    worked_example(batch)
    ids = {
        name: submit(batch, name, "QS1", priority) for name, priority in (("high", 3), ("med", 2), ("low", 1))
    }
    wait_for(lambda: status(batch, ids["med"]) == "RUNNING", timeout=30)
    ids["qs2"] = submit(batch, "qs2", "QS2", 1)
    expected = {"high": "RUNNING", "med": "RUNNABLE", "low": "RUNNABLE", "qs2": "RUNNING"}
    wait_for(lambda: all(status(batch, ids[n]) == s for n, s in expected.items()), timeout=30)
    return ids


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get_json(url: str) -> tuple[int, Any]:
    code, body = get(url)
    return code, json.loads(body)


def scrape(url: str) -> Samples:
    """``/metrics`` of ``url`` as ``{(sample name, sorted labels): value}``."""
    code, text = get(url + "/metrics")
    assert code == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in text_string_to_metric_families(text)
        for sample in metric.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]
