"""``scrapy-dist web``: a live page of one crawl, served by the package itself.

:mod:`scrapy_dist.web.views` reads the crawl (through :mod:`scrapy_dist.status`, so the
page and ``status`` agree) and runs the actions; :mod:`scrapy_dist.web.server` serves
the page, its assets (``static/``: HTML, CSS and a script of our own, no CDN) and a
JSON twin of every view, read-only unless actions are enabled.
"""
