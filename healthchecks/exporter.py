"""One exporter: the background readers (log, processes, /server_info, the state file) and the
collectors that turn their state into metrics at scrape time.

Each collector is rendered on its own: one that raises (a value it cannot turn into a sample)
loses its own series for that scrape, is counted in `dsa_exporter_errors_total{source}` and
said in the exporter's log; every other series is still served."""
from __future__ import annotations

from dataclasses import dataclass, field

from dsaops.healthchecks.containers import ContainerCollector, Containers
from dsaops.healthchecks.decode_kernel import DecodeKernelCollector
from dsaops.healthchecks.hostmem import HostMemoryCollector
from dsaops.healthchecks.logfollow import LogCollector, LogFollower
from dsaops.healthchecks.logparse import LogState
from dsaops.healthchecks.metrics import ErrorCounts, Families
from dsaops.healthchecks.oom import KernelOomRecords
from dsaops.healthchecks.processes import ProcessWatcher, WorkerCollector
from dsaops.healthchecks.server_info import NO_PLAN, PlanFigures, ServerInfoCollector, ServerInfoPoller
from dsaops.healthchecks.state import StateKeeper
from prometheus_client import CollectorRegistry, generate_latest


@dataclass
class Config:
    server_url: str
    node: str
    api_key: str | None = None       # for /server_info; /health is open
    log_file: str | None = None
    interval: float = 5.0            # /server_info poll
    process_interval: float = 1.0    # scheduler process poll
    stop_window: float = 20.0        # how long ranks of one server may take to stop one after another
    plan: PlanFigures = NO_PLAN      # dsaops plan --json's pool size and binding limit
    containers: list[str] = field(default_factory=list)
    docker_url: str | None = None
    state_file: str | None = None
    kmsg: str | None = "/dev/kmsg"   # None: do not read the kernel log
    proc: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"


class Exporter:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.errors = ErrorCounts()
        self.families = Families(cfg.node)
        self.log = LogState() if cfg.log_file else None
        self.follower = LogFollower(cfg.log_file, self.log, self.errors) if cfg.log_file else None
        self.kmsg = KernelOomRecords(self.errors, cfg.kmsg) if cfg.kmsg else None
        self.containers = Containers(cfg.containers, self.errors, cfg.docker_url) if cfg.containers else None
        self.watcher = ProcessWatcher(self.errors, self.log, self.kmsg, interval=cfg.process_interval,
                                      stop_window=cfg.stop_window, cgroup_root=cfg.cgroup_root,
                                      proc_root=cfg.proc, containers=self.containers,
                                      log_caught_up=self.follower.caught_up if self.follower else None)
        self.poller = ServerInfoPoller(cfg.server_url, self.errors, interval=cfg.interval, api_key=cfg.api_key)
        self.keeper = None
        if cfg.state_file:
            parts = ({"processes": self.watcher} | ({"log": self.log} if self.log is not None else {})
                     | ({"containers": self.containers} if self.containers is not None else {}))
            self.keeper = StateKeeper(cfg.state_file, self.errors, parts)
            self.watcher.on_death = self.keeper.save

    def loops(self) -> list:
        return [part for part in (self.follower, self.watcher, self.poller, self.keeper) if part]

    def start(self) -> Exporter:
        if self.keeper and self.keeper.restore() and self.follower:
            self.follower.resume(self.log.position)
        for loop in self.loops():
            loop.start()
        return self

    def stop(self) -> None:
        for loop in self.loops():
            loop.stop()
        if self.keeper:
            self.keeper.save()
        if self.kmsg:
            self.kmsg.close()

    def collectors(self) -> list[tuple[str, object]]:
        """(error source, collector), the errors' own collector last so it counts this scrape's."""
        f = self.families
        out = [("server_info", ServerInfoCollector(self.poller, self.log, f, self.cfg.plan)),
               ("processes", WorkerCollector(self.watcher, f)),
               ("hostmem", HostMemoryCollector(self.errors, f, self.cfg.proc))]
        if self.log is not None:
            out += [("log", LogCollector(self.log, f, self.follower)), ("log", DecodeKernelCollector(self.log, f))]
        if self.containers is not None:
            out.append(("docker", ContainerCollector(self.containers, f)))
        return [*out, ("exporter", self.errors.collector(f))]

    def scrape(self) -> bytes:
        for loop in self.loops():
            loop.revive()
        parts = []
        for source, collector in self.collectors():
            registry = CollectorRegistry(auto_describe=False)
            registry.register(collector)
            try:
                parts.append(generate_latest(registry))
            except Exception as e:  # noqa: BLE001 (this collector's series are lost for this scrape, no more)
                self.errors.report(source, "its series were left out of this scrape", e)
        return b"".join(parts)
