"""Two ways to load one HTTP route: ``wrk`` at saturation, and an open-loop client at a paced rate.

Saturation is measured with ``wrk`` (C, epoll), not with Python: a Python load generator on the same
two cores spends more CPU per request than the service does and measures itself. A paced rate (the
way CI pipelines poll: a few requests a second each) is measured by a small asyncio client that
sends each request at its scheduled time whether or not earlier ones have answered (open loop), so a
slow answer does not hide the requests that should have queued behind it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def ensure_wrk() -> str:
    """The ``wrk`` binary; installed from Debian's package when missing and this process is root."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("load: installing wrk (apt-get install wrk) ...", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, capture_output=True).returncode:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, capture_output=True, check=True)
        found = shutil.which("wrk")
    if not found:
        raise RuntimeError("wrk is not installed; install it (Debian: apt-get install wrk) to measure saturation")
    return found


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return round(float(match.group(1)) * _UNITS[match.group(2)], 2)


@dataclass(frozen=True)
class WrkRun:
    """One ``wrk`` run: throughput, latency percentiles and every kind of error it counted."""

    path: str
    per_s: float
    requests: int
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int
    load_average: float
    #: CPU time the server (and the database server, for PostgreSQL) spent per request: unlike
    #: throughput, hardly moved by other work on the machine.
    cpu_us_per_request: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def parse_wrk(output: str, *, path: str, load_average: float) -> WrkRun:
    """Read ``wrk --latency`` output."""
    per_s = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", output, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", output, re.M).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return WrkRun(path=path, per_s=round(per_s, 1), requests=requests, p50_ms=p50, p99_ms=p99,
                  non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
                  socket_errors=sum(int(g) for g in socket.groups()) if socket else 0,
                  load_average=load_average)


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of the processes ``pids`` so far (those that have exited count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def postgres_pids(database_url: str) -> list[int]:
    """The PostgreSQL backends of the connections named by the URL's ``application_name``."""
    from sqlalchemy import create_engine, make_url, text

    url = make_url(database_url)
    name = url.query.get("application_name")
    admin = create_engine(url.difference_update_query(["options", "application_name"]))
    try:
        with admin.connect() as connection:
            rows = connection.execute(text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
                                      {"name": name}).scalars()
            return [int(pid) for pid in rows]
    finally:
        admin.dispose()


def run_wrk(url: str, path: str, *, key: str | None, threads: int = 2, connections: int = 50,
            duration_s: float = 10.0, cpu_of: list[int] | None = None) -> WrkRun:
    """``wrk -t2 -c50 -d10s --latency`` against ``url + path`` (with the API key as a Bearer header).

    ``cpu_of``: processes whose CPU time per request to report (the server's, the database's).
    """
    args = [ensure_wrk(), f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration_s))}s", "--latency",
            "--timeout", "10s"]
    if key:
        args += ["-H", f"Authorization: Bearer {key}"]
    before = cpu_seconds(cpu_of or [])
    out = subprocess.run([*args, url + path], capture_output=True, text=True, timeout=duration_s + 60, check=True)
    run = parse_wrk(out.stdout, path=path, load_average=round(os.getloadavg()[0], 2))
    if cpu_of and run.requests:
        spent = cpu_seconds(cpu_of) - before
        run = WrkRun(**{**run.__dict__, "cpu_us_per_request": round(spent / run.requests * 1e6, 1)})
    return run


def paced(url: str, path: str, *, key: str | None, rate: float, duration_s: float) -> dict[str, Any]:
    """Send ``rate`` GETs a second for ``duration_s`` seconds, open loop; latency of each answer."""
    return asyncio.run(_paced(url, path, key=key, rate=rate, duration_s=duration_s))


async def _paced(url: str, path: str, *, key: str | None, rate: float, duration_s: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    latencies: list[float] = []
    statuses: list[int] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as client:
        await client.get(path)  # one warm connection, outside the figures

        async def one() -> None:
            start = time.perf_counter()
            try:
                response = await client.get(path)
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            latencies.append(time.perf_counter() - start)
            statuses.append(response.status_code)

        count = max(1, round(rate * duration_s))
        begin = time.perf_counter()
        tasks = []
        for i in range(count):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    lat = np.array(latencies) * 1000
    return {
        "path": path, "rate_per_s": rate, "requests": count,
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
        "max_ms": round(float(lat.max()), 2) if lat.size else None,
        "non_2xx": sum(not 200 <= s < 300 for s in statuses),
        "transport_errors": len(errors),
        "load_average": round(os.getloadavg()[0], 2),
    }
