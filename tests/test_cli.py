"""The ``scrapy-dist`` command, run as a real subprocess against the session's Redis.

Quick checks call :func:`scrapy_dist.cli.main` in-process; the contracts (a 100,000-line
push, status during a running crawl, requeue of dead letters, reset of one job, jobs,
errors) run ``python -m scrapy_dist`` in a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings

from scrapy_dist.addon import with_defaults
from scrapy_dist.cli import main
from scrapy_dist.cli.push import ProgressBar
from scrapy_dist.filters import backend_from_settings
from scrapy_dist.keys import RedisKeys, level_key
from scrapy_dist.serializers import JsonSerializer
from scrapy_dist.stats import decode_stats
from scrapy_dist.status import json_default
from scrapy_dist.testing.leases import holdings
from scrapy_dist.testing.queues import queued_count, queued_entries
from scrapy_dist.testing.redis_server import free_port
from scrapy_dist.testing.site import TestSite, links
from scrapy_dist.testing.workers import (
    run_cli,
    start_workers,
    stop_workers,
    wait_ready,
    wait_workers,
)
from scrapy_dist.testing.workers import run_cli as cli

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy_dist.testing.workers import Worker

PROJECT = Path(__file__).parent / "project"


def _bytes_hash(reply: dict[bytes | str, bytes | str]) -> dict[bytes, bytes]:
    """An ``HGETALL`` reply of a client without ``decode_responses``, typed as it is."""
    return cast("dict[bytes, bytes]", reply)


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Call ``main(args)`` in-process outside any project; returns (code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)

    def call(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return call


# -- push -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["push", "books", "https://example.com/"],
        ["dead", "purge", "books", "-y"],
        ["reset", "books", "-y"],
        ["pause", "books"],
        ["export", "books", "-o", "out.jl", "--delete"],
    ],
)
def test_outside_a_project_a_command_that_writes_needs_a_redis_named(
    run: Any, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """It wrote to redis://localhost:6379/0 and exited 0 (a warning said so): a
    command that writes acts only where it was told."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    code, _, err = run(*command)
    assert code == 2
    assert "no Redis named: this command writes" in err
    assert "--redis-url or the REDIS_URL environment variable" in err


