"""Real ansible-playbook runs over SSH against sandbox hosts (network namespaces with sshd).

The hosts have no GPU and no systemd: preflight_require_gpu=false takes the documented
no-GPU path (everything rendered, nothing started). Machine-wide writes land under each
host's root prefix and are asserted there.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from dsaops.cli import build_parser
from dsaops.image import image_name
from tests.playbooks.ansible_sandbox import BIN, PLAYBOOKS, folded, free_port_probe, recap, snapshot, write_meminfo
from tests.support.prerequisites import need
from tests.support.sglang_definitions import parse_server_args

pytestmark = pytest.mark.timeout(600)


def _ok(result):
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return recap(result.stdout)


# Valid but odd: extra arguments and environment reach SGLang as they are, never as shell code.
ODD = "a b'c\"$(touch /tmp/dsaops-pwned)`touch /tmp/dsaops-pwned`;x\\y %n"


class CommandLines:
    """Every process command line on this machine (all namespaces share /proc), sampled while it runs."""

    def __enter__(self):
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        self.seen.add(f.read())
                except OSError:
                    pass
            time.sleep(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_check_then_apply_then_nothing_to_change(sandbox, cluster, tmp_path):
    write, roots = cluster
    # dgx-spark-2x's plan settings: the preflight plans, and the plan reaches each node's exporter.
    inventory = write(cluster_vars={"dsaops_mem_fraction_static": 0.8, "dsaops_max_running_requests": 16,
                                    "dsaops_gpu_memory_gib": 115, "dsaops_weights_gib": 140,
                                    "sglang_server_extra_args": ["--chat-template", ODD],
                                    "sglang_server_extra_env": {"DSAOPS_ODD": ODD}})
    token = {"HF_TOKEN": f"hf_{uuid.uuid4().hex}"}     # from the environment of the deploy, as documented
    fresh = snapshot(tmp_path / "roots")

    # --check on fresh hosts: reports the changes, makes none.
    checked = _ok(sandbox.playbook(inventory, tmp_path / "run-check", "--check"))
    assert all(checked[h]["changed"] > 0 for h in ("node1", "node2", "mon")), checked
    assert snapshot(tmp_path / "roots") == fresh

    # The real run: everything rendered under the prefixes.
    with CommandLines() as ps:
        first = sandbox.playbook(inventory, tmp_path / "run-1", env=token)
    applied = _ok(first)
    assert all(applied[h]["changed"] > 0 for h in ("node1", "node2", "mon")), applied
    assert "no GPU (preflight_require_gpu=false), so the server is not started" in first.stdout

    node1 = roots["node1"]
    sysctl = (node1 / "etc/sysctl.d/90-dsaops-host-memory.conf").read_text()
    assert "vm.min_free_kbytes = 2097152" in sysctl         # the unified-memory (GB10) defaults
    assert "vm.vfs_cache_pressure = 200" in sysctl
    assert "vm.watermark_boost_factor = 0" in sysctl
    assert (node1 / "proc/sys/vm/min_free_kbytes").read_text().strip() == "2097152"   # applied
    assert (node1 / "proc/sys/vm/drop_caches").read_text().strip() == "0"            # not started: no drop
    sshd_pid = sandbox.hosts["node1"]["pid"]
    assert (node1 / f"proc/{sshd_pid}/oom_score_adj").read_text().strip() == "-900"
    assert "OOMScoreAdjust=-900" in (node1 / "etc/systemd/system/ssh.service.d/90-dsaops-oom.conf").read_text()

    worker = (roots["node2"] / "usr/local/bin/dsaops-sglang").read_text()
    head_address = sandbox.hosts["node1"]["address"]
    for expected in ("--node-rank 1", "--nnodes 2", f"--dist-init-addr {head_address}:25000", "--tp-size 2",
                     f"SGLANG_HOST_IP={sandbox.hosts['node2']['address']}", "NCCL_SOCKET_IFNAME=clu0",
                     "NCCL_CUMEM_ENABLE=0", image_name("sm_121")):
        assert expected in worker, expected
    assert subprocess.run(["sh", "-n", str(roots["node2"] / "usr/local/bin/dsaops-sglang")], check=False).returncode == 0
    plan = json.loads((roots["node2"] / "etc/dsaops/plan.json").read_text())
    assert plan["kv_pool_tokens_per_rank"] > 0 and plan["kv_layout"] == "raw_fp8"
    assert "DSAOPS_EXPORTER_PLAN=/etc/dsaops/plan.json" in worker
    assert "/etc/dsaops/plan.json:/etc/dsaops/plan.json:ro" in worker
    # the node's cache is the server's DSAOPS_CACHE (the selftest verdict its decode routing reads), and
    # `dsaops-sglang selftest` runs the image's selftest there, as the real CLI accepts it (2 ranks: 32 heads)
    assert "DSAOPS_CACHE=/var/cache/dsaops" in worker and "--volume /var/cache/dsaops:/var/cache/dsaops" in worker
    assert (roots["node2"] / "var/cache/dsaops").is_dir()
    selftest = next(line for line in worker.splitlines() if line.strip().startswith("selftest)"))
    argv = shlex.split(selftest.split("exec docker run", 1)[1].rstrip(" ;"))
    assert argv[:3] == ["--rm", "--gpus", "all"] and image_name("sm_121") in argv
    command = argv[argv.index("dsaops") + 1:]
    assert command == ["kernels", "selftest", "--heads", "32", "--tp-size", "2", "--if-stale"]
    build_parser().parse_args(command)
    assert not (roots["node1"] / "etc/systemd/system/dsaops-sglang.service").exists()   # no systemd here

    # The head's dist-init port is fenced to the cluster in its own namespace (nftables).
    table = sandbox.nft("node1", "list", "table", "inet", "dsaops")
    assert table.returncode == 0, table.stderr
    # TP over 2 nodes, no attention DP: the dist-init port alone (dsaops/sglang_ports.py); the exporter's
    assert "tcp dport 25000 ip saddr @cluster accept" in table.stdout and "tcp dport 9860 ip saddr @monitoring" in table.stdout
    cluster_set = table.stdout.split("set cluster", 1)[1].split("}", 2)[0]
    assert all(sandbox.hosts[h]["address"] in cluster_set for h in ("node1", "node2"))

    # The exporter runs in its own container beside the server's (rendered, not started: no GPU here).
    assert "DSAOPS_EXPORTER=0" in worker
    exporter = (roots["node2"] / "usr/local/bin/dsaops-exporter").read_text()
    for expected in ("--pid host", "--cgroupns host", "dsaops docker-proxy --allow dsaops-sglang",
                     "--volume /var/log/dsaops:/var/log/dsaops:ro", "--docker-url unix:///run/dsaops/docker.sock",
                     "--plan /etc/dsaops/plan.json", "--node node2", image_name("sm_121")):
        assert expected in exporter, expected
    assert "/var/run/docker.sock" not in exporter.split("dsaops-exporter", 2)[-1]  # only the proxy holds the socket
    assert subprocess.run(["sh", "-n", str(roots["node2"] / "usr/local/bin/dsaops-exporter")], check=False).returncode == 0

    prometheus = (roots["mon"] / "etc/dsaops/prometheus/prometheus.yml").read_text()
    assert f"{sandbox.hosts['node2']['address']}:9860" in prometheus and "rules/*.yml" in prometheus
    alertmanager = roots["mon"] / "etc/dsaops/alertmanager/alertmanager.yml"
    assert alertmanager.stat().st_mode & 0o077 == 0 and "receiver: dsaops" in alertmanager.read_text()
    assert list((roots["mon"] / "etc/dsaops/prometheus/rules").glob("*.yml"))
    assert list((roots["mon"] / "etc/dsaops/grafana/dashboards").glob("*.json"))

    secrets = secrets_stay_in_their_files(roots, inventory, token["HF_TOKEN"], ps.seen)
    odd_values_reach_docker_as_they_are(sandbox, roots)
    monitoring_runs_as_its_own_users(roots, secrets)

    # Second run through `dsaops deploy`: nothing left to change, the same keys.
    again = sandbox.run([sys.executable, "-m", "dsaops", "deploy", "-i", str(inventory)], tmp_path / "run-2", env=token)
    assert again.returncode == 0, again.stdout[-6000:] + again.stderr[-3000:]
    assert "summary: 3 host(s), changed 0 thing(s) (already as wanted)" in again.stdout, again.stdout[-3000:]
    for host in ("node1", "node2", "mon"):     # host, ok, changed, failed, unreachable
        assert re.search(rf"^{host}\s+[1-9]\d*\s+0\s+0\s+0\s", again.stdout, re.MULTILINE), again.stdout[-3000:]
    assert {f.name: f.read_text() for f in secrets.dir.iterdir()} == secrets.files

    # Only cluster nodes reach the dist-init port: a listener on the head, probed from the
    # worker (a cluster node) and from the controller namespace (not one).
    with sandbox.listening("node1", 25000):
        assert free_port_probe(sandbox.hosts["node2"]["ns"], head_address, 25000)
        assert not free_port_probe(sandbox.ctl, head_address, 25000)
    fence_reaches_whom_it_should_and_comes_back(sandbox, roots, inventory, tmp_path)


SERVER_UID = 10001     # the sm_121 image's user (dsaops/targets.toml image_uid)
MONITORING = yaml.safe_load((PLAYBOOKS / "roles/monitoring/defaults/main.yml").read_text())   # the role's defaults
NOBODY = 65534         # many host daemons' user: no secret may be its
# Where each secret may be, under a node's root prefix: nowhere else on the nodes.
SECRET_FILES = {"etc/dsaops/sglang-secrets.yaml", "etc/dsaops/api-key", "etc/dsaops/hf-token",
                "etc/dsaops/exporter/api-key", "etc/dsaops/exporter/token", "etc/dsaops/grafana/admin-password",
                "etc/dsaops/prometheus/exporter-token"}


def secrets_stay_in_their_files(roots, inventory, token, command_lines):
    """The keys generated beside the inventory (0600 in a 0700 folder) and the Hugging Face token reach each node
    in files only their reader may read, and no command line, rendered script or other file."""
    folder = inventory.with_suffix(".secrets")
    files = {f.name: f.read_text() for f in folder.iterdir()}
    assert set(files) == {"api-key", "admin-api-key", "grafana-admin-password", "exporter-token"}, files
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all((folder / name).stat().st_mode & 0o777 == 0o600 for name in files)
    key, admin, grafana, scrape = (files[n].strip() for n in ("api-key", "admin-api-key", "grafana-admin-password",
                                                              "exporter-token"))
    assert len(key) == len(admin) == len(scrape) == 40 and len(grafana) == 24 and len({key, admin, grafana, scrape}) == 4
    # Prometheus' copy, its user's alone, beside the prometheus.yml that names it
    prom_token = roots["mon"] / "etc/dsaops/prometheus/exporter-token"
    assert (prom_token.stat().st_uid, prom_token.stat().st_mode & 0o777) == (MONITORING["monitoring_prometheus_uid"], 0o400)
    assert prom_token.read_text().strip() == scrape

    for node in ("node1", "node2"):
        etc = roots[node] / "etc/dsaops"
        for name, content in (("sglang-secrets.yaml", None), ("api-key", key), ("hf-token", token)):
            stat = (etc / name).stat()
            assert (stat.st_uid, stat.st_mode & 0o777) == (SERVER_UID, 0o400), (node, name)
            if content:
                assert (etc / name).read_text().strip() == content
        # SGLang's own config merger reads the keys from the file the server mounts
        args, _ = parse_server_args(["--model-path", "/m", "--config", str(etc / "sglang-secrets.yaml")])
        assert (args.api_key, args.admin_api_key) == (key, admin)
        script = (roots[node] / "usr/local/bin/dsaops-sglang").read_text()
        assert "--config /etc/dsaops/sglang-secrets.yaml" in script and "HF_TOKEN_PATH=/etc/dsaops/hf-token" in script
        assert "--volume /etc/dsaops/hf-token:/etc/dsaops/hf-token:ro" in script and "HF_TOKEN=" not in script
        exporter = (roots[node] / "usr/local/bin/dsaops-exporter").read_text()
        assert "--api-key-file /etc/dsaops/exporter/api-key" in exporter
        assert "--token-file /etc/dsaops/exporter/token" in exporter
        assert "hf-token" not in exporter and "HF_TOKEN" not in exporter and "--env-file" not in exporter
        assert (etc / "exporter/api-key").stat().st_mode & 0o777 == 0o400
        assert ((etc / "exporter/token").stat().st_mode & 0o777, (etc / "exporter/token").read_text().strip()) == (
            0o400, scrape)
        assert "exporter-token" not in script and not (etc / "exporter-token").exists()  # the exporter's own container

    for node, root in roots.items():
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                holds = [s for s in (key, admin, grafana, token, scrape) if s.encode() in data]
                assert not holds or str(path.relative_to(root)) in SECRET_FILES, (node, path)
                assert not holds or NOBODY not in (path.stat().st_uid, path.stat().st_gid), (node, path)
    leaked = [line for line in command_lines if any(s.encode() in line for s in (key, admin, grafana, token, scrape))]
    assert not leaked, leaked
    return SimpleNamespace(dir=folder, files=files, key=key, admin=admin, grafana=grafana)


def odd_values_reach_docker_as_they_are(sandbox, roots):
    """The rendered server command, run on the sandbox host over SSH with a `docker` that records its
    arguments: the odd extra argument and environment value arrive as one argument each, and nothing of
    them ran as shell code."""
    fake = roots["node2"] / "fake-bin"
    fake.mkdir()
    (fake / "docker").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {fake / 'argv'}\n")
    (fake / "docker").chmod(0o755)
    pwned = "/tmp/dsaops-pwned"
    assert not os.path.exists(pwned)
    script = roots["node2"] / "usr/local/bin/dsaops-sglang"
    ran = sandbox.ssh("node2", f"PATH={fake}:/usr/bin:/bin sh {shlex.quote(str(script))} run")
    assert ran.returncode == 0, ran.stderr
    argv = (fake / "argv").read_bytes().split(b"\0")[:-1]
    assert argv[:2] == [b"run", b"--name"] and b"--rm" not in argv and b"--chat-template" in argv
    assert argv[argv.index(b"--chat-template") + 1] == ODD.encode()
    assert f"DSAOPS_ODD={ODD}".encode() in argv
    assert not os.path.exists(pwned)


def monitoring_runs_as_its_own_users(roots, secrets):
    """Prometheus, Alertmanager and Grafana each as its own user, which no host account has (nobody, whom many
    daemons share, was the first two's): their folders and files are theirs, user and group; Grafana's admin
    password is the generated one, in a file only Grafana's user reads (the containers: test_static). On the
    nodes the Docker proxy's socket folder is its user's, and the exporter (uid 0 for /dev/kmsg) is in its group."""
    mon = roots["mon"]
    prometheus, alertmanager = MONITORING["monitoring_prometheus_uid"], MONITORING["monitoring_alertmanager_uid"]
    for path, uid in (("var/lib/dsaops/prometheus", prometheus), ("etc/dsaops/prometheus/exporter-token", prometheus),
                      ("var/lib/dsaops/alertmanager", alertmanager), ("etc/dsaops/alertmanager/alertmanager.yml", alertmanager),
                      ("etc/dsaops/grafana/admin-password", 472)):
        assert ((mon / path).stat().st_uid, (mon / path).stat().st_gid) == (uid, uid), path
    proxy = MONITORING["monitoring_docker_proxy_uid"]
    assert NOBODY not in (prometheus, alertmanager, proxy) and len({prometheus, alertmanager, proxy, 472}) == 4
    for node in ("node1", "node2"):
        run_dir = (roots[node] / "run/dsaops").stat()
        assert (run_dir.st_uid, run_dir.st_gid, run_dir.st_mode & 0o777) == (proxy, proxy, 0o750)
        runs = [line for line in (roots[node] / "usr/local/bin/dsaops-exporter").read_text().splitlines()
                if line.startswith("docker run")]
        assert f"--user {proxy}:{proxy} " in runs[0] and f"--user 0:0 --group-add {proxy} " in runs[1]
    password = mon / "etc/dsaops/grafana/admin-password"
    assert (password.stat().st_uid, password.stat().st_mode & 0o777) == (472, 0o400)
    assert password.read_text() == secrets.grafana != "admin"
    table = (mon / "etc/nftables.d/dsaops-monitoring.nft").read_text()
    assert "tcp dport { 9090, 9093, 3000 } ip saddr @monitoring accept" in table


def fence_reaches_whom_it_should_and_comes_back(sandbox, roots, inventory, tmp_path):
    """The exporter's port admits the monitoring host only; the rule set comes back at boot (nftables.service
    loads /etc/nftables.conf, which includes ours) and, flushed, with the next run."""
    node2 = sandbox.hosts["node2"]
    with sandbox.listening("node2", 9860):
        assert free_port_probe(sandbox.hosts["mon"]["ns"], node2["address"], 9860)       # the monitoring host
        assert not free_port_probe(sandbox.hosts["node1"]["ns"], node2["address"], 9860)  # a cluster node is not one
        assert not free_port_probe(sandbox.ctl, node2["address"], 9860)

    conf = roots["node1"] / "etc/nftables.conf"
    assert f'include "{roots["node1"]}/etc/nftables.d/dsaops.nft"' in conf.read_text()
    live = sandbox.nft("node1", "list", "table", "inet", "dsaops").stdout
    assert sandbox.nft("node1", "flush", "ruleset").returncode == 0
    assert sandbox.nft("node1", "-f", str(conf)).returncode == 0                          # what the boot does
    assert sandbox.nft("node1", "list", "table", "inet", "dsaops").stdout == live

    sandbox.nft("node1", "flush", "ruleset")                                               # flushed, file unchanged
    assert sandbox.nft("node1", "list", "table", "inet", "dsaops").returncode != 0
    rerun = _ok(sandbox.playbook(inventory, tmp_path / "run-3", "--tags", "network"))
    assert sandbox.nft("node1", "list", "table", "inet", "dsaops").stdout == live
    assert rerun["node1"]["changed"] == 1 and rerun["node2"]["changed"] == 0, rerun


# host_memory's guard rails on one node (TP 1) to keep the runs short; the inventory refusals on two.
ONE_NODE = {"dsaops_head": ["node1"], "dsaops_workers": []}


@pytest.mark.parametrize("case, overrides, message", [
    ("unsafe min_free_kbytes", {"groups": ONE_NODE, "cluster_vars": {
        "dsaops_tp_size": 1, "host_memory_min_free_kbytes": 200 * 1024 * 1024}}, "Unsafe vm.min_free_kbytes=209715200"),
    ("unsafe vfs_cache_pressure", {"groups": ONE_NODE, "cluster_vars": {
        "dsaops_tp_size": 1, "host_memory_vfs_cache_pressure": 0}}, "vm.vfs_cache_pressure must be 1..1000"),
    ("memory fraction on unified memory", {"groups": ONE_NODE, "cluster_vars": {
        "dsaops_tp_size": 1, "dsaops_mem_fraction_static": 0.99}},
     "On unified memory (GB10) vm.min_free_kbytes comes out of the memory SGLang sees"),
    ("no GPU, target auto", {"groups": ONE_NODE, "cluster_vars": {
        "dsaops_tp_size": 1, "preflight_require_gpu": True, "dsaops_target": "auto"}},
     ("Install the NVIDIA driver (nvidia-smi) or ROCm (rocminfo); or, to render everything without starting the "
      "server, set preflight_require_gpu=false and a target (-e preflight_require_gpu=false -e "
      "dsaops_target=sm_90|sm_121|gfx942)")),
    ("two heads", {"groups": {"dsaops_head": ["node1", "node2"], "dsaops_workers": []}},
     "must put exactly one host in group dsaops_head"),
    ("TP not divisible", {"cluster_vars": {"dsaops_tp_size": 3}},
     "dsaops_tp_size 3 must be divisible by the 2 node(s)"),
    # host_memory used to change the nodes before the network role looked for the devices
    ("missing RDMA device", {"cluster_vars": {"dsaops_ib_hca": ["mlx5_dsaops_9"]}},
     "node1: dsaops_ib_hca lists ['mlx5_dsaops_9'], which /sys/class/infiniband lacks"),
])
def test_refusals_stop_before_any_change(sandbox, cluster, tmp_path, case, overrides, message):
    write, _ = cluster
    before = snapshot(tmp_path / "roots")
    result = sandbox.playbook(write(**overrides), tmp_path / "run")
    assert result.returncode != 0, case
    assert message in folded(result.stdout), result.stdout[-4000:]
    assert all(host["changed"] == 0 for host in recap(result.stdout).values()), recap(result.stdout)
    assert snapshot(tmp_path / "roots") == before


def test_gb10_prestart_drops_caches_when_memfree_is_low(sandbox, cluster, tmp_path):
    """The pre-start guard (run by sglang_server right before a start) under the prefix."""
    write, roots = cluster
    inventory = write()
    (roots["node1"] / "proc/meminfo").write_text("MemTotal: 125000000 kB\nMemFree: 4000000 kB\n")      # < 8 GiB
    (roots["node2"] / "proc/meminfo").write_text("MemTotal: 125000000 kB\nMemFree: 100000000 kB\n")    # plenty
    play = tmp_path / "prestart.yml"
    play.write_text(
        "- name: Pre-start guard\n  hosts: dsaops_cluster\n  gather_facts: false\n  tasks:\n"
        "    - name: Run it\n      ansible.builtin.include_role:\n        name: host_memory\n"
        "        tasks_from: prestart\n      vars:\n        host_memory_unified_memory: true\n")
    result = sandbox.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(play)], tmp_path / "run")
    assert result.returncode == 0, result.stdout[-4000:]
    assert (roots["node1"] / "proc/sys/vm/drop_caches").read_text().strip() == "3"
    assert (roots["node1"] / "proc/sys/vm/compact_memory").read_text().strip() == "1"
    assert (roots["node2"] / "proc/sys/vm/drop_caches").read_text().strip() == "0"


def test_a_cluster_shrunk_to_one_node_drops_the_other_nodes_transfer_key(sandbox, cluster, tmp_path):
    """node1 authorized node2's transfer key when they were two; alone in the inventory, node1 keeps its admin's key
    and makes no key of its own (no node to copy to), and node2's root login from its cluster address is gone. (Which
    keys a node of two keeps: test_staging's two-node copy.)"""
    write, roots = cluster
    authorized = roots["node1"] / "root/.ssh/authorized_keys"
    authorized.parent.mkdir(parents=True)
    admin = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAdminKeyOfTheNode admin@workstation"
    node2 = f'from="{sandbox.hosts["node2"]["address"]}",restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey dsaops transfer from node2'
    authorized.write_text(f"{admin}\n{node2}\n")
    staged = {"dsaops_tp_size": 1, "dsaops_stage": True, "dsaops_weights_stage": False}
    one = _ok(sandbox.playbook(write(groups=ONE_NODE, cluster_vars=staged), tmp_path / "one", "--tags", "weights"))
    assert one["node1"]["changed"] == 1 and authorized.read_text() == f"{admin}\n"
    assert not (roots["node1"] / "etc/dsaops/transfer").exists()


