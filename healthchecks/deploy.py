"""The exporter as its own container on a serving node: the `docker run` arguments, computed once
for the playbook (the dsaops_exporter_containers filter) and the tests.

Two containers from the serving image, each with Docker's restart policy:

- `dsaops-docker-proxy`: holds the Docker socket, answers only the state of the server container
  (`dsaops docker-proxy`), on a Unix socket in `run_dir`; no network, read-only, no capabilities,
  as its own user (`proxy_uid`, group the same) in the Docker socket's group (`docker_gid`).
- `dsaops-exporter`: `dsaops exporter` with what each fact needs and no more:
  the server log's folder read-only; its own state folder; the host's PID namespace (the ranks,
  and their pids inside the server container through NSpid) and the host's cgroup namespace with
  the node's cgroup tree read-only (where an OOM kill is counted); the proxy's socket; the API key
  file read-only (for /server_info); the token file read-only (every scrape must carry its token);
  with `kmsg`, /dev/kmsg and CAP_SYSLOG (the kernel's OOM record, which names the pid). Host network (it serves /metrics and reads the server at
  `server_host`, loopback unless the server listens on one address only), read-only root, no other
  capability, no new privileges. It runs as its own user (`uid`, group the same); with `kmsg` as uid 0
  holding CAP_SYSLOG alone (Docker gives an added capability to uid 0 only); either way in the proxy's
  group, to reach its socket.

The two uids are the monitoring role's (monitoring_exporter_uid, monitoring_docker_proxy_uid): no host
account has them, so the files given to each container are its process's alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

CGROUP_MOUNT = "/host/sys/fs/cgroup"


@dataclass(frozen=True)
class ExporterDeployment:
    image: str
    node: str
    server_container: str
    server_port: int
    listen: str
    log_file: str
    uid: int                          # the exporter's user (and group) where it does not read /dev/kmsg
    proxy_uid: int                    # the Docker proxy's user (and group), which owns the socket's folder
    server_host: str = "127.0.0.1"    # the URL host the server answers at from the node (dsaops.fence.probe_host)
    state_dir: str = "/var/lib/dsaops/exporter"
    run_dir: str = "/run/dsaops"
    plan: str | None = None
    api_key_file: str | None = None
    token_file: str | None = None
    kmsg: bool = True
    docker_gid: int = 0
    exporter_name: str = "dsaops-exporter"
    proxy_name: str = "dsaops-docker-proxy"
    docker_socket: str = "/var/run/docker.sock"

    @property
    def proxy_socket(self) -> str:
        return f"{self.run_dir}/docker.sock"

    @property
    def exporter_uid(self) -> int:
        """The exporter's user: its own, or uid 0 where it needs CAP_SYSLOG for /dev/kmsg."""
        return 0 if self.kmsg else self.uid


def users(d: ExporterDeployment) -> dict[str, int]:
    """The containers' uids (and gids): the host folders and files each one writes or reads are given to it."""
    return {"exporter": d.exporter_uid, "proxy": d.proxy_uid}


def _detached(name: str) -> list[str]:
    return ["--detach", "--name", name, "--restart", "unless-stopped", "--read-only",
            "--security-opt", "no-new-privileges", "--cap-drop", "ALL"]


def proxy_run(d: ExporterDeployment, extra: tuple[str, ...] = ()) -> list[str]:
    """`docker run` arguments of the Docker proxy (after `docker run`)."""
    return [*_detached(d.proxy_name), "--network", "none", "--user", f"{d.proxy_uid}:{d.proxy_uid}",
            "--group-add", str(d.docker_gid),
            "--volume", f"{d.docker_socket}:/var/run/docker.sock", "--volume", f"{d.run_dir}:{d.run_dir}",
            *extra, d.image,
            "dsaops", "docker-proxy", "--allow", d.server_container, "--listen", d.proxy_socket]


def exporter_run(d: ExporterDeployment, extra: tuple[str, ...] = ()) -> list[str]:
    """`docker run` arguments of the exporter (after `docker run`)."""
    log_dir = str(PurePosixPath(d.log_file).parent)
    options = [*_detached(d.exporter_name), "--user", f"{d.exporter_uid}:{d.exporter_uid}", "--group-add", str(d.proxy_uid),
               "--network", "host", "--pid", "host", "--cgroupns", "host",
               "--volume", f"{log_dir}:{log_dir}:ro", "--volume", f"{d.state_dir}:{d.state_dir}",
               "--volume", f"/sys/fs/cgroup:{CGROUP_MOUNT}:ro", "--volume", f"{d.run_dir}:{d.run_dir}"]
    if d.kmsg:
        options += ["--device", "/dev/kmsg:/dev/kmsg:r", "--cap-add", "SYSLOG"]
    if d.plan:
        options += ["--volume", f"{d.plan}:{d.plan}:ro"]
    if d.api_key_file:
        options += ["--volume", f"{d.api_key_file}:{d.api_key_file}:ro"]
    if d.token_file:
        options += ["--volume", f"{d.token_file}:{d.token_file}:ro"]
    command = ["dsaops", "exporter", "--server-url", f"http://{d.server_host}:{d.server_port}", "--log-file", d.log_file,
               "--state-file", f"{d.state_dir}/state.json", "--listen", d.listen, "--node", d.node,
               "--container", d.server_container, "--docker-url", f"unix://{d.proxy_socket}",
               "--cgroup-root", CGROUP_MOUNT, "--kmsg", "/dev/kmsg" if d.kmsg else "none"]
    if d.plan:
        command += ["--plan", d.plan]
    if d.api_key_file:
        command += ["--api-key-file", d.api_key_file]
    if d.token_file:
        command += ["--token-file", d.token_file]
    return [*options, *extra, d.image, *command]


def containers(d: ExporterDeployment, extra: tuple[str, ...] = ()) -> list[dict]:
    """[{name, args}] in start order: the proxy, then the exporter."""
    return [{"name": d.proxy_name, "args": proxy_run(d, extra)}, {"name": d.exporter_name, "args": exporter_run(d, extra)}]