def test_the_redis_url_environment_variable_names_the_redis(
    run: Any, monkeypatch: pytest.MonkeyPatch, redis_url: str, client: redis.Redis, name: str
) -> None:
    """REDIS_URL=... scrapy-dist COMMAND ignored the variable; --redis-url wins over it."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    code, _, err = run("push", name, "https://example.com/")
    assert code == 0, err
    assert "not inside a Scrapy project" not in err
    assert client.lrange(f"{name}:start_urls", 0, -1) == [b"https://example.com/"]
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    code, _, err = run("status", name, "--redis-url", redis_url)
    assert code == 0, err


#: Invalid seed lines, and a fragment of the reason each must be reported with.
INVALID = [
    ("ftp://example.com/file", "must start with http:// or https://"),
    # an unknown field is form data (scrapy-redis's seeds), which must be text
    ('{"url": "https://example.com/a", "colour": 5}', "formdata['colour']"),
    ('{"url": "https://example.com/a", "priority": "high"}', "'priority' must be an integer"),
    ('{"url": "https://example.com/a"', "not valid JSON"),
    ("[1, 2]", "must be an object"),
    ('{"method": "POST"}', "no 'url'"),
    ("https://exa mple.com/", "contains whitespace"),
    ('{"url": "https://example.com/a", "body": "x", "json": {}}', "use only one of"),
]


def write_seeds(path: Path, lines: int) -> tuple[list[bytes], list[tuple[int, str]], int]:
    """A seed file of ``lines`` lines: valid URLs and JSON seeds, 40 invalid lines and 5
    blank ones. Returns the valid lines in order, ``(line number, reason)`` of the
    invalid ones, and the number of blank lines."""
    rng = random.Random(lines)
    valid: list[bytes] = []
    invalid: list[tuple[int, str]] = []
    blank = 0
    with path.open("w", encoding="utf-8") as stream:
        for i in range(lines):
            number = i + 1
            if i % 2500 == 1234:
                text, reason = INVALID[len(invalid) % len(INVALID)]
                invalid.append((number, reason))
            elif i % 20000 == 777:
                text = "   "
                blank += 1
            elif rng.random() < 0.3:
                seed = {"url": f"https://example.com/p/{i}", "priority": rng.randrange(9)}
                text = json.dumps({**seed, "meta": {"n": i}, "formdata": {"q": "é"}})
                valid.append(text.encode())
            else:
                text = f"https://example.com/{i}?q=%C3%A9"
                valid.append(text.encode())
            stream.write(text + "\n")
    return valid, invalid, blank


def test_push_100k_lines_pushes_only_valid_ones_and_reports_the_others(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    path = tmp_path / "seeds.txt"
    valid, invalid, blank = write_seeds(path, 100_000)
    assert len(invalid) == 40
    started = time.monotonic()
    done = cli("push", name, "--file", str(path), "--redis-url", redis_url, "--json", cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr  # some lines were invalid
    report = json.loads(done.stdout)
    assert report == {
        "key": f"{name}:start_urls",
        "type": "list",
        "pushed": len(valid),
        "new": len(valid),
        "invalid": 40,
        "blank": blank,
        "dry_run": False,
    }
    errors = done.stderr.splitlines()
    assert len(errors) == 21
    for line, (number, reason) in zip(errors, invalid[:20], strict=False):
        assert line.startswith(f"line {number}: "), line
        assert reason in line, line
    assert errors[-1] == "... and 20 more invalid line(s)"
    # exactly the valid lines, in input order, first line first out
    assert client.lrange(f"{name}:start_urls", 0, -1) == valid
    assert elapsed < 30, f"push of 100,000 lines took {elapsed:.1f}s"


def test_push_urls_in_set_and_zset_modes(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    urls = ["https://a.example/", "https://b.example/", "https://a.example/"]
    code, out, _ = run(
        "push", name, *urls, "--redis-url", redis_url, "-s", "REDIS_START_URLS_AS_SET=True"
    )
    assert code == 0
    assert "pushed 3 seed(s)" in out
    assert "2 new" in out
    assert client.smembers(f"{name}:start_urls") == {b"https://a.example/", b"https://b.example/"}
    code, out, _ = run(
        "push",
        name,
        "https://c.example/",
        "--job",
        "z",
        "--score",
        "7",
        "--redis-url",
        redis_url,
        "-s",
        "REDIS_START_URLS_AS_ZSET=1",
    )
    assert code == 0, out
    assert client.zrange(f"{name}:z:start_urls", 0, -1, withscores=True) == [
        (b"https://c.example/", 7.0)
    ]


def test_push_dry_run_and_stdin_errors(
    run: Any, redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    path = tmp_path / "s.txt"
    path.write_text("https://a.example/\nmailto:x@y\n")
    code, out, err = run("push", name, "-f", str(path), "--dry-run", "--redis-url", redis_url)
    assert code == 1
    assert "valid (dry run, nothing pushed) 1 seed(s)" in out
    assert "line 2: URL 'mailto:x@y' must start with http:// or https://" in err
    assert not client.exists(f"{name}:start_urls")
    code, _, err = run("push", name, "-f", str(tmp_path / "missing.txt"), "--redis-url", redis_url)
    assert code == 2
    assert "cannot read" in err


def test_push_in_a_project_checks_callbacks_and_spiders(
    redis_url: str, client: redis.Redis, name: str
) -> None:
    seeds = [
        '{"url": "https://a.example/", "callback": "parse"}',
        '{"url": "https://b.example/", "callback": "parse_missing"}',
    ]
    done = cli("push", "pages", *seeds, "--job", name, "--redis-url", redis_url, cwd=PROJECT)
    assert done.returncode == 1
    assert "argument 2: callback 'parse_missing' is not a method of spider 'pages'" in done.stderr
    assert client.lrange(f"pages:{name}:start_urls", 0, -1) == [seeds[0].encode()]
    client.delete(f"pages:{name}:start_urls")
    unknown = cli("push", "nosuch", "https://a.example/", "--redis-url", redis_url, cwd=PROJECT)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "scrapy-dist: error: unknown spider 'nosuch' in this Scrapy project (its spiders: pages)"
    )


def test_progress_bar() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, total=1000)
    bar.update(10, 250)
    bar.update(20, 500)  # within 0.1 s of the last draw: skipped
    bar.finish(40, 1000)
    assert stream.getvalue() == (
        f"\r[{'#' * 7:<30}]  25.0%  10 lines\r[{'#' * 30}] 100.0%  40 lines\n"
    )


# -- errors -----------------------------------------------------------------------------


def test_unreachable_redis_is_one_clear_line(tmp_path: Path) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    done = cli("status", "books", "--redis-url", url, cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"scrapy-dist: error: cannot reach Redis at {url.replace('hunter2', '***')}"
    )
    assert "hunter2" not in done.stderr


def test_wrong_key_type_is_named(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path, run: Any
) -> None:
    client.hset(f"{name}:start_urls", "a", "b")
    done = cli("push", name, "https://a.example/", "--redis-url", redis_url, cwd=tmp_path)
    assert done.returncode == 2
    assert f"seeds key '{name}:start_urls' holds a hash, but this crawl reads a list" in done.stderr
    assert "Traceback" not in done.stderr
    client.delete(f"{name}:start_urls")
    client.rpush(f"{name}:requests", "x")
    code, _, err = run("status", name, "--redis-url", redis_url)
    assert code == 2
    assert (
        f"Redis key '{name}:requests' (queue) holds a list, but these settings expect a "
        "string or zset" in err
    )
    assert "SCHEDULER_QUEUE_CLASS = 'scrapy_dist.queue.FifoQueue'" in err


def test_status_judges_a_new_run_on_its_own_work(
    redis_url: str, client: redis.Redis, name: str, run: Any
) -> None:
    """A worker that joins a finished crawl starts a new run (``run_base`` = settlements
    so far): until the run settles something, the crawl is waiting, not idle."""
    client.hset(f"{name}:progress", mapping={"done": 5, "dead": 1, "run_base": 6})
    code, out, _ = run("status", name, "--json", "--redis-url", redis_url)
    assert code == 0
    assert json.loads(out)["state"] == "waiting"
    client.hincrby(f"{name}:progress", "done", 1)
    code, out, _ = run("status", name, "--json", "--redis-url", redis_url)
    assert json.loads(out)["state"] == "idle"


@pytest.mark.parametrize("value", [b"junk", b"nan", b"inf", b"1.5"])
def test_status_reads_a_progress_counter_written_by_hand_as_0(
    redis_url: str, client: redis.Redis, name: str, run: Any, value: bytes
) -> None:
    """``int(float(...))`` of "nan" or "inf" failed the status (a traceback), and a
    finished_at of 1e300 failed the text report; a counter that is not a whole number
    reads as 0, as the scripts read it."""
    client.hset(f"{name}:progress", mapping={"done": value, "dead": 2, "finished_at": b"1e300"})
    code, out, err = run("status", name, "--json", "--redis-url", redis_url)
    assert code == 0, err
    progress = json.loads(out)["progress"]
    assert (progress["done"], progress["dead"]) == (0, 2)
    code, out, err = run("status", name, "--redis-url", redis_url)
    assert code == 0, err
    assert "Traceback" not in err


def test_status_reads_a_progress_key_of_another_type_as_no_counters(
    redis_url: str, client: redis.Redis, name: str, run: Any
) -> None:
    """The progress key written as a string: status refused the whole crawl (the
    scripts set it aside as they count, lua/_leases.lua)."""
    client.set(f"{name}:progress", b"junk")
    client.rpush(f"{name}:start_urls", b"https://a.example/")
    code, out, err = run("status", name, "--json", "--redis-url", redis_url)
    assert code == 0, err
    status = json.loads(out)
    assert (status["state"], status["seeds"]["waiting"]) == ("busy", 1)
    assert status["progress"]["done"] == 0
    code, out, err = run("status", name, "--redis-url", redis_url)
    assert code == 0, err


def test_status_reads_a_bloom_filter_with_its_own_size(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    created = with_defaults(
        Settings({"DUPEFILTER_BACKEND": "bitmap", "BLOOM_CAPACITY": 1000, "BLOOM_ERROR_RATE": 0.01})
    )
    backend = backend_from_settings(created, client, RedisKeys.build(name)).open()
    backend.add_many([b"%020d" % i for i in range(700)])
    code, out, _ = run("status", name, "--json", "--redis-url", redis_url)  # default settings
    assert code == 0
    dupefilter = json.loads(out)["dupefilter"]
    assert dupefilter["backend"] == "bitmap"
    assert dupefilter["capacity"] == 1000
    assert dupefilter["fill"] == pytest.approx(0.7, abs=0.01)
    assert 0 < dupefilter["fpr_estimate"] < 0.01
    code, out, _ = run("reset", name, "--yes", "--redis-url", redis_url)
    # the hash, its bits, and the next stage's bits, pre-sized once the first is half full
    assert out.strip() == f"deleted 3 key(s) of crawl '{name}'"


# -- reset and jobs ---------------------------------------------------------------------


def fill_crawl(client: redis.Redis, keys: RedisKeys) -> list[str]:
    """Create every key a crawl may have (types do not matter to reset)."""
    names = [
        *keys.every(),
        keys.bloom_segment(0, 0),
        keys.bloom_segment(1, 0),
        keys.bloom_segment(7, 3),
        level_key(keys.requests, "-3"),  # the priority queue's levels (found with SCAN)
        level_key(keys.requests, "0"),
        level_key(keys.requests, "0") + ":wrongtype",
    ]
    for key in names:
        client.rpush(key, "x")
    return names


def test_reset_removes_exactly_one_jobs_keys_and_jobs_lists_crawls(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path, run: Any
) -> None:
    plain = fill_crawl(client, RedisKeys.build(name))
    job1 = fill_crawl(client, RedisKeys.build(name, job="20261122"))
    job2 = fill_crawl(client, RedisKeys.build(name, job="20261123"))
    strangers = [f"{name}:notes", f"{name}:20261122:notes", f"{name}:dupefilter:x"]
    for key in strangers:
        client.set(key, "keep")

    listed = cli("jobs", "--json", "--redis-url", redis_url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    crawls = {row["crawl"]: row for row in json.loads(listed.stdout) if row["spider"] == name}
    assert set(crawls) == {name, f"{name}:20261122", f"{name}:20261123"}
    assert crawls[f"{name}:20261122"]["job"] == "20261122"

    done = cli("reset", name, "--job", "20261122", "--yes", "--redis-url", redis_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted {len(job1)} key(s) of crawl '{name}:20261122'"
    remaining = {k.decode() for k in client.scan_iter(match=f"{name}*")}
    assert remaining == {*plain, *job2, *strangers}

    # the plain crawl's keys are a prefix of every job's: only its own go
    code, out, _ = run("reset", name, "--yes", "--redis-url", redis_url)
    assert code == 0
    assert out.strip() == f"deleted {len(plain)} key(s) of crawl '{name}'"
    remaining = {k.decode() for k in client.scan_iter(match=f"{name}*")}
    assert remaining == {*job2, *strangers}


def _project_with_literal_redis_key(root: Path, spider: str, redis_url: str) -> Path:
    """A user's project whose spider names its seeds key literally, as scrapy-redis's
    README does (``redis_key = "<spider>:start_urls"``): every job of it reads that key."""
    package = root / "shop"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = shop.settings\n")
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(
        'BOT_NAME = "shop"\nSPIDER_MODULES = ["shop.spiders"]\n'
        'SCHEDULER = "scrapy_dist.scheduler.Scheduler"\n'
        'DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"\n'
        f"REDIS_URL = {redis_url!r}\n"
    )
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "books.py").write_text(
        "from scrapy_dist.spiders import RedisSpider\n\n\n"
        "class Books(RedisSpider):\n"
        f"    name = {spider!r}\n"
        f"    redis_key = {spider + ':start_urls'!r}\n\n"
        "    def parse(self, response):\n"
        "        yield {'url': response.url}\n"
    )
    return root


def test_reset_of_a_job_keeps_a_literal_redis_key_that_every_job_reads(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """``reset --job j1`` deleted ``<spider>:start_urls``, the literal ``redis_key`` of
    the spider, and with it the seeds an operator had just pushed for job j2."""
    project = _project_with_literal_redis_key(tmp_path, name, redis_url)
    seeds = f"{name}:start_urls"
    pushed = cli("push", name, "--job", "j2", "http://example.com/a", cwd=project)
    assert pushed.returncode == 0, pushed.stderr
    assert f"to {seeds!r}" in pushed.stdout
    job1 = RedisKeys.build(name, job="j1")
    client.rpush(job1.dead, "{}")
    client.hset(job1.progress, "done", 3)

    done = cli("reset", name, "--job", "j1", "--yes", cwd=project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted 2 key(s) of crawl '{name}:j1'"
    assert f"kept 1 key(s) whose name does not contain '{name}:j1'" in done.stderr
    assert f"  {seeds}\n" in done.stderr
    assert client.lrange(seeds, 0, -1) == [b"http://example.com/a"]

    # nothing of the job's own is left: the shared key alone is no crawl to delete
    again = cli("reset", name, "--job", "j1", "--yes", cwd=project)
    assert again.returncode == 1
    assert f"kept 1 key(s) whose name does not contain '{name}:j1'" in again.stderr
    assert client.exists(seeds)

    everything = cli("reset", name, "--job", "j1", "--yes", "--include-shared", cwd=project)
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.strip() == f"deleted 1 key(s) of crawl '{name}:j1'"
    assert not client.exists(seeds)

    # a job whose name starts the key's last part does not own it either (job "start":
    # crawl "<spider>:start" is a prefix of "<spider>:start_urls")
    client.rpush(seeds, "http://example.com/c")
    client.rpush(RedisKeys.build(name, job="start").dead, "{}")
    prefix = cli("reset", name, "--job", "start", "--yes", cwd=project)
    assert prefix.returncode == 0, prefix.stderr
    assert prefix.stdout.strip() == f"deleted 1 key(s) of crawl '{name}:start'"
    assert f"  {seeds}\n" in prefix.stderr
    assert client.exists(seeds)
    client.delete(seeds)

    # the crawl without a job owns the key its name is in, as before
    client.rpush(seeds, "http://example.com/b")
    plain = cli("reset", name, "--yes", cwd=project)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == f"deleted 1 key(s) of crawl '{name}'"
    assert "kept" not in plain.stderr


def test_one_crawl_written_by_hand_does_not_hide_the_others(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    """`status` (no spider) and `jobs` read every crawl in Redis; one whose queue key an
    operator overwrote with a string made both exit 2 ("Redis answered: WRONGTYPE"),
    showing no crawl at all."""
    sound, broken = RedisKeys.build(f"{name}a"), RedisKeys.build(f"{name}b")
    client.rpush(sound.dead, "{}")
    client.rpush(broken.dead, "{}")
    client.set(broken.requests, "junk")
    code, out, err = run("status", "--redis-url", redis_url)
    assert code == 0, err
    assert f"crawl {name}a  " in out
    assert f"crawl {name}b  [error]\n  Redis answered: WRONGTYPE" in out
    code, out, err = run("status", "--json", "--redis-url", redis_url)
    assert code == 0, err
    crawls = {c["crawl"]: c for c in json.loads(out)["crawls"]}
    assert crawls[f"{name}a"]["dead"]["records"] == 1
    assert crawls[f"{name}b"]["error"].startswith("Redis answered: WRONGTYPE")
    code, out, err = run("jobs", "--json", "--redis-url", redis_url)
    assert code == 0, err
    rows = {row["crawl"]: row for row in json.loads(out)}
    assert rows[f"{name}a"]["dead"] == 1
    assert rows[f"{name}b"]["error"].startswith("Redis answered: WRONGTYPE")


@contextlib.contextmanager
def _interruptible_children() -> Iterator[None]:
    """Start child processes that SIGINT interrupts. A job a shell starts in the
    background (CI runs its legs so) inherits SIGINT ignored, Python leaves it ignored,
    and so would its children; with a Python handler here, ``exec`` gives them SIGINT's
    default action, which Python turns into KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.e2e
