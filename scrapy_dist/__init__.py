"""Distributed Scrapy crawls over one shared Redis frontier.

The names below are the public API; everything else may be imported but is not promised.
"""

from scrapy_dist.addon import DistAddon
from scrapy_dist.connection import get_redis, get_redis_from_settings
from scrapy_dist.control import CrawlControl
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import (
    ConfigurationError,
    InvalidSeed,
    RedisUnavailable,
    ScrapyDistError,
    SerializationError,
)
from scrapy_dist.pipelines import RedisPipeline
from scrapy_dist.queue import FifoQueue, LifoQueue, PriorityQueue
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.spiders import RedisCrawlSpider, RedisSpider, RedisSpiderMixin
from scrapy_dist.stats import RedisStatsCollector

__version__ = "0.1.0"
__author__ = "scrapy_dist contributors"
__email__ = "scrapy-dist@users.noreply.github.com"

__all__ = [
    "ConfigurationError",
    "CrawlControl",
    "DistAddon",
    "FifoQueue",
    "InvalidSeed",
    "LifoQueue",
    "PriorityQueue",
    "RFPDupeFilter",
    "RedisCrawlSpider",
    "RedisPipeline",
    "RedisSpider",
    "RedisSpiderMixin",
    "RedisStatsCollector",
    "RedisUnavailable",
    "Scheduler",
    "ScrapyDistError",
    "SerializationError",
    "__version__",
    "get_redis",
    "get_redis_from_settings",
]
