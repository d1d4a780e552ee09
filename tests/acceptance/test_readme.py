"""The README's "Use it" snippets, executed as written (taken from README.md at test time),
and its first command, the demo.

Only what cannot run offline changes: ``https://example.com`` is the local site (its
home page is the site's first page), ``redis-cli`` is redis-py against the session's
server, and the workers get ``-s REDIS_URL=...`` plus a self-ending crawl on their
command line, as a user would point them elsewhere.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from conftest import environment
from test_crawls import readme_block

if TYPE_CHECKING:
    from conftest import Project


def test_readme_use_it(project: Project) -> None:
    settings = readme_block("# settings.py")
    spider = readme_block("# spiders/books.py")
    commands = readme_block("scrapy crawl books &")
    project.add_settings(settings)
    project.write("books/spiders/books.py", spider)

    site = project.site.url
    lines = [line.split("#")[0].strip() for line in commands.splitlines()]
    crawls = [line for line in lines if line.startswith("scrapy crawl")]
    pushes = [shlex.split(line) for line in lines if line.startswith("redis-cli")]
    assert crawls == ["scrapy crawl books &"] * 2, commands
    assert pushes, commands
    workers = project.crawl(
        len(crawls),
        settings={
            "REDIS_URL": project.redis_url,
            "CLOSE_WHEN_CRAWL_DONE": True,
            "CRAWL_DONE_GRACE": 1,
        },
    )
    with project.client() as client:
        for argv in pushes:
            args = [
                arg.replace("https://example.com/api", f"{site}/api").replace(
                    "https://example.com/", project.page(0)
                )
                for arg in argv[1:]
            ]
            client.execute_command(*args)
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    assert project.items() == len(project.site.expected_paths(0))
    assert project.dead() == []
    # The JSON seed became a POST (the site answers 405 to any POST, and Scrapy says so).
    logs = "".join(worker.text() for worker in workers)
    assert f"<405 {site}/api>" in logs, logs[-3000:]

    # The project's settings name the README's server: point the CLI at the session's,
    # as a user points it at theirs (the test never reads the machine's own Redis).
    status = project.cli("status", "books", "--redis-url", project.redis_url)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "books" in status.stdout


def test_readme_demo_crawls_every_page_once(tmp_path: Path) -> None:
    """The README's first command, ``make demo``, as the Makefile runs it after its set-up:
    ``example/demo.py`` (here on a 600-page site) crawls with two workers over a Redis
    of its own, says ``Result: OK`` and exits 0; its worker logs go to ``$TMPDIR``."""
    demo = Path(__file__).resolve().parents[2] / "example" / "demo.py"
    done = subprocess.run(
        [sys.executable, str(demo), "--pages", "600"],
        cwd=tmp_path,
        env=environment({"TMPDIR": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    said = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, said
    assert "Result: OK" in done.stdout, said
    assert "600 of 600 expected" in done.stdout, said
    assert "pages fetched more than once  0" in done.stdout, said
