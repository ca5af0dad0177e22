"""Containers as a source: the Docker Engine's word on the containers SGLang runs in.

Where the playbooks run SGLang in a container, a dead server may be restarted by Docker
over and over; the restart count, the last exit code and `OOMKilled` tell what the
processes alone cannot (the exporter inside the container dies with it). Read at scrape
time through the `docker` SDK; an engine that does not answer is a `docker` error.
"""
from __future__ import annotations

from dsaops.healthchecks.metrics import ErrorCounts, Families


class ContainerCollector:
    def __init__(self, names: list[str], errors: ErrorCounts, families: Families, base_url: str | None = None,
                 timeout: float = 2.0):
        self.names, self.errors, self.f = names, errors, families
        self.base_url, self.timeout = base_url, timeout
        self._client = None

    def _docker(self):
        import docker

        if self._client is None:
            self._client = (docker.DockerClient(base_url=self.base_url, timeout=self.timeout) if self.base_url
                            else docker.from_env(timeout=self.timeout))
        return self._client

    def collect(self):
        import docker.errors
        import requests.exceptions

        f = self.f
        running = f.gauge("dsa_container_running", "1 while the container runs", ("container",))
        restarts = f.counter("dsa_container_restarts_total", "Restarts Docker made of the container (RestartCount)",
                             ("container",))
        code = f.gauge("dsa_container_exit_code", "The container's last exit code", ("container",))
        oom = f.gauge("dsa_container_oom_killed", "1 when the kernel OOM killer ended the container's last run",
                      ("container",))
        for name in self.names:
            try:
                attrs = self._docker().api.inspect_container(name)
                state = attrs["State"]
                running.add(1 if state["Running"] else 0, name)
                restarts.add(int(attrs["RestartCount"]), name)
                code.add(int(state["ExitCode"]), name)
                oom.add(1 if state["OOMKilled"] else 0, name)
            except (docker.errors.DockerException, requests.exceptions.RequestException, KeyError, TypeError, ValueError):
                self.errors.inc("docker")
                self._client = None  # reconnect next time: the engine may have restarted
        return [running.family, restarts.family, code.family, oom.family]
