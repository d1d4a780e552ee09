"""Settings of the demo project: a local test site crawled by several workers.

Each ``scrapy crawl pages`` process is one worker; they share the request queue and
the dupefilter in the Redis server named by ``REDIS_URL``.
"""

from __future__ import annotations

BOT_NAME = "demo_project"
SPIDER_MODULES = ["demo_project.spiders"]
NEWSPIDER_MODULE = "demo_project.spiders"

ROBOTSTXT_OBEY = False

# scrapy_dist: one shared frontier in Redis for every worker.
SCHEDULER = "scrapy_dist.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
# a page's new requests are fenced by its lease (the add-on would add it)
SPIDER_MIDDLEWARES = {"scrapy_dist.parents.ParentLinks": 0}
REDIS_URL = "redis://127.0.0.1:6379/0"  # the demo always overrides it with -s REDIS_URL=...
SCHEDULER_PERSIST = False
# A batch crawl: every worker exits by itself a few seconds after the crawl as a whole
# is finished (nothing queued, leased or waiting as a seed, on any worker).
CLOSE_WHEN_CRAWL_DONE = True

# A fast local site: no politeness delays.
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
AUTOTHROTTLE_ENABLED = False
DOWNLOAD_TIMEOUT = 30
RETRY_ENABLED = True
COOKIES_ENABLED = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"

# Writes the final stats as JSON to DEMO_STATS_FILE, when that setting is given.
EXTENSIONS = {
    "demo_project.extensions.StatsFile": 500,
}
