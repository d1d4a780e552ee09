from __future__ import annotations

from scrapy.utils.test import get_crawler

from scrapy_dist.addon import DistAddon
from scrapy_dist.assembly import assemble
from scrapy_dist.metrics import PrometheusMetrics


def test_addon_installs_components_and_defaults_below_project_settings() -> None:
    crawler = get_crawler(settings_dict={"ADDONS": {DistAddon: 0}, "SCHEDULER_PERSIST": True})
    settings = crawler.settings
    assert settings["SCHEDULER"] == "scrapy_dist.scheduler.Scheduler"
    assert settings["DUPEFILTER_CLASS"] == "scrapy_dist.dupefilter.RFPDupeFilter"
    assert settings.getbool("SCHEDULER_PERSIST")  # the project's value wins
    assert settings["SCHEDULER_QUEUE_KEY"] == "%(spider)s:requests"
    assert settings.getpriority("SCHEDULER_QUEUE_KEY") == settings.getpriority("SCHEDULER")
    assert PrometheusMetrics in settings.getdict("EXTENSIONS")


def test_defaults_without_the_addon() -> None:
    crawler = get_crawler(settings_dict={"SCHEDULER_PERSIST": True})
    config = assemble(crawler).config
    assert config is assemble(crawler).config  # computed once per crawler
    resolved = config.settings
    assert resolved.getbool("SCHEDULER_PERSIST")
    assert resolved.getfloat("SCHEDULER_LEASE_TIMEOUT") == 120
    assert config.scheduler.persist
    assert config.frontier.lease_timeout == 120
    assert crawler.settings.get("SCHEDULER_LEASE_TIMEOUT") is None  # not written back
