"""Settings of the Scrapy project the end-to-end tests run as worker processes."""

BOT_NAME = "testproject"
SPIDER_MODULES = ["testproject.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
COOKIES_ENABLED = False

SCHEDULER = "scrapy_dist.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
