"""One exporter: the background readers (log, processes, /server_info) and the collectors
that turn their state into metrics at scrape time, on a fresh registry per scrape."""
from __future__ import annotations

from dataclasses import dataclass, field

from dsaops.healthchecks.containers import ContainerCollector, Containers
from dsaops.healthchecks.hostmem import HostMemoryCollector
from dsaops.healthchecks.logfollow import LogCollector, LogFollower
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.oom import KernelOomRecords
from dsaops.healthchecks.processes import ProcessWatcher, WorkerCollector
from dsaops.healthchecks.server_info import ServerInfoCollector, ServerInfoPoller
from prometheus_client import CollectorRegistry, generate_latest


@dataclass
class Config:
    server_url: str
    node: str
    log_file: str | None = None
    interval: float = 5.0            # /server_info poll
    process_interval: float = 1.0    # scheduler process poll
    planned_tokens: int | None = None
    containers: list[str] = field(default_factory=list)
    docker_url: str | None = None
    kmsg: str = "/dev/kmsg"
    proc: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"


class Exporter:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.errors = ErrorCounts()
        self.families = Families(cfg.node)
        self.log = LogState() if cfg.log_file else None
        self.follower = LogFollower(cfg.log_file, self.log, self.errors) if cfg.log_file else None
        self.kmsg = KernelOomRecords(self.errors, cfg.kmsg)
        self.containers = Containers(cfg.containers, self.errors, cfg.docker_url) if cfg.containers else None
        self.watcher = ProcessWatcher(self.errors, self.log, self.kmsg, interval=cfg.process_interval,
                                      cgroup_root=cfg.cgroup_root, containers=self.containers)
        self.poller = ServerInfoPoller(cfg.server_url, self.errors, interval=cfg.interval)

    def start(self) -> Exporter:
        if self.follower:
            self.follower.start()
        self.watcher.start()
        self.poller.start()
        return self

    def stop(self) -> None:
        for part in (self.follower, self.watcher, self.poller):
            if part:
                part.stop()
        self.kmsg.close()

    def collectors(self) -> list:
        f = self.families
        out = [ServerInfoCollector(self.poller, self.log, f, self.cfg.planned_tokens),
               WorkerCollector(self.watcher, f),
               HostMemoryCollector(self.errors, f, self.cfg.proc),
               self.errors.collector(f)]
        if self.log is not None:
            out.append(LogCollector(self.log, f))
        if self.containers is not None:
            out.append(ContainerCollector(self.containers, f))
        return out

    def scrape(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        for collector in self.collectors():
            registry.register(collector)
        return generate_latest(registry)
