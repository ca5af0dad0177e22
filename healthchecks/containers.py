"""Containers as a source: the Docker Engine's word on the containers SGLang runs in.

Where the playbooks run SGLang in a container, a dead server may be restarted over and over:
by Docker (its `RestartCount`) or by the systemd unit, which removes the container and runs a
new one under the same name at each start (a new `Id`). The restarts, the last exit code and
`OOMKilled` tell what the processes alone cannot (the exporter inside the container dies with
it), and `OOMKilled` is one more cause for a rank's death. Read through the `docker` SDK when
asked; an engine that does not answer is a `docker` error. The Id and count last seen of each
name go into the state file, so an exporter restart neither loses nor repeats a restart.
"""
from __future__ import annotations

import threading

from dsaops.healthchecks.logparse import bounded
from dsaops.healthchecks.metrics import ErrorCounts, Families


class Containers:
    def __init__(self, names: list[str], errors: ErrorCounts, base_url: str | None = None, timeout: float = 2.0):
        self.names, self.errors, self.base_url, self.timeout = names, errors, base_url, timeout
        self._client = None
        self._lock = threading.Lock()
        self._seen: dict[str, dict] = {}  # name -> "id", "count" (RestartCount) last seen; "base": earlier runs' restarts

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
            self._note(name, str(attrs.get("Id") or ""), int(attrs.get("RestartCount") or 0))
            return attrs
        except (docker.errors.DockerException, requests.exceptions.RequestException, TypeError, ValueError):
            self.errors.inc("docker")
            self._client = None  # reconnect next time: the engine may have restarted
            return None

    def _note(self, name: str, cid: str, count: int) -> None:
        """Fold what an earlier container under this name counted into "base", so the total only
        grows: a new Id is one restart more (re-created), and a start by hand resets Docker's count."""
        with self._lock:
            seen = self._seen.get(name)
            if seen is None:
                self._seen[name] = {"id": cid, "count": count, "base": 0}
                return
            if seen["id"] != cid:
                seen["base"] += seen["count"] + 1
            elif count < seen["count"]:
                seen["base"] += seen["count"]
            seen["id"], seen["count"] = cid, count

    def restarts(self, name: str) -> int:
        """Restarts of the container under `name` seen so far: Docker's and re-creations."""
        with self._lock:
            seen = self._seen.get(name)
            return seen["base"] + seen["count"] if seen else 0

    def to_json(self) -> dict:
        with self._lock:
            return {name: dict(seen) for name, seen in self._seen.items()}

    @staticmethod
    def _parse(saved: dict) -> dict:
        return {str(name): {"id": str(s["id"]), "count": bounded(s["count"]), "base": bounded(s["base"])}
                for name, s in saved.items()}

    def check(self, saved: dict) -> None:
        """Raise when `saved` is not what to_json writes."""
        self._parse(saved)

    def restore(self, saved: dict) -> None:
        """Take back the Ids and counts a previous exporter saw: a container re-created while it
        was down is one restart more at the next look, one it saw is not counted again."""
        with self._lock:
            self._seen = self._parse(saved)

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
        restarts = f.counter("dsa_container_restarts_total",
                             "Restarts of the container: Docker's RestartCount and re-creations under its name",
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
            restarts.add(self.containers.restarts(name), name)
            code.add(int(state.get("ExitCode") or 0), name)
            oom.add(1 if state.get("OOMKilled") else 0, name)
        return [running.family, restarts.family, code.family, oom.family]