def test_taken_port_stops_before_any_change(sandbox, cluster, tmp_path):
    write, _ = cluster
    before = snapshot(tmp_path / "roots")
    with sandbox.listening("node1", 30000):
        result = sandbox.playbook(write(), tmp_path / "run")
    assert result.returncode != 0
    assert "node1: port(s) 30000 already in use by another process" in folded(result.stdout)
    assert snapshot(tmp_path / "roots") == before


def test_an_inventory_without_the_dsaops_groups_touches_no_host(sandbox, cluster, tmp_path):
    """Reachable hosts, but not in dsaops_cluster: both entry points stop on the controller, no host changes."""
    _, roots = cluster
    inventory = tmp_path / "servers.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"servers": {"hosts": {
        name: sandbox.host_vars(name, roots[name]) for name in ("node1", "node2")}}}}}))
    before = snapshot(tmp_path / "roots")
    played = sandbox.playbook(inventory, tmp_path / "run-play")
    assert played.returncode == 2, played.stdout[-3000:]
    assert "no host in group dsaops_cluster (groups found: servers" in folded(played.stdout)
    assert set(recap(played.stdout)) == {"localhost"}
    deployed = sandbox.run([sys.executable, "-m", "dsaops", "deploy", "-i", str(inventory)], tmp_path / "run-deploy")
    assert deployed.returncode == 2 and "it puts no host in group dsaops_cluster" in deployed.stderr
    assert snapshot(tmp_path / "roots") == before


