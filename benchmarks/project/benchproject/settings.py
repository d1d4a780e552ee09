"""Settings shared by every benchmark worker, whatever its scheduler.

Each spider picks its scheduler and dupefilter in ``custom_settings``; everything else
(concurrency, no throttling, no robots.txt, log level) is the same for all of them.
``bench_crawl.py`` overrides ``CONCURRENT_REQUESTS`` and passes ``REDIS_URL`` and
``BENCH_STATS_FILE`` with ``-s``.
"""

from __future__ import annotations

BOT_NAME = "benchproject"
SPIDER_MODULES = ["benchproject.spiders"]
NEWSPIDER_MODULE = "benchproject.spiders"

ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
COOKIES_ENABLED = False
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
AUTOTHROTTLE_ENABLED = False
DOWNLOAD_TIMEOUT = 30

# Keep the frontier in Redis at the end so the benchmark can measure its memory.
SCHEDULER_PERSIST = True

# Per-worker pages, CPU time and Redis round trips, written at close to BENCH_STATS_FILE.
EXTENSIONS = {"benchproject.extensions.BenchStats": 0}
