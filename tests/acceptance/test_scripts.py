"""The user's own scripts, the ways Scrapy documents running a spider without ``scrapy crawl``.

Two copies of each script run as processes against one Redis: every page once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import scrapy.crawler

if TYPE_CHECKING:
    from conftest import Project

HEADER = """\
from scrapy.utils.project import get_project_settings

from books.spiders.books import BooksSpider

"""

SCRIPTS = {
    "crawler_process": HEADER
    + """\
from scrapy.crawler import CrawlerProcess

process = CrawlerProcess(get_project_settings())
process.crawl(BooksSpider)
process.start()
""",
    "async_crawler_process": HEADER
    + """\
from scrapy.crawler import AsyncCrawlerProcess

process = AsyncCrawlerProcess(get_project_settings())
process.crawl(BooksSpider)
process.start()
""",
    "crawler_runner": HEADER
    + """\
from scrapy.crawler import CrawlerRunner
from scrapy.utils.log import configure_logging
from scrapy.utils.reactor import install_reactor

install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
settings = get_project_settings()
configure_logging(settings)
runner = CrawlerRunner(settings)
finished = runner.crawl(BooksSpider)

from twisted.internet import reactor

finished.addBoth(lambda _: reactor.stop())
reactor.run()
""",
}


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_script(project: Project, kind: str) -> None:
    """``python run.py`` twice: both crawl the shared frontier, each page once, exit 0."""
    if kind.startswith("async") and not hasattr(scrapy.crawler, "AsyncCrawlerProcess"):
        pytest.skip("this Scrapy has no AsyncCrawlerProcess")
    project.use_scrapy_dist()
    script = project.write("run.py", SCRIPTS[kind])
    runs = project.script(script, 2)
    project.seed()
    project.assert_clean_exit(runs)
    project.assert_each_page_once()
    assert project.items() == len(project.site.expected_paths(0))