def _serve_reads(path, contents: list[str]) -> threading.Thread:
    """Turn `path` into a FIFO whose readers get contents[0], contents[1], ... in turn: each reading the
    script makes is one step, whatever the timing."""
    path.unlink()
    os.mkfifo(path)

    def serve():
        for text in contents:
            with open(path, "w") as fifo:      # blocks until the next reader opens it
                fifo.write(text)
            while True:                        # until that reader has closed it (ENXIO: no reader left)
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    break
                time.sleep(0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


# A container name that is odd but valid: the unit renders it and gets no directive of its own from it.
ODD_NAME = "dsaops.sglang_x-1"
UNIT_DIRECTIVES = [("Unit", "Description"), ("Unit", "After"), ("Unit", "Requires"), ("Unit", "Wants"),
                   ("Service", "ExecStartPre"), ("Service", "ExecStartPre"), ("Service", "ExecStart"),
                   ("Service", "ExecStop"), ("Service", "TimeoutStopSec"), ("Service", "Restart"),
                   ("Service", "RestartSec"), ("Service", "TimeoutStartSec"), ("Install", "WantedBy")]


def unit_directives(text: str) -> list[tuple[str, str]]:
    """(section, key) of every directive of a systemd unit, in order."""
    section, found = None, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        else:
            found.append((section, line.split("=", 1)[0]))
    return found


def systemd_accepts(unit: Path, root: Path) -> None:
    """`systemd-analyze verify` finds nothing wrong with the unit but the commands it runs missing from this
    machine (they are under the host's root prefix). Without systemd-analyze, the directive check above stands."""
    if not shutil.which("systemd-analyze"):
        need(not os.environ.get("CI"), "systemd-analyze (apt-get install systemd)")
        return
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], check=False, capture_output=True, text=True,
                            timeout=60)
    missing = re.compile(r"Command (\S+) is not executable")
    for line in (verify.stdout + verify.stderr).splitlines():
        if line.strip():
            found = missing.search(line)
            assert found and (root / found[1].lstrip("/")).is_file(), line


