"""A minimal Scrapy project that crawls with scrapy_dist: see ``example/demo.py``."""
