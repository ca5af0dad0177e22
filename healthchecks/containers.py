"""Containers as a source: the Docker Engine's word on the containers SGLang runs in.

Where the playbooks run SGLang in a container, a dead server may be restarted by Docker
over and over; the restart count, the last exit code and `OOMKilled` tell what the
processes alone cannot (the exporter inside the container dies with it), and `OOMKilled`
is one more cause for a rank's death. Read through the `docker` SDK when asked; an engine
that does not answer is a `docker` error.
"""
from __future__ import annotations

from dsaops.healthchecks.metrics import ErrorCounts, Families


class Containers:
    def __init__(self, names: list[str], errors: ErrorCounts, base_url: str | None = None, timeout: float = 2.0):
        self.names, self.errors, self.base_url, self.timeout = names, errors, base_url, timeout
        self._client = None

    def inspect(self, name: str) -> dict | None:
        """`docker inspect NAME` as a dict; None (and a `docker` error) when the engine does not say."""
        import docker
        import requests.exceptions

        try:
            if self._client is None:
                self._client = (docker.DockerClient(base_url=self.base_url, timeout=self.timeout) if self.base_url
                                else docker.from_env(timeout=self.timeout))
            attrs = self._client.api.inspect_container(name)
            if not isinstance(attrs.get("State"), dict):
                raise TypeError("no State in the answer")
            return attrs
        except (docker.errors.DockerException, requests.exceptions.RequestException, TypeError):
            self.errors.inc("docker")
            self._client = None  # reconnect next time: the engine may have restarted
            return None

    def oom_killed(self) -> bool:
        """Docker marks a container's run OOMKilled when the OOM killer struck inside it (the flag
        stays until the container restarts)."""
        return any((attrs := self.inspect(name)) and attrs["State"].get("OOMKilled") for name in self.names)


class ContainerCollector:
    def __init__(self, containers: Containers, families: Families):
        self.containers, self.f = containers, families

    def collect(self):
        f = self.f
        running = f.gauge("dsa_container_running", "1 while the container runs", ("container",))
        restarts = f.counter("dsa_container_restarts_total", "Restarts Docker made of the container (RestartCount)",
                             ("container",))
        code = f.gauge("dsa_container_exit_code", "The container's last exit code", ("container",))
        oom = f.gauge("dsa_container_oom_killed", "1 when the kernel OOM killer struck in the container's last run",
                      ("container",))
        for name in self.containers.names:
            attrs = self.containers.inspect(name)
            if attrs is None:
                continue
            state = attrs["State"]
            running.add(1 if state.get("Running") else 0, name)
            restarts.add(int(attrs.get("RestartCount") or 0), name)
            code.add(int(state.get("ExitCode") or 0), name)
            oom.add(1 if state.get("OOMKilled") else 0, name)
        return [running.family, restarts.family, code.family, oom.family]
