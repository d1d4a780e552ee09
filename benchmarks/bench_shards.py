"""Redis CPU per master of one crawl on a local 3-master Cluster (each master with a
replica), with ``SCHEDULER_SHARDS = 1`` (one hash tag: one master does the crawl's work)
and with ``SCHEDULER_SHARDS = 3`` (three tags, one per master), as ratios (issue 14).

Usage::

    python benchmarks/bench_shards.py                  # 3,000 pages, 2 workers, 1 then 3
    python benchmarks/bench_shards.py --pages 6000 --workers 3

Each run starts ``--workers`` ``scrapy crawl pages`` workers of the example project (the
settings name the cluster's nodes) over a local test site whose pages link across
``--hosts`` names of 127.0.0.1 (placement is by host), seeds page 0, and waits for the
workers to finish. Around the crawl, every master's ``INFO cpu``
(``used_cpu_sys + used_cpu_user``) and ``INFO commandstats`` (microseconds spent in
commands) are read: the deltas are the crawl's cost on each master, the server's
background work (``hz``, replication) included on both sides. Prints a table and writes
``benchmarks/results/shards-<timestamp>.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from scrapy_dist.frontier.shards import shard_of
from scrapy_dist.testing import ClusterServers, TestSite
from scrapy_dist.testing.topology import make_project, run_crawl

RESULTS = Path(__file__).parent / "results"

#: Spellings of 127.0.0.1 that the resolver accepts, for a site "on many hosts".
_SPELLINGS = [
    "127.0.0.1",
    "127.0.1",
    "0x7f000001",
    "127.1",
    "2130706433",
    "127.0.0.01",
    "127.00.0.1",
    "127.0.00.1",
    "0177.0.0.1",
    "127.0.0.001",
    "0x7f.0.0.1",
    "127.0.0x0.1",
]


def hosts(count: int) -> list[str]:
    """``count`` names of 127.0.0.1 (the first is the site's own)."""
    names = []
    for name in _SPELLINGS:
        try:
            if socket.gethostbyname(name) == "127.0.0.1":
                names.append(name)
        except OSError:
            continue
    return names[:count]


def master_clients(cluster: ClusterServers) -> dict[int, redis.Redis]:
    return {node.port: redis.Redis(host="127.0.0.1", port=node.port) for node in cluster.masters()}


def sample(clients: dict[int, redis.Redis]) -> dict[int, tuple[float, float, int]]:
    """Per master port: (CPU seconds, seconds in commands, commands)."""
    out = {}
    for port, client in clients.items():
        cpu = client.info("cpu")
        stats = client.info("commandstats")
        usec = sum(float(v["usec"]) for v in stats.values())
        calls = sum(int(v["calls"]) for v in stats.values())
        out[port] = (float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), usec / 1e6, calls)
    return out


def crawl(
    cluster: ClusterServers, site: TestSite, project: Path, *, shards: int, workers: int, logs: Path
) -> dict[str, Any]:
    job = uuid.uuid4().hex[:8]
    seeds = f"{{pages:{job}}}:start_urls"
    clients = master_clients(cluster)

    def seed(url: str) -> None:
        with cluster.client() as client:
            client.lpush(seeds, url)

    before = sample(clients)
    started = time.monotonic()
    result = run_crawl(
        project,
        site,
        logs,
        seed,
        workers=workers,
        settings={"SCHEDULER_SHARDS": shards, "SCHEDULER_JOB_ID": job},
    )
    wall = time.monotonic() - started
    after = sample(clients)
    per_master = {
        str(port): {
            "cpu_seconds": round(after[port][0] - before[port][0], 3),
            "command_seconds": round(after[port][1] - before[port][1], 3),
            "commands": after[port][2] - before[port][2],
        }
        for port in clients
    }
    return {
        "shards": shards,
        "pages": len(result.hits),
        "lost": len(result.missing),
        "duplicates": result.duplicates,
        "statuses": result.statuses,
        "wall_seconds": round(wall, 2),
        "masters": per_master,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args(argv)
    names = hosts(args.hosts)
    print(f"site hosts: {names} -> shards of 3: {[shard_of(h, 3) for h in names]}")
    runs = []
    with (
        ClusterServers() as cluster,
        TestSite(args.pages) as site,
        tempfile.TemporaryDirectory() as tmp,
    ):
        site.hosts = names
        nodes = [f"127.0.0.1:{port}" for _, port in cluster.startup_nodes]
        project = make_project(Path(tmp), f"REDIS_STARTUP_NODES = {nodes!r}")
        for shards in (1, 3):
            logs = Path(tmp) / f"logs-{shards}"
            logs.mkdir()
            runs.append(
                crawl(cluster, site, project, shards=shards, workers=args.workers, logs=logs)
            )
    one, three = runs
    busiest_one = max(m["cpu_seconds"] for m in one["masters"].values())
    busiest_one_cmd = max(m["command_seconds"] for m in one["masters"].values())
    print(f"{'':<10}{'master':>8}{'CPU s':>9}{'cmd s':>9}{'commands':>10}{'CPU/1-slot':>12}")
    for run in runs:
        for port, m in sorted(run["masters"].items()):
            ratio = m["cpu_seconds"] / busiest_one if busiest_one else 0.0
            print(
                f"shards={run['shards']:<3}{port:>8}{m['cpu_seconds']:>9.2f}"
                f"{m['command_seconds']:>9.2f}{m['commands']:>10}{ratio:>12.2f}"
            )
        print(
            f"  {run['pages']} pages, {run['lost']} lost, {run['duplicates']} duplicates, "
            f"{run['wall_seconds']} s"
        )
    three_max = max(m["cpu_seconds"] for m in three["masters"].values())
    three_cmd_max = max(m["command_seconds"] for m in three["masters"].values())
    summary = {
        "busiest_master_cpu_ratio": round(three_max / busiest_one, 3) if busiest_one else None,
        "busiest_master_command_time_ratio": round(three_cmd_max / busiest_one_cmd, 3)
        if busiest_one_cmd
        else None,
    }
    print("busiest master, shards=3 / shards=1:", summary)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"shards-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "runs": runs, "summary": summary}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
