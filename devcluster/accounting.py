"""What the benches count, from outside the processes they measure: a process's CPU time
and RSS (/proc), and the apiserver's own counters (its /metrics, read with the admin client
certificate): requests by verb and resource, watch events and their bytes by kind.

A bench reads these just before and just after the stretch it measures (`start()`, `stop()`),
so what it reports is that stretch's, whatever ran before it on the same control plane.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping, Sequence

from toolkit import clusterconfig


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0.0 once it is gone)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pids: int | Sequence[int]) -> int:
    """The RSS of a process, or of several summed (a pod's container); one gone counts 0."""
    total = 0
    for pid in [pids] if isinstance(pids, int) else pids:
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def _total(pids: int | Sequence[int]) -> float:
    return sum(cpu_seconds(pid) for pid in ([pids] if isinstance(pids, int) else pids))


class Cpu:
    """CPU seconds each named process (or each named set of processes, summed: a Deployment's
    pods) used between `start()` and `stop()`."""

    def __init__(self, pids: Mapping[str, int | Sequence[int]]) -> None:
        self.pids = pids
        self.used: dict[str, float] = {}

    def start(self) -> None:
        self.begin = {name: _total(pids) for name, pids in self.pids.items()}

    def stop(self) -> None:
        self.used = {name: _total(pids) - self.begin[name] for name, pids in self.pids.items()}

    def per_run_ms(self, runs: int) -> dict[str, float]:
        return {name: round(seconds * 1000 / runs, 2) for name, seconds in self.used.items()}


Counters = dict[tuple[str, ...], float]
METRIC_LINE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(text: str) -> dict[str, Counters]:
    """The apiserver's counters this bench reads, summed over the labels it does not show:
    `requests` by (verb, resource[/subresource]), `watch_events` and `watch_bytes` by kind."""
    out: dict[str, Counters] = {"requests": {}, "watch_events": {}, "watch_bytes": {}}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m is None:
            continue
        name, raw_labels, value = m.groups()
        labels = dict(LABEL.findall(raw_labels))
        if name == "apiserver_request_total":
            resource = labels.get("resource") or labels.get("component", "") + " (non-resource)"
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key: tuple[str, ...] = (labels.get("verb", ""), resource)
            table = "requests"
        elif name in ("apiserver_watch_events_total", "apiserver_watch_events_sizes_sum"):
            key = (labels.get("kind") or labels.get("resource") or "",)
            table = "watch_events" if name == "apiserver_watch_events_total" else "watch_bytes"
        else:
            continue
        out[table][key] = out[table].get(key, 0.0) + float(value)
    return out


class ApiMetrics:
    """The apiserver's counters between `start()` and `stop()` (read from its /metrics)."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.used: dict[str, Counters] = {}

    def read(self) -> dict[str, Counters]:
        client = clusterconfig.load(kubeconfig=self.kubeconfig, pool_size=1, retries=2)
        try:
            return scrape(client.raw("GET", "/metrics").decode())
        finally:
            client.close()

    def start(self) -> None:
        self.begin = self.read()

    def stop(self) -> None:
        end = self.read()
        self.used = {table: {k: v - self.begin[table].get(k, 0.0) for k, v in counters.items()
                             if v - self.begin[table].get(k, 0.0) > 0}
                     for table, counters in end.items()}

    def per_run(self, runs: int) -> dict[str, dict[str, float]]:
        """{table: {"verb resource" or kind: per run}}, JSON-ready."""
        return {table: {" ".join(k): round(v / runs, 3) for k, v in counters.items()}
                for table, counters in self.used.items()}
