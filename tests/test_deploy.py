"""The Grafana dashboard and Prometheus alert rules in ``deploy/``: every metric they name
is one the exporter renders from a real crawl's state, and the rules have what
Prometheus needs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.settings import Settings

from scrapy_dist.addon import with_defaults
from scrapy_dist.cli import main
from scrapy_dist.filters import backend_from_settings
from scrapy_dist.keys import RedisKeys
from scrapy_dist.stats import SharedStats

if TYPE_CHECKING:
    import redis

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "scrapy-dist.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\bscrapy_dist_[a-z_]+\b")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def alert_rules() -> dict[str, Any]:
    """The rules file. It is written in YAML's JSON-compatible flow style (Prometheus
    reads it as YAML), so that it is checked here without a YAML library."""
    text = ALERTS.read_text(encoding="utf-8")
    assert "\t" not in text  # YAML refuses tabs in indentation
    rules: dict[str, Any] = json.loads(text)
    return rules


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def test_the_alert_rules_have_what_prometheus_needs() -> None:
    rules = alert_rules()
    assert set(rules) == {"groups"}
    names = set()
    for group in rules["groups"]:
        assert isinstance(group["name"], str)
        assert group["name"]
        assert set(group) <= {"name", "interval", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
            assert isinstance(rule["expr"], str)
            assert METRIC.search(rule["expr"])
            assert DURATION.match(rule["for"])
            assert all(isinstance(v, str) for v in rule["labels"].values())
            assert {"summary", "description"} <= set(rule["annotations"])
            names.add(rule["alert"])
    # what the issue asks for: dead letters growing, no progress while work is queued,
    # no workers while work is queued, Bloom fill high
    assert {
        "ScrapyDistDeadLettersGrowing",
        "ScrapyDistNoProgress",
        "ScrapyDistNoWorkers",
        "ScrapyDistBloomFillHigh",
    } <= names


@pytest.fixture
def crawl_metrics(  # noqa: PLR0917 (fixtures)
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> set[str]:
    """The metric names ``scrapy-dist metrics --once`` renders for a crawl with work
    queued, a lease, a dead letter, stats (for the rates), an item and a Bloom filter."""
    monkeypatch.chdir(tmp_path)
    keys = RedisKeys.build(name)
    client.zadd(keys.requests, {b"0000000000000001a": 0})
    client.rpush(keys.start_urls, "https://a.example/")
    client.rpush(keys.dead, json.dumps({"kind": "seed", "data": "x"}))
    client.rpush(keys.items, "{}")
    bloom = with_defaults(Settings({"DUPEFILTER_BACKEND": "bitmap", "BLOOM_CAPACITY": 1000}))
    backend_from_settings(bloom, client, keys).open().add_many([b"%020d" % i for i in range(9)])
    SharedStats(client, keys.stats, keys.timeline).apply(
        [("inc", "response_received_count", "10", "0"), ("inc", "item_scraped_count", "5", "0")]
    )
    assert main(["metrics", name, "--once", "--redis-url", redis_url]) == 0
    text = capsys.readouterr().out
    return {line.split("{", 1)[0] for line in text.splitlines() if not line.startswith("#")}


def test_every_metric_the_dashboard_and_the_rules_use_is_exported(
    crawl_metrics: set[str],
) -> None:
    rules = alert_rules()
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]] + dashboard_exprs()
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used, "no metric found in the dashboard or the rules"
    assert used - crawl_metrics == set()
    assert "scrapy_dist_bloom_fill" in used
