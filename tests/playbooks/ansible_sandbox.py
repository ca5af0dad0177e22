"""Sandbox hosts for real Ansible runs over SSH on one machine.

A controller network namespace holds a bridge; every sandbox host is a namespace of its own,
linked to the bridge by a veth pair (named `clu0` inside the host: the cluster link), running
its own sshd. The hosts share the filesystem, so each test gives each host its own root
prefix (dsaops_root) and fakes the kernel files the roles read and write there (/proc/sys/vm,
/proc/meminfo, sshd's pid file): no test touches the machine's real vm.* settings.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.support.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
BIN = Path(sys.executable).parent
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def available() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "sandbox hosts need root (network namespaces)"
    if not os.path.exists(SSHD):
        return "sshd is missing (apt-get install openssh-server)"
    if not shutil.which("ip"):
        return "ip is missing (apt-get install iproute2)"
    return None


class Sandbox:
    def __init__(self, workdir: Path, hosts: list[str]):
        self.workdir = workdir
        self.tag = uuid.uuid4().hex[:6]
        self.subnet = f"10.{200 + int(self.tag[:2], 16) % 50}.{int(self.tag[2:4], 16)}"
        self.ctl = f"dsx{self.tag}-ctl"
        self.hosts = {name: {"ns": f"dsx{self.tag}-{i}", "address": f"{self.subnet}.{11 + i}"}
                      for i, name in enumerate(hosts)}
        self.key = workdir / "client_key"
        self.namespaces: list[str] = []
        self.sshds: list[subprocess.Popen] = []
        self._runs = itertools.count()

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def start(self) -> Sandbox:
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        self.ip("netns", "add", self.ctl)
        self.namespaces.append(self.ctl)
        self.ip("-n", self.ctl, "link", "set", "lo", "up")
        self.ip("-n", self.ctl, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.ctl, "addr", "add", f"{self.subnet}.1/24", "dev", "br0")
        self.ip("-n", self.ctl, "link", "set", "br0", "up")
        for i, (name, host) in enumerate(self.hosts.items()):
            ns = host["ns"]
            self.ip("netns", "add", ns)
            self.namespaces.append(ns)
            self.ip("-n", self.ctl, "link", "add", f"v{i}", "type", "veth", "peer", "name", "clu0", "netns", ns)
            self.ip("-n", self.ctl, "link", "set", f"v{i}", "master", "br0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "addr", "add", f"{host['address']}/24", "dev", "clu0")
            self.ip("-n", ns, "link", "set", "clu0", "up")
            host["pid"] = self._sshd(name, host)
        for host in self.hosts.values():
            self._wait_ssh(host["address"])
        return self

    def _sshd(self, name: str, host: dict) -> int:
        d = self.workdir / f"sshd-{name}"
        d.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "hostkey")], check=True)
        pidfile = d / "sshd.pid"
        (d / "sshd_config").write_text(
            f"ListenAddress {host['address']}\nPort 22\nHostKey {d / 'hostkey'}\nPidFile {pidfile}\n"
            f"AuthorizedKeysFile {self.key}.pub {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\n")
        # -D: sshd stays our child (ip netns exec execs it), so stop() can reap it.
        proc = subprocess.Popen(["ip", "netns", "exec", host["ns"], SSHD, "-D", "-f", str(d / "sshd_config")])
        self.sshds.append(proc)
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                return int(pidfile.read_text())
            time.sleep(0.05)
        raise RuntimeError(f"sshd for {name} did not start")

    def _wait_ssh(self, address: str) -> None:
        probe = f"import socket; socket.create_connection(({address!r}, 22), timeout=1).close()"
        for _ in range(50):
            if subprocess.run(["ip", "netns", "exec", self.ctl, sys.executable, "-c", probe],
                              check=False, capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"sshd on {address} does not answer")

    def stop(self) -> None:
        for proc in self.sshds:
            proc.terminate()
            proc.wait(timeout=10)
        # Left in our namespaces: ssh control masters (ControlPersist) and their sshd sessions.
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True, text=True).stdout
            for pid in pids.split():
                try:
                    os.kill(int(pid), 15)
                except ProcessLookupError:
                    pass
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)

    # --- per test -------------------------------------------------------------------------

    def bind_root(self, name: str, root: Path) -> None:
        """Give a host's root prefix the SSH files a real host has: its host key where the transfer
        role reads it, and the authorized_keys under the prefix that its sshd honours (beside the
        controller's key), so node-to-node copies log in with the keys the roles authorize."""
        d = self.workdir / f"sshd-{name}"
        (root / "etc/ssh").mkdir(parents=True, exist_ok=True)
        shutil.copy(d / "hostkey.pub", root / "etc/ssh/ssh_host_ed25519_key.pub")
        link = d / "authorized_keys"
        link.unlink(missing_ok=True)
        link.symlink_to(root / "root/.ssh/authorized_keys")

    def host_vars(self, name: str, root: Path) -> dict:
        return {"ansible_host": self.hosts[name]["address"], "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.key),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                "ansible_python_interpreter": "/usr/bin/python3",
                "dsaops_root": str(root), "dsaops_cluster_address": self.hosts[name]["address"]}

    def env(self, run_dir: Path) -> dict:
        for sub in ("home", "remote", "local"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        # A socket path has at most 107 bytes: the control sockets go under the short session folder.
        control = self.workdir / f"cp{next(self._runs)}"
        control.mkdir()
        return {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS.parent / "ansible.cfg"), "ANSIBLE_HOME": str(run_dir / "home"),
                "ANSIBLE_REMOTE_TMP": str(run_dir / "remote"), "ANSIBLE_LOCAL_TEMP": str(run_dir / "local"),
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control), "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_HOST_KEY_CHECKING": "False", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(self, argv: list[str], run_dir: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        """A command in the controller namespace (ansible-playbook, dsaops deploy); `env` adds to its environment."""
        return subprocess.run(["ip", "netns", "exec", self.ctl, *argv], cwd=REPO, env=self.env(run_dir) | (env or {}),
                              check=False, capture_output=True, text=True, timeout=timeout)

    def ssh(self, name: str, command: str) -> subprocess.CompletedProcess:
        """`command` run by a shell on sandbox host `name`, over SSH from the controller namespace."""
        return subprocess.run(["ip", "netns", "exec", self.ctl, "ssh", "-i", str(self.key), "-o", "BatchMode=yes",
                               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                               "LogLevel=ERROR", f"root@{self.hosts[name]['address']}", command],
                              check=False, capture_output=True, text=True, timeout=60)

    def nft(self, name: str, *args: str) -> subprocess.CompletedProcess:
        """nft in sandbox host `name`'s network namespace (its own rule set)."""
        return subprocess.run(["ip", "netns", "exec", self.hosts[name]["ns"], "nft", *args], check=False,
                              capture_output=True, text=True, timeout=30)

    @contextlib.contextmanager
    def listening(self, name: str, port: int):
        """A TCP listener on sandbox host `name`'s cluster address and `port`, reachable from its own namespace,
        for as long as the block runs: what the fence and the port checks are probed against."""
        host = self.hosts[name]
        listener = subprocess.Popen(["ip", "netns", "exec", host["ns"], sys.executable, "-m", "http.server", str(port),
                                     "--bind", host["address"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert wait_for(lambda: free_port_probe(host["ns"], host["address"], port), timeout=10)
            yield
        finally:
            listener.terminate()
            listener.wait()

    def playbook(self, inventory: Path, run_dir: Path, *args: str, playbook: str = "cluster.yml", env: dict | None = None):
        return self.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / playbook), *args],
                        run_dir, env=env)


def folded(output: str) -> str:
    """A run's output as one line: Ansible folds a message over lines, at widths that vary."""
    return " ".join(output.split())


def recap(output: str) -> dict[str, dict[str, int]]:
    """ansible-playbook's PLAY RECAP as {host: {ok, changed, unreachable, failed}}."""
    return {m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
            for m in RECAP.finditer(output)}


def fake_kernel(root: Path, sshd_pid: int, memtotal_kib: int = 127_000_000, memfree_kib: int = 100_000_000) -> None:
    """The kernel files the roles read and write, under a host's root prefix, with kernel defaults
    and a GB10's memory (128 GB)."""
    vm = root / "proc/sys/vm"
    vm.mkdir(parents=True)
    for key, value in {"min_free_kbytes": 67584, "vfs_cache_pressure": 100, "watermark_boost_factor": 15000,
                       "drop_caches": 0, "compact_memory": 0}.items():
        (vm / key).write_text(f"{value}\n")
    write_meminfo(root, memtotal_kib, memfree_kib)
    (root / "run").mkdir()
    (root / "run/sshd.pid").write_text(f"{sshd_pid}\n")
    (root / f"proc/{sshd_pid}").mkdir()
    (root / f"proc/{sshd_pid}/oom_score_adj").write_text("0\n")


def write_meminfo(root: Path, memtotal_kib: int, memfree_kib: int, available_kib: int | None = None) -> None:
    """A host's /proc/meminfo under its prefix (MemAvailable defaults to MemFree)."""
    available = memfree_kib if available_kib is None else available_kib
    (root / "proc/meminfo").write_text(f"MemTotal:       {memtotal_kib} kB\nMemFree:        {memfree_kib} kB\n"
                                       f"MemAvailable:   {available} kB\n")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def free_port_probe(ns: str, address: str, port: int) -> bool:
    """Whether a TCP connection from namespace `ns` to address:port is accepted."""
    probe = (f"import socket,sys\ntry: socket.create_connection(({address!r}, {port}), timeout=2).close()\n"
             "except OSError: sys.exit(1)")
    result = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe], check=False, capture_output=True)
    return result.returncode == 0

