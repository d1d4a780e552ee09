"""``python -m scrapy_dist``: the ``scrapy-dist`` command (see :mod:`scrapy_dist.cli`)."""

import sys

from scrapy_dist.cli import main

sys.exit(main())
