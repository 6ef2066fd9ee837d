"""deploy/monitoring: every metric the Grafana dashboard and the alert rules use is one gpuquota exposes,
and the scrape configuration targets the ports the deployments give the services."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpuquota.observe.metrics import METRICS

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exposed() -> set[str]:
    return {name + suffix for name, (kind, _, _) in METRICS.items() for suffix in SUFFIXES[kind]}


def used(expr: str) -> set[str]:
    return set(re.findall(r"\bgpuquota_[a-z_]+\b", expr))


def dashboard_exprs() -> list[str]:
    dashboard: dict[str, Any] = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_every_metric_of_the_dashboard_exists() -> None:
    exprs = dashboard_exprs()
    names = set().union(*(used(e) for e in exprs))
    assert names, "the dashboard uses no gpuquota metric"
    assert names <= exposed(), f"unknown metrics: {sorted(names - exposed())}"
    unshown = {family for family in METRICS if not any(name.startswith(family) for name in names)}
    assert not unshown, f"no panel shows {sorted(unshown)}"


def test_every_metric_of_the_alerts_exists() -> None:
    rules = yaml.safe_load((MONITORING / "gpuquota-alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    names = set().union(*(used(e) for e in exprs))
    assert names and names <= exposed(), f"unknown metrics: {sorted(names - exposed())}"


def test_scrape_config_targets_the_services() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"gpuquota-gateway", "gpuquota-scheduler", "gpuquota-node-agent", "gpuquota-pods"} <= set(jobs)
    targets = {
        name: job["static_configs"][0]["targets"] for name, job in jobs.items() if "static_configs" in job
    }
    assert targets["gpuquota-scheduler"] == ["scheduler:9464"]
    assert targets["gpuquota-node-agent"] == ["node-agent-1:9464", "node-agent-2:9464"]
    assert config["rule_files"] == ["gpuquota-alerts.yml"]