def test_an_interrupted_push_says_how_far_it_got(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """Ctrl-C during a long push printed a blank line: the batches sent before stayed
    pushed, but the operator could not tell which lines to push again."""
    env = {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}
    with _interruptible_children():
        push = subprocess.Popen(
            [sys.executable, "-m", "scrapy_dist", "push", name, "--redis-url", redis_url, "-q"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    assert push.stdin is not None
    push.stdin.write(b"".join(b"https://a.example/%d\n" % i for i in range(25_000)))
    push.stdin.flush()  # and left open: the command waits for more lines
    deadline = time.monotonic() + 60
    while client.llen(f"{name}:start_urls") < 20_000:
        assert time.monotonic() < deadline, push.stderr
        time.sleep(0.05)
    push.send_signal(signal.SIGINT)
    _, stderr = push.communicate(timeout=30)
    assert push.returncode == 130
    assert (
        f"interrupted: 20000 seed(s) pushed to '{name}:start_urls', the valid ones of the "
        "first 20000 line(s); to resume, push from line 20001 on"
    ) in stderr.decode()
    assert client.llen(f"{name}:start_urls") == 20_000


def test_status_json_is_json_with_a_stat_that_is_not_a_number(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    """A stat written as nan or inf (a spider's float stat, or by hand) was printed as
    NaN / Infinity, which strict JSON readers refuse."""
    keys = RedisKeys.build(name)
    client.rpush(keys.dead, "{}")
    client.hset(keys.stats, mapping={"x": "nan", "y": "inf"})
    code, out, err = run("status", name, "--json", "--redis-url", redis_url)
    assert code == 0, err
    stats = json.loads(out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))["stats"]
    assert (stats["x"], stats["y"]) == ("nan", "inf")


@pytest.mark.e2e
def test_ctrl_c_ends_status_watch_with_0_whenever_it_lands(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """Ctrl-C landing while `status --watch` read Redis (not while it slept) exited 130;
    docs/cli.md says --watch ends with 0."""
    client.rpush(RedisKeys.build(name).dead, "{}")
    command = [sys.executable, "-m", "scrapy_dist", "status", name, "--watch"]
    command += ["--interval", "0.001", "--redis-url", redis_url]
    for pause in (0.0, 0.05, 0.2, 0.5):
        with _interruptible_children():
            watch = subprocess.Popen(
                command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        assert watch.stdout is not None
        # once the watch runs (its first report is out: a loaded machine may take seconds
        # to import), not while Python is still starting
        assert watch.stdout.readline(), watch.communicate(timeout=30)[1]
        time.sleep(pause)
        watch.send_signal(signal.SIGINT)
        _, stderr = watch.communicate(timeout=30)
        assert watch.returncode == 0, stderr


@pytest.mark.e2e
def test_reset_looks_for_live_workers_again_once_answered(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """`reset` checked for live workers before asking, not after: a worker that started
    while the question was open had its crawl deleted under it, exit status 0."""
    import pty

    keys = RedisKeys.build(name)
    client.rpush(keys.dead, "{}")
    parent, child = pty.openpty()
    reset = subprocess.Popen(
        [sys.executable, "-m", "scrapy_dist", "reset", name, "--redis-url", redis_url],
        cwd=tmp_path,
        stdin=child,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(child)
    try:
        assert reset.stderr is not None
        asked = b""
        deadline = time.monotonic() + 30
        while b"[y/N]" not in asked:
            assert time.monotonic() < deadline, asked
            asked += os.read(reset.stderr.fileno(), 4096)
        seconds, _ = client.time()
        client.hset(keys.workers, "host:1:abc", seconds)  # a worker started meanwhile
        os.write(parent, b"y\n")
        _, stderr = reset.communicate(timeout=30)
    finally:
        os.close(parent)
    assert reset.returncode == 1, stderr
    assert b"1 live worker(s) (host:1:abc)" in stderr
    assert client.exists(keys.dead)


def test_reset_refuses_live_workers_and_needs_confirmation(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    keys = RedisKeys.build(name)
    client.rpush(keys.dead, "x")
    seconds, _ = client.time()
    client.hset(keys.workers, "host:1:abc", seconds)
    code, _, err = run("reset", name, "--yes", "--redis-url", redis_url)
    assert code == 1
    assert "1 live worker(s) (host:1:abc)" in err
    assert client.exists(keys.dead)
    code, _, err = run("reset", name, "--force", "--redis-url", redis_url)  # stdin: no terminal
    assert code == 1  # refused, as docs/cli.md says (was 2)
    assert "Refusing without --yes" in err
    assert client.exists(keys.dead)
    code, out, _ = run("reset", name, "--force", "--yes", "--redis-url", redis_url)
    assert code == 0
    assert out.strip() == f"deleted 2 key(s) of crawl '{name}'"


@pytest.mark.parametrize("beat", [b"junk", b"nan", b"inf"])
def test_reset_counts_a_heartbeat_written_by_hand_as_a_gone_worker(
    run: Any, redis_url: str, client: redis.Redis, name: str, beat: bytes
) -> None:
    """float() of "junk" failed reset with a traceback, and "inf" counted as alive for
    ever; as in lua/join.lua, it is a gone worker's ("nan" already was)."""
    keys = RedisKeys.build(name)
    client.rpush(keys.dead, "x")
    client.hset(keys.workers, "host:1:abc", beat)
    code, out, err = run("reset", name, "--yes", "--redis-url", redis_url)
    assert code == 0, err
    assert out.strip() == f"deleted 2 key(s) of crawl '{name}'"


def test_status_lists_and_reset_deletes_the_keys_scripts_set_aside(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    """A key written by hand is renamed out of the way by the frontier's scripts
    (``<key>:wrongtype``, ``<key>:wrongtype:<n>`` when taken) and a garbled progress
    field kept in ``<field>:wrongtype``. `status` did not name them, so the operator
    never learned of them, and `reset` left them behind (it deleted the crawl, then
    `jobs` still listed it)."""
    keys = RedisKeys.build(name)
    aside = [
        f"{keys.seq}:wrongtype",
        f"{keys.workers}:wrongtype",
        f"{keys.workers}:wrongtype:2",
        f"{keys.workers}:wrongtype:5",  # 3 and 4 deleted by the operator
        f"{keys.requests}:wrongtype",
        f"{keys.start_urls}:wrongtype",
        f"{keys.dead}:wrongtype",
        f"{keys.deliveries}:wrongtype",
        f"{keys.progress}:wrongtype",
        f"{keys.politeness_busy}:wrongtype",  # (cluster-wide politeness sets its own aside)
        f"{keys.politeness_next}:wrongtype:2",
        f"{name}:items:stream:dead-letters:wrongtype",  # (by lua/item_stream.lua)
    ]
    for key in aside:
        client.set(key, b"junk")
    client.hset(keys.progress, mapping={"done": 0, "done:wrongtype": b"12x"})
    client.hset(keys.progress, "dead:wrongtype", b"\xff\xfe junk")  # not UTF-8
    far = f"{keys.dead}:wrongtype:14"  # past a gap of 10 deleted copies: only reset sees it
    client.set(far, b"junk")
    code, out, err = run("status", name, "--redis-url", redis_url)
    assert code == 0, err
    assert f"  set aside         {len(aside) + 2}  found holding" in out
    for key in aside:
        assert f"  {key}\n" in out + "\n"
    assert "progress field done:wrongtype = '12x'" in out
    assert "progress field dead:wrongtype = '\\\\xff\\\\xfe junk'" in out
    code, out, _ = run("status", name, "--json", "--redis-url", redis_url)
    listed = json.loads(out)["set_aside"]
    assert sorted(listed["keys"]) == sorted(aside)
    assert listed["progress_fields"] == {
        "dead:wrongtype": "\\xff\\xfe junk",
        "done:wrongtype": "12x",
    }

    code, out, err = run("reset", name, "--yes", "--redis-url", redis_url)
    assert code == 0, err
    assert out.strip() == f"deleted {len(aside) + 2} key(s) of crawl '{name}'"
    assert list(client.scan_iter(match=f"{name}*")) == []


def test_status_of_a_sound_crawl_lists_nothing_set_aside(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    client.rpush(RedisKeys.build(name).dead, "{}")
    code, out, _ = run("status", name, "--redis-url", redis_url)
    assert code == 0
    assert "set aside" not in out
    code, out, _ = run("status", name, "--json", "--redis-url", redis_url)
    assert json.loads(out)["set_aside"] == {"keys": [], "progress_fields": {}}


# -- a crawl that has no keys -------------------------------------------------------


def test_a_crawl_with_no_keys_is_named_with_the_crawls_that_exist(
    run: Any, redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """docs/cli.md: a command pointed at a crawl with no keys says so on stderr and
    names the crawls that exist; those that work on a part of the crawl exit 1 having
    changed nothing, status and metrics report it as absent and exit 0."""
    client.rpush(f"{name}:20261122:dead", "{}")
    client.rpush(f"{name}:20261122:items", "{}")
    absent = f"crawl '{name}:20261123' has no keys at {redis_url}"
    commands = [
        (0, ["status", name]),
        (0, ["status", name, "--json"]),
        (0, ["metrics", name, "--once"]),
        (1, ["dead", "list", name]),
        (1, ["dead", "requeue", name, "--all"]),
        (1, ["dead", "purge", name, "--yes"]),
        (1, ["reset", name, "--yes"]),
        (1, ["export", name, "-o", str(tmp_path / "items.jl")]),
    ]
    for expected, command in commands:
        code, out, err = run(*command, "--job", "20261123", "--redis-url", redis_url)
        assert code == expected, (command, out, err)
        assert f"scrapy-dist: warning: {absent}" in err, (command, err)
        assert f"{name}:20261122" in err.split("crawls in Redis: ", 1)[1], (command, err)
        assert "0 records" not in out
    assert not (tmp_path / "items.jl").exists()
    code, out, _ = run("status", name, "--job", "20261123", "--json", "--redis-url", redis_url)
    assert json.loads(out)["state"] == "absent"
    code, out, _ = run("metrics", name, "--job", "20261123", "--once", "--redis-url", redis_url)
    assert "scrapy_dist_up{" in out
    assert "scrapy_dist_queue_depth{" in out
    assert client.llen(f"{name}:20261122:dead") == 1  # nothing touched
    assert client.llen(f"{name}:20261122:items") == 1

    # a push starts a crawl: said only when the spider has other crawls (another job?)
    code, out, err = run(
        "push", name, "https://a.example/", "--job", "20261123", "--redis-url", redis_url
    )
    assert code == 0, err
    assert f"scrapy-dist: note: {absent}" in err
    assert f"{name}:20261122" in err
    code, _, err = run("push", f"{name}new", "https://a.example/", "--redis-url", redis_url)
    assert code == 0
    assert err == ""
    code, out, err = run("dead", "list", name, "--job", "20261123", "--redis-url", redis_url)
    assert (code, err) == (0, "")  # it exists now
    assert out.strip() == f"{name}:20261123:dead: 0 record(s)"


def test_the_job_timestamp_comes_from_the_redis_servers_clock(
    run: Any, redis_url: str, client: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SCHEDULER_JOB_TIMESTAMP stamp is the server's, as the workers take it, even on
    a machine whose clock is off; a dry run (no Redis needed) takes the local clock."""
    import datetime as real

    import scrapy_dist.keys

    class Skewed(real.datetime):
        @classmethod
        def now(cls, tz: real.tzinfo | None = None) -> Skewed:
            return cls(1999, 1, 1, tzinfo=tz)

    monkeypatch.setattr(scrapy_dist.keys, "datetime", Skewed)
    seconds, _ = client.time()
    year = real.datetime.fromtimestamp(int(seconds), real.timezone.utc).year
    stamp = ["-s", "SCHEDULER_JOB_TIMESTAMP=%Y", "--redis-url", redis_url]
    code, out, err = run("push", name, "https://a.example/", *stamp)
    assert code == 0, err
    assert f"to '{name}:{year}:start_urls'" in out
    assert client.lrange(f"{name}:{year}:start_urls", 0, -1) == [b"https://a.example/"]
    code, out, err = run("dead", "list", name, *stamp)
    assert (code, err) == (0, "")
    assert out.strip() == f"{name}:{year}:dead: 0 record(s)"
    code, out, _ = run("push", name, "https://a.example/", "--dry-run", *stamp)
    assert code == 0
    assert f"'{name}:1999:start_urls'" in out


# -- dead letters (in-process) -------------------------------------------------------


def request_payload(url: str, priority: int) -> str:
    return JsonSerializer().dumps(Request(url, priority=priority).to_dict()).decode()


def test_dead_list_requeue_and_purge(
    run: Any, redis_url: str, client: redis.Redis, name: str
) -> None:
    keys = RedisKeys.build(name)
    records = [
        ("request", "ValueError: boom", request_payload("https://a.example/", 5)),
        ("seed", "lease expired", "https://b.example/"),
        ("seed", "bad seed", "ftp://c.example/"),
        ("request", "unserializable", "<Request GET https://d.example/>"),
        ("request", "ValueError: boom", request_payload("https://e.example/", -2)),
    ]
    client.rpush(
        keys.dead,
        *[
            json.dumps({"kind": kind, "reason": reason, "data": data, "time": float(i + 1)})
            for i, (kind, reason, data) in enumerate(records)
        ],
    )

    code, out, _ = run("dead", "list", name, "--json", "--redis-url", redis_url)
    assert code == 0
    listed = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in listed] == [0, 1, 2, 3, 4]
    assert listed[1]["data"] == "https://b.example/"
    code, out, _ = run(
        "dead", "list", name, "--kind", "seed", "--limit", "1", "--redis-url", redis_url
    )
    assert "https://b.example/" in out
    assert "c.example" not in out

    code, out, err = run(
        "dead", "requeue", name, "--index", "0", "1", "2", "--redis-url", redis_url
    )
    assert code == 1  # the invalid seed stays
    assert "#2: not requeued: seed is still invalid" in err
    assert "requeued 1 request(s)" in out
    assert "1 seed(s)" in out
    queued = queued_entries(client, keys.requests)
    assert len(queued) == 1
    # in the level of the request's priority, as the priority queue scores it
    assert client.lrange(level_key(keys.requests, "-5"), 0, -1) == queued
    assert json.loads(queued[0][16:])["url"] == "https://a.example/"
    assert client.lrange(keys.start_urls, 0, -1) == [b"https://b.example/"]
    assert [json.loads(r)["time"] for r in client.lrange(keys.dead, 0, -1)] == [3.0, 4.0, 5.0]

    code, out, err = run(
        "dead", "requeue", name, "--all", "--kind", "request", "--redis-url", redis_url
    )
    assert code == 1  # the unserializable record cannot become a request
    assert "#1: not requeued: not a serialized request" in err
    assert queued_count(client, keys.requests) == 2
    assert [json.loads(r)["time"] for r in client.lrange(keys.dead, 0, -1)] == [3.0, 4.0]

    code, _, err = run("dead", "requeue", name, "--index", "9", "--redis-url", redis_url)
    assert code == 2
    assert "no record #9" in err
    code, out, _ = run("dead", "purge", name, "--yes", "--redis-url", redis_url)
    assert code == 0
    assert out.strip() == f"purged 2 record(s) from '{name}:dead'"
    assert not client.exists(keys.dead)


@pytest.mark.e2e
def test_dead_requeue_all_gets_through_while_workers_keep_adding_dead_letters(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """`dead requeue --all` watched the whole list while it planned a batch of 1,000
    records: with workers appending ~100 dead letters a second, every batch was
    invalidated, and it spun at full CPU for ever without requeuing one."""
    keys = RedisKeys.build(name)

    def record(i: int) -> str:
        data = request_payload(f"https://a.example/{i}", 0)
        return json.dumps({"kind": "request", "reason": "boom", "data": data, "time": 1.0})

    client.rpush(keys.dead, *[record(i) for i in range(3000)])
    stop = threading.Event()
    appended = [0]

    def worker_failing_pages() -> None:
        pusher = redis.Redis.from_url(redis_url)
        while not stop.is_set():
            pusher.rpush(keys.dead, record(100_000 + appended[0]))
            appended[0] += 1
            time.sleep(0.004)
        pusher.close()

    thread = threading.Thread(target=worker_failing_pages)
    thread.start()
    try:
        done = run_cli(
            "dead", "requeue", name, "--all", "--redis-url", redis_url, cwd=tmp_path, timeout=120
        )
    finally:
        stop.set()
        thread.join()
    assert done.returncode == 0, done.stderr
    assert appended[0] > 50  # the list did change under it
    # every record present when it started (the 3,000, and those added while the
    # command started up) is requeued once; those added meanwhile are left
    requeued = int(done.stdout.split("requeued ", 1)[1].split(" ", 1)[0])
    assert requeued >= 3000, done.stdout
    assert queued_count(client, keys.requests) == requeued
    assert requeued + client.llen(keys.dead) == 3000 + appended[0]


# -- a running crawl --------------------------------------------------------------------

#: Settings of the crawl below: fast heartbeats, one delivery per request (so the poison
#: page is dead-lettered at once), items and stats in Redis. Leases must outlast the
#: SIGSTOP freeze while `status` runs (several seconds on a loaded machine): with one
#: delivery allowed, a lease that expires is dead-lettered ("lease expired on 1
#: deliveries"), which is what made this test see more than one dead letter.
CRAWL_SETTINGS = {
    "CONCURRENT_REQUESTS": 2,
    "SCHEDULER_LEASE_TIMEOUT": 60,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
    "SCHEDULER_WORKER_TIMEOUT": 10,
    "SCHEDULER_MAX_DELIVERIES": 1,
    # the poison page's request goes to the dead-letter list (Scrapy's way, the
    # default "done", would acknowledge it)
    "SCHEDULER_CALLBACK_ERRORS": "retry",
    "SCHEDULER_PERSIST": True,
    "CLOSE_WHEN_CRAWL_DONE": True,
    "CRAWL_DONE_GRACE": 0.5,
    "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300}),
    "STATS_CLASS": "scrapy_dist.stats.RedisStatsCollector",
    "STATS_FLUSH_INTERVAL": 0.5,
    "REDIS_ITEMS_FLUSH_INTERVAL": 0.2,
}
PAGES = 100
POISON = 5


def reachable_without(pages: int, blocked: int) -> set[str]:
    """Pages fetched when page ``blocked`` is fetched but its links are never followed."""
    seen, todo = {0}, [0]
    while todo:
        page = todo.pop()
        if page == blocked:
            continue
        for j in links(page, pages):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return {f"/page/{i}" for i in seen}


@pytest.fixture
def site() -> Iterator[TestSite]:
    with TestSite(PAGES, delay=0.08) as s:
        yield s


@pytest.fixture
def job_keys(client: redis.Redis, name: str) -> Iterator[RedisKeys]:
    """The keys of a ``pages`` crawl isolated by a job named after the test."""
    yield RedisKeys.build("pages", job=name)
    for key in client.scan_iter(match=f"pages:{name}:*"):
        client.delete(key)


@pytest.mark.e2e
def test_status_is_not_finished_while_a_worker_waits_nor_after_it_took_more_seeds(
    redis_url: str, client: redis.Redis, name: str, job_keys: RedisKeys, tmp_path: Path
) -> None:
    """Two workers without CLOSE_WHEN_CRAWL_DONE crawl a site; one is stopped and, on
    its way out, marks the empty crawl finished. `status` said "finished" while the
    other still waited for seeds, and again once it had crawled the seeds pushed next,
    with the first completion time: a script waiting for "finished" fired early."""
    settings = {
        "REDIS_URL": redis_url,
        "SCHEDULER_JOB_ID": name,
        **CRAWL_SETTINGS,
        "CLOSE_WHEN_CRAWL_DONE": False,
    }
    workers: list[Worker] = []

    def status() -> dict[str, Any]:
        done = cli(
            "status", "pages", "--job", name, "--json", "--redis-url", redis_url, cwd=PROJECT
        )
        assert done.returncode == 0, done.stderr
        return cast("dict[str, Any]", json.loads(done.stdout))

    def push(url: str) -> None:
        pushed = cli("push", "pages", url, "--job", name, "--redis-url", redis_url, cwd=PROJECT)
        assert pushed.returncode == 0, pushed.stderr

    def until(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, (what, [w.log_tail(15) for w in workers])
            time.sleep(0.1)

    with TestSite(30) as first, TestSite(5) as later:
        try:
            workers += start_workers(
                2, project_dir=PROJECT, spider="pages", log_dir=tmp_path, settings=settings,
                stats_setting=None,
            )  # fmt: skip
            wait_ready(workers, 60, marker="joined crawl")
            push(first.page_url(0))
            until(lambda: len(first.hits()) == 30 and status()["state"] == "idle", "first run")

            os.kill(workers[0].pid, signal.SIGINT)
            assert wait_workers(workers[:1], 30) == [0]
            after_one = status()
            assert after_one["progress"]["finished_at"], after_one  # marked on its way out
            assert after_one["state"] == "idle", after_one  # the other still waits
            shown = cli(
                "status", "pages", "--job", name, "--redis-url", redis_url, cwd=PROJECT
            ).stdout
            assert "1 live worker(s) may take more seeds" in shown, shown

            pushed_at = float(client.time()[0])
            push(later.page_url(0))
            until(lambda: len(later.hits()) == 5, "the seeds pushed later")
            until(lambda: status()["leased"] == 0, "their settlements")
            after_more = status()
            assert after_more["state"] == "idle", after_more
            assert not after_more["progress"].get("finished_at"), after_more

            os.kill(workers[1].pid, signal.SIGINT)
            assert wait_workers(workers[1:], 30) == [0]
            final = status()
            assert final["state"] == "finished", final
            assert float(final["progress"]["finished_at"]) >= pushed_at, final
        finally:
            stop_workers(workers)
    assert first.hits() == dict.fromkeys(first.hits(), 1)
    assert later.hits() == dict.fromkeys(later.hits(), 1)


@pytest.mark.e2e
def test_status_dead_requeue_and_export_on_a_running_crawl(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    job_keys: RedisKeys,
    site: TestSite,
    tmp_path: Path,
    run: Any,
) -> None:
    settings = {"REDIS_URL": redis_url, "SCHEDULER_JOB_ID": name, **CRAWL_SETTINGS}
    workers: list[Worker] = []

    def start(count: int, **spider_args: str) -> list[Worker]:
        started = start_workers(
            count,
            project_dir=PROJECT,
            spider="pages",
            log_dir=tmp_path,
            settings=settings,
            spider_args=spider_args,
            stats_setting=None,
            first_index=len(workers),
        )
        workers.extend(started)
        return started

    def logs() -> str:
        return "\n".join(w.log_tail(20) for w in workers)

    try:
        first = start(2, fail_on=f"/page/{POISON}")
        wait_ready(first, 60, marker="joined crawl")  # both in the registry before it starts
        pushed = cli(
            "push", "pages", site.page_url(0), "--job", name, "--redis-url", redis_url, cwd=PROJECT
        )
        assert pushed.returncode == 0, pushed.stderr
        deadline = time.monotonic() + 60
        while sum(site.hits().values()) < 25:
            assert time.monotonic() < deadline, logs()
            time.sleep(0.05)

        # freeze the workers: Redis holds still while status and the test read it
        for w in first:
            os.kill(w.pid, signal.SIGSTOP)
        try:
            done = cli(
                "status", "pages", "--job", name, "--json", "--redis-url", redis_url, cwd=PROJECT
            )
            k = job_keys
            raw_workers = client.hgetall(k.workers)
            truth = {
                "seeds": client.llen(k.start_urls),
                "queued": queued_count(client, k.requests),
                "leased": sum(len(held) for held in holdings(client, k.crawl).values()),
                "dead": client.llen(k.dead),
                # requests acknowledged: the seeds' leases, counted in done too, apart
                "done": int(client.hget(k.progress, "done") or 0)
                - int(client.hget(k.progress, "seeds_done") or 0),
                "dupefilter": client.scard(k.dupefilter),
                "items": client.llen(k.items),
                "stats": json.loads(
                    json.dumps(
                        decode_stats(_bytes_hash(client.hgetall(k.stats))), default=json_default
                    )
                ),
            }
        finally:
            for w in first:
                os.kill(w.pid, signal.SIGCONT)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["crawl"] == f"pages:{name}"
        assert status["state"] == "busy"
        assert status["seeds"]["waiting"] == truth["seeds"]
        assert status["queue"]["queued"] == truth["queued"]
        assert status["leased"] == truth["leased"]
        assert status["queue"]["queued"] + status["leased"] > 0
        assert status["dead"]["records"] == truth["dead"]
        assert status["progress"]["done"] == truth["done"] > 0
        assert status["dupefilter"]["size"] == truth["dupefilter"] > 0
        assert status["dupefilter"]["backend"] == "set"
        assert status["items"]["stored"] == truth["items"]
        assert status["stats"] == truth["stats"]
        assert status["items"]["scraped"] == truth["stats"].get("item_scraped_count")
        beats = {w.decode(): float(b) for w, b in _bytes_hash(raw_workers).items()}
        assert {w["id"]: w["heartbeat"] for w in status["workers"]["list"]} == beats
        assert status["workers"]["live"] == 2 == len(beats)
        assert status["rates"]["pages_per_second"] > 0

        assert wait_workers(first, 60) == [0, 0], logs()
        hits = site.hits()
        assert set(hits) == reachable_without(PAGES, POISON)
        assert set(hits.values()) == {1}
        # two workers' stats add up exactly; every item is stored once
        stats = decode_stats(_bytes_hash(client.hgetall(job_keys.stats)))
        assert stats["response_received_count"] == sum(hits.values())
        items = [json.loads(i)["url"] for i in client.lrange(job_keys.items, 0, -1)]
        assert len(items) == len(set(items)) == stats["item_scraped_count"] == len(hits) - 1

        code, out, _ = run(
            "dead", "list", "pages", "--job", name, "--json", "--redis-url", redis_url
        )
        [record] = [json.loads(line) for line in out.splitlines()]
        assert record["kind"] == "request"
        assert record["index"] == 0
        assert f"ValueError: poison page /page/{POISON}" in record["reason"]

        requeued = cli(
            "dead",
            "requeue",
            "pages",
            "--job",
            name,
            "--all",
            "--redis-url",
            redis_url,
            cwd=PROJECT,
        )
        assert requeued.returncode == 0, requeued.stderr
        assert "requeued 1 request(s)" in requeued.stdout
        assert client.llen(job_keys.dead) == 0

        # a worker without the poison completes the requeued page and what it links to
        assert wait_workers(start(1), 60) == [0], logs()
        hits = site.hits()
        assert set(hits) == site.expected_paths()
        assert hits[f"/page/{POISON}"] == 2
        assert {n for path, n in hits.items() if path != f"/page/{POISON}"} == {1}
        assert client.llen(job_keys.dead) == 0
        stats = decode_stats(_bytes_hash(client.hgetall(job_keys.stats)))
        assert stats["response_received_count"] == sum(hits.values())

        out_file = tmp_path / "items.jl"
        code, _, err = run(
            "export", "pages", "--job", name, "-o", str(out_file), "--redis-url", redis_url
        )
        assert code == 0, err
        exported = [json.loads(line)["url"] for line in out_file.read_text().splitlines()]
        assert sorted(exported) == sorted(site.page_url(int(p.rsplit("/", 1)[1])) for p in hits)
        assert len(exported) == len(set(exported))
    finally:
        stop_workers(workers, timeout=5)


# -- errors an operator meets: one line, the cause named ---------------------------------


def _one_error_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The one ``scrapy-dist: error:`` line of a command that failed with ``code``."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_metrics_on_a_port_out_of_range_is_a_usage_error(
    redis_url: str, name: str, tmp_path: Path, port: str
) -> None:
    """`metrics --port 99999` ended in an OverflowError traceback (exit 1)."""
    done = cli("metrics", name, "--port", port, "--redis-url", redis_url, cwd=tmp_path)
    assert "argument --port" in _one_error_line(done, 2)


def _items(client: redis.Redis, keys: RedisKeys, count: int) -> list[bytes]:
    items = [json.dumps({"n": n, "pad": "x" * 60}).encode() for n in range(count)]
    client.rpush(keys.items, *items)
    return items


def test_export_to_a_full_device_says_so_and_keeps_the_items(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """`export -o /dev/full` ended in an OSError traceback (exit 1)."""
    keys = RedisKeys.build(name)
    items = _items(client, keys, 10)
    done = cli("export", name, "-o", "/dev/full", "--redis-url", redis_url, cwd=tmp_path)
    line = _one_error_line(done, 1)
    assert "writing /dev/full failed after 0 item(s) (No space left on device)" in line
    assert f"nothing was removed from '{keys.items}'" in line
    assert client.lrange(keys.items, 0, -1) == items


def _export_limited(*args: str, cwd: Path, file_size: int) -> subprocess.CompletedProcess[str]:
    """``scrapy-dist ARGS`` in a process that may write files of ``file_size`` bytes at
    most (``RLIMIT_FSIZE``: a write beyond fails with ``EFBIG``, as on a full disk)."""
    import resource

    import scrapy_dist

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    env = {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}
    package = str(Path(scrapy_dist.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "scrapy_dist", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limit,
    )


def test_export_delete_that_fails_mid_way_loses_nothing(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """A write that fails part-way through `export --delete` (the disk full) gave an
    OSError traceback; only the items written whole (and synced) may leave Redis, the
    file must hold exactly them, and exporting again with --append finishes the job."""
    keys = RedisKeys.build(name)
    items = _items(client, keys, 2500)  # 3 chunks of at most 1,000
    out_file = tmp_path / "items.jl"
    args = ("export", name, "-o", str(out_file), "--delete", "--redis-url", redis_url)
    limit = sum(len(i) + 1 for i in items[:1000]) + 5000  # the second chunk fails part-way
    done = _export_limited(*args, cwd=tmp_path, file_size=limit)
    line = _one_error_line(done, 1)
    assert f"writing {out_file} failed after 1000 item(s) (File too large)" in line
    assert f"the 1000 written were removed from '{keys.items}', the other 1500" in line
    assert "partial line" not in line
    assert out_file.read_bytes() == b"".join(i + b"\n" for i in items[:1000])
    assert client.lrange(keys.items, 0, -1) == items[1000:]

    again = cli(*args, "--append", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert out_file.read_bytes() == b"".join(i + b"\n" for i in items)
    assert not client.exists(keys.items)


def test_two_exports_delete_of_one_crawl_at_once_lose_nothing(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """Two `export --delete` of one crawl at once (two cron runs): both read the same chunk,
    both trimmed one, and a chunk neither wrote left Redis (11,000 of 30,000 items lost,
    12,000 written to both files)."""
    keys = RedisKeys.build(name)
    items = _items(client, keys, 100_000)  # (time for both to start while items remain)
    env = {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}
    runs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "scrapy_dist", "export", name, "--delete"),
                *("-o", str(tmp_path / f"{n}.jl"), "--redis-url", redis_url),
            ],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for n in ("a", "b")
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode in (0, 1), stderr
    files = [tmp_path / f"{n}.jl" for n in ("a", "b")]  # (none if Redis was empty by then)
    lines = [line for file in files if file.exists() for line in file.read_bytes().splitlines()]
    left = client.lrange(keys.items, 0, -1)
    assert sorted(lines + left) == sorted(items)  # each item once: in a file or in Redis


def test_export_to_a_closed_pipe_says_so(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """`export -o -` whose reader went away exited 0 as if every item was written."""
    keys = RedisKeys.build(name)
    items = _items(client, keys, 3000)
    command = [sys.executable, "-m", "scrapy_dist", "export", name, "-o", "-"]
    env = {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        done = subprocess.run(
            [*command, "--redis-url", redis_url],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "writing stdout failed after 0 item(s) (Broken pipe)" in lines[0]
    assert f"nothing was removed from '{keys.items}'" in lines[0]
    assert client.lrange(keys.items, 0, -1) == items


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ('REDIS_PARAMS={"socket_timeout": "abc"}', "REDIS_PARAMS['socket_timeout'] = 'abc'"),
        ('REDIS_PARAMS={"socket_connect_timeout": "5"}', "REDIS_PARAMS['socket_connect_timeout']"),
        ('REDIS_PARAMS={"health_check_interval": "30"}', "REDIS_PARAMS['health_check_interval']"),
        ('REDIS_PARAMS={"client_name": "my crawler"}', "REDIS_PARAMS['client_name']"),
        (
            'REDIS_PARAMS={"socket_keepalive_options": 5}',
            "REDIS_PARAMS['socket_keepalive_options']",
        ),
        ('REDIS_PARAMS={"retry_on_error": 5}', "REDIS_PARAMS['retry_on_error']"),
        ('REDIS_PARAMS={"encoding_errors": "loose"}', "REDIS_PARAMS['encoding_errors']"),
        ('REDIS_PARAMS={"db": "first"}', "REDIS_PARAMS['db'] = 'first'"),
    ],
)
def test_a_redis_params_value_redis_py_refuses_is_named(
    redis_url: str, name: str, tmp_path: Path, setting: str, named: str
) -> None:
    """Values redis-py takes but fails on when it connects gave a TypeError traceback."""
    done = cli("status", name, "--redis-url", redis_url, "-s", setting, cwd=tmp_path)
    assert named in _one_error_line(done, 2)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (['REDIS_PARAMS={"host": "127.0.0.1", "port": "x"}'], "REDIS_PARAMS['port'] = 'x'"),
        (["REDIS_HOST=127.0.0.1", "REDIS_PORT=abc"], "REDIS_PORT = 'abc'"),
        (["REDIS_HOST=127.0.0.1", "REDIS_PORT=70000"], "REDIS_PORT = '70000' is not a TCP port"),
        (["REDIS_DB=first"], "REDIS_DB = 'first'"),
    ],
)
def test_a_port_or_database_that_is_no_number_is_named(
    name: str, tmp_path: Path, settings: list[str], named: str
) -> None:
    """A port or database that is no number gave a ValueError traceback."""
    options = [arg for setting in settings for arg in ("-s", setting)]
    done = cli("status", name, *options, cwd=tmp_path)
    assert named in _one_error_line(done, 2)


def test_redis_params_values_users_pass_keep_working(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """What redis-py converts itself (a port or database as text), None, an empty list of
    errors, and keys scrapy_dist does not know, as scrapy-redis passed them."""
    port = str(client.connection_pool.connection_kwargs["port"])
    params: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "db": "0",
        "socket_timeout": None,
        "socket_connect_timeout": 2.5,
        "health_check_interval": 0,
        "retry_on_error": [],
        "client_name": "crawler-1",
        "socket_keepalive": True,
        "encoding": "utf-8",
    }
    client.rpush(RedisKeys.build(name).dead, "{}")
    done = cli("status", name, "-s", f"REDIS_PARAMS={json.dumps(params)}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"crawl {name}  at redis://127.0.0.1:{port}/0" in done.stdout


@pytest.mark.parametrize(
    "params",
    [{"port": None, "password": None}, {"host": "", "port": ""}],
)
def test_redis_params_a_redis_url_overrides_are_not_checked(
    redis_url: str, name: str, tmp_path: Path, params: dict[str, Any]
) -> None:
    """`REDIS_PARAMS = {"port": os.getenv("REDIS_PORT")}` next to a REDIS_URL: the port is
    ignored with a warning, as before REDIS_PARAMS values were checked (it exited 2)."""
    setting = f"REDIS_PARAMS={json.dumps(params)}"
    done = cli("status", name, "--redis-url", redis_url, "-s", setting, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "REDIS_PARAMS['port'] (REDIS_URL_PRECEDENCE" in done.stderr


def test_a_database_the_server_does_not_have_is_named(
    redis_url: str, name: str, tmp_path: Path
) -> None:
    """`REDIS_URL = redis://host:port/99` on a server of 16 databases said "cannot reach
    Redis", sending the operator after a server that was running."""
    url = redis_url.rpartition("/")[0] + "/99"
    done = cli("status", name, "--redis-url", url, cwd=tmp_path)
    line = _one_error_line(done, 1)
    assert f"Redis at {url} refused database 99 (DB index is out of range)" in line
    assert "cannot reach" not in line


@pytest.mark.e2e
def test_status_watch_shows_a_key_that_turned_unreadable_and_goes_on(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """`status SPIDER --watch` ended (exit 2) when a key of the crawl was overwritten with
    another type mid-watch; it shows the error and goes on, as `status` shows such a
    crawl among the others."""
    keys = RedisKeys.build(name)
    client.rpush(keys.dead, "{}")
    command = [sys.executable, "-m", "scrapy_dist", "status", name, "--watch"]
    command += ["--interval", "0.2", "--redis-url", redis_url]
    env = {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}
    with _interruptible_children():
        watch = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
    assert watch.stdout is not None
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(watch.stdout or ()), daemon=True)
    reader.start()

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 30
        while not any(text in line for line in list(seen)):
            assert watch.poll() is None, f"--watch ended ({watch.returncode}): {seen[-5:]}"
            assert time.monotonic() < deadline, f"no {text!r} in {seen[-5:]}"
            time.sleep(0.05)

    try:
        wait_for("dead               1")
        client.delete(keys.dead)
        client.set(keys.dead, "junk")
        wait_for(f"crawl {name}  [error]")
        wait_for(f"Redis key '{keys.dead}' (dead letters) holds a string")
        client.delete(keys.dead)
        client.rpush(keys.dead, "{}", "{}")
        wait_for("dead               2")
    finally:
        watch.send_signal(signal.SIGINT)
        _, stderr = watch.communicate(timeout=30)
    assert watch.returncode == 0, stderr


def test_reset_deletes_the_crawls_holdings_not_the_keys_of_a_job_named_holders(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """`reset SPIDER` took the keys of job `holders` (crawl `<spider>:holders`, queue
    `<spider>:holders:requests`) for workers' holdings (`<spider>:holders:<worker>`)
    and deleted them."""
    plain = RedisKeys.build(name)
    job = fill_crawl(client, RedisKeys.build(name, job="holders"))
    mine = [plain.requests, plain.dead, plain.holders]
    client.rpush(plain.requests, "x")
    client.rpush(plain.dead, "{}")
    client.zadd(plain.holders, {"host:1:aaaaaa": 1})
    mine += [plain.holding("host:1:aaaaaa"), plain.holding("host:2:bbbbbb")]
    client.hset(plain.holding("host:1:aaaaaa"), "1", "x")
    client.hset(plain.holding("host:2:bbbbbb"), "2", "x")  # its zset entry gone
    mine.append(plain.holding("host:3:cccccc") + ":wrongtype")
    client.set(plain.holding("host:3:cccccc") + ":wrongtype", "x")

    done = cli("reset", name, "--yes", "--redis-url", redis_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted {len(mine)} key(s) of crawl '{name}'"
    remaining = {k.decode() for k in client.scan_iter(match=f"{name}*")}
    assert remaining == set(job)

    done = cli("reset", name, "--job", "holders", "--yes", "--redis-url", redis_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted {len(job)} key(s) of crawl '{name}:holders'"
    assert not list(client.scan_iter(match=f"{name}*"))


def test_jobs_lists_the_jobs_sharing_a_literal_redis_key_not_a_crawl_of_its_name(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """With `redis_key = "<spider>:start_urls"` read by every job, `jobs` listed a crawl
    `<spider>` (no job) holding the jobs' seeds, and each job with 0 seeds."""
    project = _project_with_literal_redis_key(tmp_path, name, redis_url)
    pushed = cli("push", name, "--job", "j1", "http://a.example/", "http://b.example/", cwd=project)
    assert pushed.returncode == 0, pushed.stderr
    client.rpush(RedisKeys.build(name, job="j1").dead, "{}")
    client.hset(RedisKeys.build(name, job="j2").progress, "done", 3)

    listed = cli("jobs", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    rows = {row["crawl"]: row for row in json.loads(listed.stdout) if row["spider"] == name}
    assert set(rows) == {f"{name}:j1", f"{name}:j2"}
    assert {row["seeds"] for row in rows.values()} == {2}
    shown = cli("status", "--json", cwd=project)
    assert shown.returncode == 0, shown.stderr
    crawls = {c["crawl"]: c for c in json.loads(shown.stdout)["crawls"]}
    assert {c for c in crawls if c.partition(":")[0] == name} == set(rows)
    assert crawls[f"{name}:j1"]["seeds"]["key"] == f"{name}:start_urls"

    # without a job in Redis, the crawl without one reads the key: it is listed
    client.delete(RedisKeys.build(name, job="j1").dead, RedisKeys.build(name, job="j2").progress)
    listed = cli("jobs", "--json", cwd=project)
    rows = {row["crawl"]: row for row in json.loads(listed.stdout) if row["spider"] == name}
    assert set(rows) == {name}
    assert rows[name]["seeds"] == 2


def test_status_and_metrics_show_the_paused_slots(
    redis_url: str, client: redis.Redis, name: str, run: Any
) -> None:
    """A pause a worker wrote (``lua/slot_pauses.lua``) is in status, its JSON and the
    metrics; one that ended is not; a key of another type reads as none."""
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.scripts import scripts_for

    key = RedisKeys.build(name).slot_pauses
    scripts_for(client).slot_pauses(
        pauses=key, longest_ms=300_000, add=[("busy.example", 30_000)]
    ).run()
    client.zadd(key, {"over.example": 1})
    code, out, _ = run("status", name, "--json", "--redis-url", redis_url)
    assert code == 0
    paused = json.loads(out)["paused_slots"]
    assert list(paused) == ["busy.example"]
    assert 25 < paused["busy.example"] <= 30
    code, out, _ = run("status", name, "--redis-url", redis_url)
    assert re.search(r"paused slots: busy\.example \((30|29)s left\)", out), out
    code, out, _ = run("metrics", name, "--once", "--redis-url", redis_url)
    assert f'scrapy_dist_slots_paused{{crawl="{name}"}} 1' in out, out
    client.delete(key)
    client.set(key, "junk")
    code, out, err = run("status", name, "--json", "--redis-url", redis_url)
    assert code == 0, err
    assert json.loads(out)["paused_slots"] == {}


def test_reset_deletes_every_key_of_a_queue_per_slot(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """A crawl on SlotQueue: its slots' levels (`<requests>:slot:<slot>:...`), its
    indexes and one set aside go with `reset`, whatever the settings of the command."""
    from scrapy import Request

    from scrapy_dist.slot_queue import SlotQueue

    keys = RedisKeys.build(name)
    queue = SlotQueue(client, keys.requests, keys.seq)
    for url in ("https://a.com/1", "https://b.com/1", "https://b.com/2"):
        request = Request(url, priority=len(url) % 3)
        queue.push([(url.encode(), queue.score(request), b"")])
    client.hset(keys.requests + ":delays", "a.com", 3)
    client.set(keys.requests + ":resting:wrongtype", "x")
    assert len(list(client.scan_iter(match=f"{keys.requests}:slot:*"))) >= 4
    done = cli("reset", name, "--yes", "--redis-url", redis_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not list(client.scan_iter(match=f"{name}*"))