def test_the_directive_check_sees_an_injected_line(tmp_path):
    """Control: the unit template rendered without the inventory checks (plain Jinja) and a name carrying a
    newline gains a directive, which the comparison above catches."""
    import jinja2

    template = jinja2.Template((PLAYBOOKS / "roles/sglang_server/templates/dsaops-sglang.service.j2").read_text())
    text = template.render(ansible_managed="", sglang_server_node_rank=0, sglang_server_nnodes=1,
                           sglang_server_script="/usr/local/bin/dsaops-sglang", sglang_server_stop_timeout=120,
                           sglang_server_container_name="x\nExecStartPost=/bin/sh -c 'touch /tmp/dsaops-pwned'")
    assert unit_directives(text) != UNIT_DIRECTIVES and ("Service", "ExecStartPost") in unit_directives(text)


def test_gb10_memory_gate_waits_for_memory_then_stops(sandbox, cluster, tmp_path):
    """Right before a start, each node's rendered `dsaops-sglang wait-memory` waits until MemAvailable reaches
    the plan's free memory before weights (115 - 8 = 107 GiB here). node1's memory comes back on the second
    reading (a crashed server's memory released); node2's never does, so the run stops with the script's words."""
    write, roots = cluster
    inventory = write(cluster_vars={"dsaops_mem_fraction_static": 0.8, "dsaops_max_running_requests": 16,
                                    "dsaops_gpu_memory_gib": 115, "dsaops_weights_gib": 140,
                                    "sglang_server_memory_wait_s": 4, "sglang_server_memory_poll_s": 1,
                                    "dsaops_server_container": ODD_NAME},
                      node1={"sglang_server_supervisor": "systemd"})
    _ok(sandbox.playbook(inventory, tmp_path / "run-render", "--tags", "sglang_server"))
    unit_path = roots["node1"] / "etc/systemd/system/dsaops-sglang.service"
    unit = unit_path.read_text()
    assert "ExecStartPre=/usr/local/bin/dsaops-sglang wait-memory" in unit           # systemd waits on the host
    assert unit_directives(unit) == UNIT_DIRECTIVES                                    # the odd name added none
    assert f"ExecStop=/usr/bin/docker stop --time 120 {ODD_NAME}" in unit
    systemd_accepts(unit_path, roots["node1"])
    node2 = (roots["node2"] / "usr/local/bin/dsaops-sglang").read_text()              # Docker's restarts wait inside
    assert "'DSAOPS_BEFORE_START=/usr/local/bin/dsaops-sglang wait-memory'" in node2
    assert "DSAOPS_BEFORE_START" not in (roots["node1"] / "usr/local/bin/dsaops-sglang").read_text()

    gib = 1 << 20
    reads = _serve_reads(roots["node1"] / "proc/meminfo", [f"MemAvailable: {100 * gib} kB\n", f"MemAvailable: {110 * gib} kB\n"])
    write_meminfo(roots["node2"], 127_000_000, 100 * gib)
    play = tmp_path / "gate.yml"
    play.write_text("- name: Memory gate\n  hosts: dsaops_cluster\n  gather_facts: false\n  tasks:\n"
                    "    - name: Wait\n      ansible.builtin.include_role:\n        name: sglang_server\n"
                    "        tasks_from: memory_gate\n")
    try:
        result = sandbox.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(play)], tmp_path / "run-gate")
    finally:
        if reads.is_alive():                       # release a writer still waiting for a reader
            os.close(os.open(roots["node1"] / "proc/meminfo", os.O_RDONLY | os.O_NONBLOCK))
    text = folded(result.stdout)
    assert result.returncode != 0
    assert re.search(r"dsaops-sglang: MemAvailable 100\.0 GiB is below the 107\.0 GiB the plan assumes free before the "
                     r"weights load; waiting up to 4 s \(a stopped server'+s unified memory can stay held for a while\) "
                     r"dsaops-sglang: MemAvailable is back to 110\.0 GiB after [1-3] s", text), text[-3000:]
    assert ("dsaops-sglang: MemAvailable is 100.0 GiB after waiting 4 s, below the 107.0 GiB dsaops plan assumed free "
            "before the weights load; not starting the server: free memory on node2") in text
    assert recap(result.stdout)["node1"]["failed"] == 0 and recap(result.stdout)["node2"]["failed"] == 1
