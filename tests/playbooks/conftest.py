"""Fixtures for the playbook tests: one set of sandbox hosts per session (namespaces + sshd)."""
import contextlib
import shutil

import pytest
import yaml

from tests.playbooks.ansible_sandbox import Sandbox, available, fake_kernel
from tests.support.prerequisites import need

HOSTS = ("node1", "node2", "mon")


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    why = available()
    need(why is None, why or "")
    box = Sandbox(tmp_path_factory.mktemp("sandbox"), list(HOSTS)).start()
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture
def cluster(sandbox, tmp_path):
    """A fresh two-node GB10-like cluster (head node1, worker node2) plus a monitoring host,
    each with its own root prefix holding fake kernel files; returns (inventory writer, roots)."""
    roots = {name: tmp_path / "roots" / name for name in HOSTS}
    for name, root in roots.items():
        fake_kernel(root, sandbox.hosts[name]["pid"])
        sandbox.bind_root(name, root)

    def write(**overrides):
        host = {name: sandbox.host_vars(name, roots[name]) | overrides.pop(name, {}) for name in HOSTS}
        cluster_vars = {"dsaops_target": "sm_121", "dsaops_gpus_per_node": 1, "dsaops_tp_size": 2,
                        "dsaops_cluster_interface": "clu0", "preflight_require_gpu": False,
                        **overrides.pop("cluster_vars", {})}
        groups = overrides.pop("groups", {"dsaops_head": ["node1"], "dsaops_workers": ["node2"]})
        inventory = {"all": {"children": {
            "dsaops_cluster": {"vars": cluster_vars, "children": {
                group: {"hosts": {h: host[h] for h in members}} for group, members in groups.items()}},
            "dsaops_monitoring": {"hosts": {"mon": host["mon"]}},
        }}}
        path = tmp_path / f"inventory-{len(list(tmp_path.glob('inventory-*')))}.yml"
        path.write_text(yaml.safe_dump(inventory))
        return path

    return write, roots


@pytest.fixture(scope="session")
def node_engines(sandbox, tmp_path_factory):
    """A real dockerd for each serving host (tests/support/dockerd.py): {host: its DOCKER_HOST}."""
    from tests.support.dockerd import DEBIAN_DOCKER, running

    need(shutil.which("dockerd") is not None and DEBIAN_DOCKER.is_file(), "Docker from Debian (apt-get install docker.io)")
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(running(tmp_path_factory.mktemp(f"engine-{name}")))["DOCKER_HOST"]
               for name in ("node1", "node2")}
