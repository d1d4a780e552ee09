"""The Scrapy project run by ``benchmarks/bench_crawl.py``: one spider per scheduler."""
