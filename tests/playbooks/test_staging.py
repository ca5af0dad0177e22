"""The image and the weights reach every node before any server starts: real ansible-playbook runs over
SSH against sandbox hosts, each with a real dockerd of its own (started in its namespace), node-to-node
copies over the sandbox's cluster link with the keys the transfer role sets up.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

from dsaops.image import image_name
from tests.playbooks.ansible_sandbox import folded, recap
from tests.support.dockerd import running
from tests.support.polling import wait_for
from tests.support.prerequisites import need

pytestmark = pytest.mark.timeout(900)
IMAGE = image_name("sm_121")
SHARDS = {"model-00001-of-00002.safetensors": 2 << 20, "model-00002-of-00002.safetensors": 1 << 20}


def docker(host: str, *args: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/docker", *args], env={**os.environ, "DOCKER_HOST": host}, input=stdin,
                          capture_output=True, check=check, timeout=120)


def image_id(host: str) -> str:
    out = docker(host, "image", "inspect", "--format", "{{.Id}}", IMAGE, check=False)
    return out.stdout.decode().strip() if out.returncode == 0 else ""


def held_names(host: str) -> list[str]:
    """The second names the role gives a node's build while a copy replaces it."""
    return docker(host, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "dsaops/held").stdout.decode().split()


def engine_arch(host: str) -> str:
    return docker(host, "version", "--format", "{{.Server.Arch}}").stdout.decode().strip()


def make_image(host: str, *layers: bytes | dict[str, bytes], arch: str | None = None, gzipped: bool = False) -> str:
    """An image of one file per layer (or the files a dict names) under the serving image's name (what `make image`
    would have tagged), built for `arch` (default: the engine's own), with a history entry per layer as a build writes
    them, loaded as `docker save` writes it (Debian's `docker import` ignores --platform); `gzipped`: each layer
    gzipped, as a containerd store keeps the layers of an image built or pulled into it."""
    def tar(files: dict[str, bytes]) -> bytes:
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as archive:
            for name, body in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(body)
                archive.addfile(info, io.BytesIO(body))
        return data.getvalue()

    tars = [tar(content if isinstance(content, dict) else {f"etc/dsaops-image-{i}": content})
            for i, content in enumerate(layers)]
    config = {"architecture": arch or engine_arch(host), "os": "linux", "config": {},
              "history": [{"created_by": f"layer {i}"} for i in range(len(tars))],
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]}}
    files = {f"layer-{i}.tar": gzip.compress(t, 1, mtime=0) if gzipped else t for i, t in enumerate(tars)}
    manifest = [{"Config": "config.json", "RepoTags": [IMAGE], "Layers": list(files)}]
    docker(host, "load", stdin=tar({**files, "config.json": json.dumps(config).encode(),
                                    "manifest.json": json.dumps(manifest).encode()}))
    return image_id(host)


def forget_image(*hosts: str) -> None:
    for host in hosts:
        docker(host, "rmi", "--force", IMAGE, check=False)


@contextlib.contextmanager
def small_disk(sandbox, node: str, mib: int):
    """An ext4 filesystem of `mib` MiB, mounted twice: here, where an engine runs, and in sandbox host `node`'s mount
    namespace, where the role reads its free space (one filesystem: one free count). Yields the mount point."""
    need(shutil.which("losetup") is not None and Path("/dev/loop-control").exists(),
         "loop devices (losetup) for a small filesystem under a Docker data root")
    with contextlib.ExitStack() as undo:
        # short: dockerd's sockets under it take at most 107 bytes
        folder = Path(tempfile.mkdtemp(prefix="dsaops-disk-"))
        undo.callback(shutil.rmtree, folder, ignore_errors=True)
        image, disk = folder / "disk.img", folder / "disk"
        disk.mkdir()
        with open(image, "wb") as f:
            f.truncate(mib << 20)
        subprocess.run(["mkfs.ext4", "-q", "-m", "0", "-O", "^has_journal", str(image)], check=True)
        loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True,
                              text=True).stdout.strip()
        undo.callback(subprocess.run, ["losetup", "--detach", loop], check=False)
        subprocess.run(["mount", loop, str(disk)], check=True)
        undo.callback(subprocess.run, ["umount", str(disk)], check=False)
        assert sandbox.ssh(node, f"mount {loop} {disk}").returncode == 0
        undo.callback(sandbox.ssh, node, f"umount {disk}")
        yield disk


@contextlib.contextmanager
def engine_on_a_small_disk(sandbox, node: str, mib: int):
    """A dockerd whose data root is on a small disk (small_disk); yields its DOCKER_HOST and the mount point."""
    with small_disk(sandbox, node, mib) as disk, running(disk / "engine") as engine:
        yield engine["DOCKER_HOST"], disk


def leave_free(disk: Path, mib: int) -> None:
    """A ballast file on `disk`'s filesystem that leaves about `mib` MiB free."""
    ballast = disk / "ballast"
    ballast.unlink(missing_ok=True)
    fs = os.statvfs(disk)
    with open(ballast, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, fs.f_bavail * fs.f_frsize - (mib << 20))


def leave_inodes(disk: Path, count: int) -> None:
    """Empty files on `disk`'s filesystem that leave about `count` inodes free (its bytes untouched)."""
    ballast = disk / "inode-ballast"
    shutil.rmtree(ballast, ignore_errors=True)
    ballast.mkdir()
    for i in range(os.statvfs(disk).f_favail - count):
        (ballast / str(i)).touch()


def fake_checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"architectures": ["Glm5NextForConditionalGeneration"]}\n')
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}\n')
    for name, size in SHARDS.items():
        (folder / name).write_bytes(os.urandom(size))
    (folder / ".cache/huggingface").mkdir(parents=True)          # hf download's bookkeeping: not copied
    (folder / ".cache/huggingface/download.lock").write_text("x")
    return folder


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _ok(result):
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return recap(result.stdout)


def _stopped(result) -> str:
    """A run that failed, as one line of its output."""
    assert result.returncode != 0, result.stdout[-6000:]
    return folded(result.stdout)


def test_image_and_weights_are_copied_once_and_a_corrupt_shard_again(sandbox, cluster, node_engines, dockerd, tmp_path):
    write, roots = cluster
    forget_image(*node_engines.values(), dockerd["DOCKER_HOST"])
    built = make_image(node_engines["node1"], b"built on node1\n")
    # The controller's engine has the same image (as when the deploy runs on the node that built it):
    # the copy still goes from that node, across the cluster link, not over the controller's connection.
    docker(dockerd["DOCKER_HOST"], "load", stdin=docker(node_engines["node1"], "save", IMAGE).stdout)
    model = fake_checkpoint(roots["node1"] / "srv/models/tiny-glm")
    linked = model / "model-00002-of-00002.safetensors"   # as in a Hugging Face cache snapshot: a link to its blob
    blob = roots["node1"] / "srv/blobs/0002"
    blob.parent.mkdir(parents=True)
    linked.rename(blob)
    linked.symlink_to(blob)
    inventory = write(cluster_vars={"dsaops_stage": True, "dsaops_model_path": str(model)},
                      node1={"dsaops_docker_host": node_engines["node1"]},
                      node2={"dsaops_docker_host": node_engines["node2"]})
    controller = {"DOCKER_HOST": dockerd["DOCKER_HOST"]}
    copy = roots["node2"] / "var/lib/dsaops/models/tiny-glm"
    # node2 authorizes an admin's key of its own, and the key of a node9 an earlier inventory held
    authorized = roots["node2"] / "root/.ssh/authorized_keys"
    authorized.parent.mkdir(parents=True)
    admin = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAdminKeyOfTheNode admin@workstation"
    authorized.write_text(f'{admin}\nfrom="10.0.0.99",restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGone dsaops '
                          'transfer from node9\n')
    # node1, the source of both copies, still authorizes node2's key, as every node once authorized every other's
    authorized_on_node1 = roots["node1"] / "root/.ssh/authorized_keys"
    authorized_on_node1.parent.mkdir(parents=True)
    authorized_on_node1.write_text('from="10.0.0.98",restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld dsaops transfer '
                                   'from node2\n')

    checked = sandbox.playbook(inventory, tmp_path / "run-check", "--tags", "image,weights", "--check", env=controller)
    _ok(checked)
    assert "node2: lacks " + IMAGE in folded(checked.stdout) and "would copy" in checked.stdout
    assert image_id(node_engines["node2"]) == "" and not copy.exists()

    first = sandbox.playbook(inventory, tmp_path / "run-1", "--tags", "image,weights", env=controller)
    changed = _ok(first)
    assert changed["node2"]["changed"] > 0
    assert image_id(node_engines["node2"]) == built                           # docker save | docker load, same ID
    assert "changed: [node2 -> node1(" in first.stdout                         # from node1, over the cluster link
    assert {p.name for p in copy.iterdir()} == {"config.json", "model.safetensors.index.json", *SHARDS}   # no .cache
    assert all(digest(copy / name) == digest(model / name) for name in SHARDS)
    assert not (copy / linked.name).is_symlink()                            # the blob's bytes, not a dangling link
    log = roots["node1"] / "var/log/dsaops/weights-to-node2.log"
    assert "Number of regular files transferred: 4" in log.read_text()
    keys = authorized.read_text()
    gate = roots["node2"] / "etc/dsaops/transfer/gate"
    assert f'from="{sandbox.hosts["node1"]["address"]}",restrict,command="{gate} weights" ssh-ed25519 ' in keys
    assert keys.rstrip().endswith("dsaops transfer from node1")
    assert keys.splitlines()[0] == admin and "node9" not in keys          # the node gone from the inventory

    # node1's key, from node1, runs the weights copy's command on node2 and nothing else: no shell, no pull, no other
    # folder, and no docker load once the image copy is through
    transfer = roots["node1"] / "etc/dsaops/transfer"
    key = (f"ssh -F none -i {transfer}/id_ed25519 -o UserKnownHostsFile={transfer}/known_hosts "
           "-o StrictHostKeyChecking=yes -o BatchMode=yes -l root")
    node2 = sandbox.hosts["node2"]["address"]
    owned = tmp_path / "owned"
    shell = sandbox.ssh("node1", f"{key} {node2} 'touch {owned}'")
    assert shell.returncode == 2 and f"refused 'touch {owned}': another node's transfer key runs" in shell.stderr
    assert not owned.exists()
    pull = sandbox.ssh("node1", f"rsync -r --rsh='{key}' {node2}:{roots['node2']}/root/.ssh/ {tmp_path}/pulled/")
    assert pull.returncode != 0 and "rsync --sender: only rsync's receiver runs here" in pull.stderr
    elsewhere = sandbox.ssh("node1", f"rsync -r --rsh='{key}' {model}/config.json {node2}:{roots['node2']}/root/.ssh/")
    assert elsewhere.returncode != 0 and "rsync writes only into" in elsewhere.stderr
    assert sorted(p.name for p in (roots["node2"] / "root/.ssh").iterdir()) == ["authorized_keys"]
    loads = sandbox.ssh("node1", f"{key} {node2} 'docker load'")
    assert loads.returncode == 2 and "authorized here for the copies its authorized_keys line names (weights), not the " \
                                     "image copy" in loads.stderr, loads
    # node2 copies to no node: its key gets into none
    assert authorized_on_node1.read_text() == ""
    transfer2 = roots["node2"] / "etc/dsaops/transfer"
    key2 = key.replace(str(transfer), str(transfer2))
    into_node1 = sandbox.ssh("node2", f"{key2} {sandbox.hosts['node1']['address']} 'docker load'")
    assert into_node1.returncode == 255 and "Permission denied" in into_node1.stderr, into_node1

    assert "node2: 4 of 4 file(s) hashed against the manifest." in folded(first.stdout)

    again = sandbox.playbook(inventory, tmp_path / "run-2", "--tags", "image,weights", env=controller)
    assert all(host["changed"] == 0 for host in _ok(again).values()), recap(again.stdout)
    assert "Number of regular files transferred: 0" in log.read_text()        # the second run copies nothing
    assert "node2: 0 of 4 file(s) hashed against the manifest; the others are unchanged" in folded(again.stdout)

    # A bit flip that keeps the size and the time: rsync's quick check misses it, the manifest does not.
    shard = copy / "model-00001-of-00002.safetensors"
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[12345] ^= 0x01
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    third = sandbox.playbook(inventory, tmp_path / "run-3", "--tags", "weights", env=controller)
    _ok(third)
    assert "Number of regular files transferred: 0" in log.read_text()
    said = folded(third.stdout)
    assert "node2: 1 of 4 file(s) hashed against the manifest;" in said      # the write moved its change time
    assert "node2: 1 file(s) differed from the manifest and were copied again: model-00001-of-00002.safetensors" in said
    assert digest(shard) == digest(model / "model-00001-of-00002.safetensors")

    # The image only on node2: node1 lets node2's key in for that copy alone
    forget_image(node_engines["node1"])
    fourth = sandbox.playbook(inventory, tmp_path / "run-4", "--tags", "image", env=controller)
    assert _ok(fourth)["node1"]["changed"] > 0
    assert "changed: [node1 -> node2(" in fourth.stdout and image_id(node_engines["node1"]) == built
    assert authorized_on_node1.read_text() == ""
    assert authorized.read_text().rstrip().endswith("dsaops transfer from node1")   # the weights source's stays


def test_the_image_comes_from_the_controller_or_the_run_stops_naming_both_ways(sandbox, cluster, node_engines,
                                                                                dockerd, tmp_path):
    write, _ = cluster
    forget_image(*node_engines.values(), dockerd["DOCKER_HOST"])
    engines = {"node1": {"dsaops_docker_host": node_engines["node1"]},
               "node2": {"dsaops_docker_host": node_engines["node2"]}}
    controller = {"DOCKER_HOST": dockerd["DOCKER_HOST"]}

    # Nothing anywhere, a registry that does not answer: the run stops before any server, naming both ways.
    stopped = sandbox.playbook(write(cluster_vars={"dsaops_stage": True, "dsaops_image_registry": "127.0.0.1:1"},
                                     **engines), tmp_path / "run-none", "--tags", "image", env=controller)
    text = _stopped(stopped)
    assert f"127.0.0.1:1/{IMAGE} is on no node, not in this controller's Docker engine, and pulling it from 127.0.0.1:1 failed" in text
    assert "build it on one node (or here) with `make image ARCH=sm_121`" in text
    assert "`make image ARCH=sm_121 REGISTRY=HOST:PORT PUSH=1`" in text and "DSAOPS_REGISTRY" in text

    # Built where the controller runs: both nodes get that image, over Ansible's own SSH to each.
    built = make_image(dockerd["DOCKER_HOST"], b"built on the controller\n")
    copied = sandbox.playbook(write(cluster_vars={"dsaops_stage": True}, **engines), tmp_path / "run-controller",
                              "--tags", "image", env=controller)
    assert all(_ok(copied)[h]["changed"] > 0 for h in ("node1", "node2"))
    assert image_id(node_engines["node1"]) == image_id(node_engines["node2"]) == built

    # Ansible's way in given by the ssh aliases and ansible.cfg's key (its ANSIBLE_PRIVATE_KEY_FILE): the copy's own
    # ssh takes them too (without them it offers no key the nodes accept, and the copy fails)
    forget_image(*node_engines.values())
    aliased = write(cluster_vars={"dsaops_stage": True}, **engines)
    inventory = yaml.safe_load(aliased.read_text())
    key = None
    for group in inventory["all"]["children"]["dsaops_cluster"]["children"].values():
        for host in group["hosts"].values():
            key = host.pop("ansible_ssh_private_key_file")
            host["ansible_ssh_user"], host["ansible_ssh_host"] = host.pop("ansible_user"), host.pop("ansible_host")
    aliased.write_text(yaml.safe_dump(inventory))
    copied = sandbox.playbook(aliased, tmp_path / "run-aliases", "--tags", "image",
                              env=controller | {"ANSIBLE_PRIVATE_KEY_FILE": key})
    assert all(_ok(copied)[h]["changed"] > 0 for h in ("node1", "node2")), copied.stdout[-3000:]
    assert image_id(node_engines["node1"]) == image_id(node_engines["node2"]) == built

    # The key given in ansible.cfg's ssh_args (its ANSIBLE_SSH_ARGS), which Ansible's ssh puts first: the copy's too
    forget_image(*node_engines.values())
    copied = sandbox.playbook(aliased, tmp_path / "run-ssh-args", "--tags", "image",
                              env=controller | {"ANSIBLE_SSH_ARGS": f"-C -o ControlMaster=auto -o IdentityFile={key}"})
    assert all(_ok(copied)[h]["changed"] > 0 for h in ("node1", "node2")), copied.stdout[-3000:]
    assert image_id(node_engines["node1"]) == image_id(node_engines["node2"]) == built


def test_an_image_built_for_another_cpu_is_refused_before_it_replaces_the_nodes_one(sandbox, cluster, node_engines,
                                                                                    dockerd, tmp_path):
    """The nodes hold the serving image; the controller holds one under the same name built for the other CPU (as
    sm_121's stand-in build on an amd64 workstation is). docker load would take it without a word and the server
    would fail at its start, so the run stops naming both architectures, and the nodes keep their image."""
    write, _ = cluster
    forget_image(*node_engines.values(), dockerd["DOCKER_HOST"])
    served = make_image(node_engines["node1"], b"built on node1\n")
    docker(node_engines["node2"], "load", stdin=docker(node_engines["node1"], "save", IMAGE).stdout)
    arch = engine_arch(node_engines["node1"])
    other = {"amd64": "arm64", "arm64": "amd64"}[arch]
    foreign = make_image(dockerd["DOCKER_HOST"], b"built for the other CPU\n", arch=other)
    inventory = write(cluster_vars={"dsaops_stage": True}, node1={"dsaops_docker_host": node_engines["node1"]},
                      node2={"dsaops_docker_host": node_engines["node2"]})

    stopped = sandbox.playbook(inventory, tmp_path / "run", "--tags", "image", env={"DOCKER_HOST": dockerd["DOCKER_HOST"]})
    text = _stopped(stopped)
    for node in ("node1", "node2"):
        assert (f"{node}: {IMAGE} ({foreign[:19]} on this controller) is built for {other}, but the node's Docker runs "
                f"{arch}: loaded there, the server would not start (exec format error). Build it for {arch} "
                f"(`make image ARCH=sm_121` on an {arch} host) and remove the other one from this controller") in text
    assert image_id(node_engines["node1"]) == image_id(node_engines["node2"]) == served


@pytest.fixture(scope="module")
def containerd_engines(tmp_path_factory):
    """A dockerd for each serving host that keeps its images in containerd (tests/support/containerd_docker.py):
    {host: its DOCKER_HOST}."""
    from tests.support.containerd_docker import MIRROR, bin_dirs

    try:
        bin_dirs()
    except (OSError, LookupError) as e:
        need(False, f"Debian 13's docker.io and containerd from {MIRROR} ({e})")
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(running(tmp_path_factory.mktemp(f"c8d-{name}"), containerd_store=True))[
            "DOCKER_HOST"] for name in ("node1", "node2")}


def test_the_containerd_engines_packages_are_taken_under_debians_signature():
    """Their index is taken by the sha256 in Debian 13's InRelease, whose signature gpgv checks: an InRelease
    changed by one byte is refused."""
    from tests.support.containerd_docker import MIRROR, fetch, release

    try:
        signed = fetch(f"{MIRROR}/dists/trixie/InRelease")
    except OSError as e:
        need(False, f"Debian 13's InRelease from {MIRROR} ({e})")
    assert "\nCodename: trixie\n" in release(signed)
    with pytest.raises(OSError, match="InRelease is not signed by a key of /usr/share/keyrings/"):
        release(signed.replace(b"\nCodename: trixie\n", b"\nCodename: trixiE\n", 1))


def test_an_image_goes_between_engines_that_keep_images_alike_and_stops_across_stores(sandbox, cluster, node_engines,
                                                                                      containerd_engines, dockerd,
                                                                                      tmp_path):
    """Docker's containerd image store (the default of a fresh Docker 29) names an image by its manifest's digest,
    Docker's own store by its config's. Between two nodes that keep images in containerd, node1's build reaches node2
    under its ID. From the controller, whose Docker keeps images in its own store, to node2 in containerd, the run stops
    before any copy naming both stores; node1, whose store is the controller's, gets nothing either."""
    write, _ = cluster
    c8d = containerd_engines
    forget_image(*c8d.values(), node_engines["node1"], dockerd["DOCKER_HOST"])
    built = make_image(c8d["node1"], b"built into containerd\n")
    inventory = write(cluster_vars={"dsaops_stage": True, "image_source": "node1"},
                      node1={"dsaops_docker_host": c8d["node1"]}, node2={"dsaops_docker_host": c8d["node2"]})
    copied = sandbox.playbook(inventory, tmp_path / "run-containerd", "--tags", "image")
    assert _ok(copied)["node2"]["changed"] > 0
    assert image_id(c8d["node2"]) == built

    forget_image(c8d["node2"])
    controller = dockerd["DOCKER_HOST"]
    make_image(controller, b"built on the controller\n")
    inventory = write(cluster_vars={"dsaops_stage": True, "image_source": "controller"},
                      node1={"dsaops_docker_host": node_engines["node1"]}, node2={"dsaops_docker_host": c8d["node2"]})
    stopped = sandbox.playbook(inventory, tmp_path / "run-across", "--tags", "image", env={"DOCKER_HOST": controller})
    text = _stopped(stopped)
    assert (f"node2: its Docker keeps images in containerd, and this controller's in its own store: copied there, "
            f"{IMAGE} would arrive under another ID") in text, text[-3000:]
    assert "nothing was copied to any node" in text and '"containerd-snapshotter"' in text
    assert "node1: its Docker keeps" not in text
    assert image_id(node_engines["node1"]) == image_id(c8d["node2"]) == ""


def test_an_image_that_does_not_fit_a_node_is_refused_before_any_copy(sandbox, cluster, node_engines, dockerd,
                                                                       tmp_path):
    """The controller holds the image; node1 lacks it; node2's Docker data root sits on a 96 MiB filesystem and holds an
    older build: the same 16 MiB base layer, a top of its own. docker load spools the new build's whole archive (32 MiB)
    under the data root before it extracts the top node2 lacks (16 MiB): 48 MiB. With 40 MiB free the run stops naming
    both sizes, in --check too, before either node gets a copy (docker load itself fails there). With 56 MiB free, less
    than twice the image, both get it."""
    write, _ = cluster
    controller = dockerd["DOCKER_HOST"]
    forget_image(node_engines["node1"], controller)
    base = os.urandom(16 << 20)
    built = make_image(controller, base, os.urandom(16 << 20))
    with engine_on_a_small_disk(sandbox, "node2", 96) as (engine, disk):
        older = make_image(engine, base, b"an older build\n")
        inventory = write(cluster_vars={"dsaops_stage": True, "image_source": "controller"},
                          node1={"dsaops_docker_host": node_engines["node1"]}, node2={"dsaops_docker_host": engine})
        leave_free(disk, 40)
        for run, args in (("run-check", ("--check",)), ("run-full", ())):
            refused = sandbox.playbook(inventory, tmp_path / run, "--tags", "image", *args, env={"DOCKER_HOST": controller})
            text = _stopped(refused)
            assert re.search(rf"node2: loading {re.escape(IMAGE)} \({built[:19]}\) needs 48\.00 MB under Docker's data "
                             rf"root {disk}/engine/data \(its whole archive, then the layers the node lacks\), whose "
                             r"filesystem has (39|40)\.\d\d MB free; nothing was copied to any node\. Free that much there",
                             text), text[-3000:]
            assert "`docker image prune`" in text and "move Docker's data-root" in text
            assert (image_id(node_engines["node1"]), image_id(engine)) == ("", older)
        loaded = docker(engine, "load", stdin=docker(controller, "save", IMAGE).stdout, check=False)
        assert loaded.returncode != 0 and b"no space left on device" in loaded.stderr
        assert image_id(engine) == older

        leave_free(disk, 56)
        copied = sandbox.playbook(inventory, tmp_path / "run-room", "--tags", "image", env={"DOCKER_HOST": controller})
        assert all(_ok(copied)[node]["changed"] > 0 for node in ("node1", "node2"))
        assert image_id(node_engines["node1"]) == image_id(engine) == built


@contextlib.contextmanager
def containerd_node2(sandbox, cluster, source: str, mib: int, base: bytes, top: bytes | dict[str, bytes]):
    """node2's Docker keeping its images in the system's containerd (as Docker's packages set it up), whose root
    /etc/containerd/config.toml puts on a `mib` MiB filesystem (small_disk), holding an older build on `base`; node1's
    engine (`source`) builds `base` topped by `top`, both gzipped, and is the copies' source. Yields node2's
    DOCKER_HOST, the mount point, the inventory, the build's ID and the older build's."""
    write, roots = cluster
    forget_image(source)
    built = make_image(source, base, top, gzipped=True)
    with small_disk(sandbox, "node2", mib) as disk, \
            running(Path(tempfile.mkdtemp(prefix="dsaops-c8d-")), containerd_store=True,
                    containerd_root=disk / "containerd") as engine:
        host = engine["DOCKER_HOST"]
        older = make_image(host, base, b"an older build\n", gzipped=True)
        config = roots["node2"] / "etc/containerd/config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'version = 2\nroot = "{disk}/containerd"\n')
        yield host, disk, write(cluster_vars={"dsaops_stage": True, "image_source": "node1"},
                                node1={"dsaops_docker_host": source}, node2={"dsaops_docker_host": host}), built, older


def test_an_image_that_does_not_fit_containerds_root_is_refused_there(sandbox, cluster, containerd_engines, tmp_path):
    """node2's Docker keeps its images in the system's containerd (as Docker's packages set it up), whose root
    /etc/containerd/config.toml puts on a 160 MiB filesystem; Docker's data root is elsewhere, with room. node2 holds an
    older build (the same 16 MiB base layer). node1's build tops it with 64 MiB of zeros, both layers gzipped: 16 MiB of
    blobs (its .Size), 80 MiB unpacked. A load writes every blob, then the top unpacked: counted 80 MiB. With 40 MiB
    free under containerd's root (more than twice .Size) docker load itself fails, and the run stops naming that root
    and containerd's config (weighing Docker's data root instead, with room, it would copy); with 88 MiB node2 gets
    it (the base counted lacking, 96 MiB, would refuse it)."""
    source = containerd_engines["node1"]
    base = os.urandom(16 << 20)
    with containerd_node2(sandbox, cluster, source, 160, base, bytes(64 << 20)) as (host, disk, inventory, built, older):
        leave_free(disk, 40)
        # docker load itself fails there, and still moves the tag to the new image, unpacked only in part, and
        # deletes the older build: node2 gets it back only by building it again. It fails for want of room, or
        # sooner: the deletion lets containerd's collector take the base both builds share before the top is
        # unpacked on it (the race the role closes by holding the older build under a second name)
        loaded = docker(host, "load", stdin=docker(source, "save", IMAGE).stdout, check=False)
        assert loaded.returncode != 0 and re.search(rb"no space left on device|parent snapshot \S+ does not exist",
                                                    loaded.stderr), loaded.stderr
        assert image_id(host) == built
        assert docker(host, "image", "inspect", older, check=False).returncode != 0
        docker(host, "image", "rm", IMAGE)
        assert make_image(host, base, b"an older build\n", gzipped=True) == older
        leave_free(disk, 40)

        refused = sandbox.playbook(inventory, tmp_path / "run-full", "--tags", "image")
        text = _stopped(refused)
        assert re.search(rf"node2: loading {re.escape(IMAGE)} \({built[:19]}\) needs 80\.\d\d MB under containerd's root "
                         rf"{disk}/containerd, where Docker keeps its images \(every layer as the archive carries it, "
                         r"then those the node lacks unpacked\), whose filesystem has (39|40)\.\d\d MB free; nothing "
                         r"was copied", text), text[-3000:]
        assert "move containerd's root (`root` in /etc/containerd/config.toml)" in text
        assert image_id(host) == older

        leave_free(disk, 88)
        copied = sandbox.playbook(inventory, tmp_path / "run-room", "--tags", "image")
        assert _ok(copied)["node2"]["changed"] > 0
        assert image_id(host) == built
        assert docker(host, "image", "inspect", older, check=False).returncode != 0
        assert held_names(host) == []


def test_a_load_into_containerd_that_fails_leaves_the_nodes_build_under_the_name(sandbox, cluster, containerd_engines,
                                                                                  tmp_path):
    """node2's Docker keeps its images in containerd, on a filesystem with bytes to spare but about 100 inodes left;
    node1's build tops the base node2 holds with 400 empty files. The copy fits by its bytes, so it starts, and docker
    load fails unpacking the top, after it has moved the name (the test above shows it). The run stops naming the node
    and docker's error, and the node keeps its build under the name; with inodes to spare the copy goes through and
    the second name is gone."""
    many = {f"etc/dsaops-many/{i}": b"" for i in range(400)}
    with containerd_node2(sandbox, cluster, containerd_engines["node1"], 64, os.urandom(1 << 20), many) as (
            host, disk, inventory, built, older):
        leave_inodes(disk, 100)
        failed = sandbox.playbook(inventory, tmp_path / "run-inodes", "--tags", "image")
        text = _stopped(failed)
        assert re.search(rf"node2: copying {re.escape(IMAGE)} \({built[:19]}\) from node1 failed \([^)]*no space left on "
                         rf"device[^)]*\); the node keeps its build {older[:19]} under that name", text), text[-3000:]
        assert image_id(host) == older
        assert held_names(host) == []

        shutil.rmtree(disk / "inode-ballast")
        copied = sandbox.playbook(inventory, tmp_path / "run-room", "--tags", "image")
        assert _ok(copied)["node2"]["changed"] > 0
        assert image_id(host) == built
        assert held_names(host) == []


def test_weights_to_download_without_a_downloader_stop_with_the_ways_out(sandbox, cluster, tmp_path):
    """A Hugging Face id, nothing staged yet, and neither `hf` nor `huggingface-cli` on the source node."""
    write, roots = cluster
    inventory = write(cluster_vars={"dsaops_stage": True, "dsaops_model_path": "zai-org/GLM-5.3-Flash"})
    result = sandbox.playbook(inventory, tmp_path / "run", "--tags", "weights")
    text = _stopped(result)
    assert ("node1: the weights of zai-org/GLM-5.3-Flash are not staged yet and neither `hf` nor `huggingface-cli` "
            "is on root's PATH there to download them") in text
    assert "set weights_hf_cli to its path" in text
    assert "set dsaops_model_path to that folder" in text and "dsaops_weights_stage: false" in text
    assert not (roots["node2"] / "var/lib/dsaops/models/GLM-5.3-Flash").exists()


def test_a_download_that_does_not_fit_stops_before_a_file_is_fetched(sandbox, cluster, tmp_path):
    """node1 downloads a Hugging Face id at a revision with this environment's `hf` (weights_hf_cli: not on root's
    PATH) from a stand-in Hub (weights_hf_endpoint) that demands the token. Into a 1 MiB filesystem the run stops with
    both numbers, the Hub having answered only the sizing; with room the files arrive with the token from its file,
    and node2 gets its copy. Run again at that revision, nothing is downloaded; at a new one, what changed is
    downloaded and copied, and a file it dropped is removed on both nodes."""
    write, roots = cluster
    repo = tmp_path / "hub"
    (repo / "original").mkdir(parents=True)
    (repo / "config.json").write_text('{"architectures": ["Glm5NextForConditionalGeneration"]}\n')
    (repo / "original/params.json").write_text("{}\n")
    for name, size in SHARDS.items():
        (repo / name).write_bytes(os.urandom(size))
    token = f"hf_{os.urandom(8).hex()}"
    address = sandbox.hosts["node1"]["address"].rsplit(".", 1)[0] + ".1"    # the controller's, on the cluster link
    asked = tmp_path / "hub.log"
    with open(asked, "w") as log:
        hub = subprocess.Popen(["ip", "netns", "exec", sandbox.ctl, sys.executable, "-m", "tests.playbooks.standin_hub",
                                "--repo", "org/tiny-glm", "--folder", str(repo), "--token", token, "--bind", address],
                               stdout=log, cwd=Path(__file__).resolve().parents[2])
    assert wait_for(lambda: asked.read_text().strip(), timeout=20)
    def inventory_at(revision: str) -> Path:
        return write(cluster_vars={"dsaops_stage": True, "dsaops_model_path": "org/tiny-glm",
                                   "dsaops_model_revision": revision},
                     node1={"weights_hf_cli": str(Path(sys.executable).parent / "hf"),
                            "weights_hf_endpoint": f"http://{address}:{asked.read_text().split()[0]}"})

    inventory = inventory_at("v1")
    models = roots["node1"] / "var/lib/dsaops/models"
    models.mkdir(parents=True)
    assert sandbox.ssh("node1", f"mount -t tmpfs -o size=1m tmpfs {models}").returncode == 0
    try:
        # The wrong token: the Hub refuses the sizing, the run says so, and the download stops on its own 401.
        refused = sandbox.playbook(inventory, tmp_path / "run-401", "--tags", "weights", env={"HF_TOKEN": "hf_wrong"})
        text = _stopped(refused)
        assert re.search(r"node1: the Hub gave no sizes for org/tiny-glm \(\w+Error: [^)]*401[^)]*\), so the download "
                         r"goes ahead without weighing it against the free space, and files an earlier revision had are kept\.",
                         text), text[-3000:]
        assert "/resolve/" not in asked.read_text()

        full = sandbox.playbook(inventory, tmp_path / "run-full", "--tags", "weights", env={"HF_TOKEN": token})
        text = _stopped(full)
        assert re.search(r"node1: the download of org/tiny-glm needs 3\.\d\d MB more in \S+/var/lib/dsaops/models/"
                         r"tiny-glm, whose filesystem has 1\.00 MB free; nothing was downloaded\. Free that much "
                         r"there, or set dsaops_weights_dir to a folder on a larger disk\.", text), text[-3000:]
        assert "/resolve/" not in asked.read_text()
        assert sandbox.ssh("node1", f"find {models} -type f").stdout == ""

        assert sandbox.ssh("node1", f"mount -o remount,size=8m {models}").returncode == 0
        _ok(sandbox.playbook(inventory, tmp_path / "run-room", "--tags", "weights", env={"HF_TOKEN": token}))

        def copies_hold_the_hub_files() -> None:
            for node in ("node1", "node2"):
                folder = f"{roots[node]}/var/lib/dsaops/models/tiny-glm"
                listed = sandbox.ssh(node, f"cd {folder} && sha256sum {' '.join(SHARDS)} && find . -path ./.cache -prune "
                                           "-o -type f -print")
                assert all(f"{digest(repo / name)}  {name}" in listed.stdout for name in SHARDS), (node, listed)
                held = {line[2:] for line in listed.stdout.splitlines() if line.startswith("./")}
                hub = {str(path.relative_to(repo)) for path in repo.rglob("*") if path.is_file()}
                assert held == hub, (node, held, hub)

        copies_hold_the_hub_files()
        assert "GET /api/models/org/tiny-glm/revision/v1" in asked.read_text()   # the sizing and the download's
        manifest = roots["node1"] / "var/lib/dsaops/manifests/tiny-glm.json"
        assert json.loads(manifest.read_text())["revision"] == "v1"

        fetched = asked.read_text().count("\n")
        _ok(sandbox.playbook(inventory, tmp_path / "run-same", "--tags", "weights", env={"HF_TOKEN": token}))
        assert asked.read_text().count("\n") == fetched                          # staged at v1: the Hub is not asked

        shard = repo / "model-00002-of-00002.safetensors"
        shard.write_bytes(os.urandom(SHARDS[shard.name]))                       # v2 changes a shard
        shutil.rmtree(repo / "original")                                         # and drops a folder's file
        _ok(sandbox.playbook(inventory_at("v2"), tmp_path / "run-v2", "--tags", "weights", env={"HF_TOKEN": token}))
        said = asked.read_text().splitlines()[fetched:]
        assert any(line.startswith("GET /api/models/org/tiny-glm/revision/v2") for line in said)
        downloaded = [line for line in said if line.startswith("GET") and "/resolve/" in line]
        assert len(downloaded) == 1 and downloaded[0].endswith("/" + shard.name), said   # only what v2 changed
        copies_hold_the_hub_files()
        assert json.loads(manifest.read_text())["revision"] == "v2"
    finally:
        hub.terminate()
        hub.wait()
        sandbox.ssh("node1", f"umount {models}")


def test_weights_that_do_not_fit_are_refused_before_any_copy(sandbox, cluster, tmp_path):
    """node2's weights folder sits on a 1 MiB filesystem (a tmpfs in its sshd's mount namespace, where the copies
    land): the run stops with both numbers before rsync writes a byte, and leaves no manifest there that would
    say the copy is whole. With room made, the next run copies everything and writes the manifest last."""
    write, roots = cluster
    model = fake_checkpoint(roots["node1"] / "srv/models/tiny-glm")
    inventory = write(cluster_vars={"dsaops_stage": True, "dsaops_model_path": str(model)})
    models = roots["node2"] / "var/lib/dsaops/models"
    models.mkdir(parents=True)
    manifest = roots["node2"] / "var/lib/dsaops/manifests/tiny-glm.json"

    def on_node2(command: str) -> subprocess.CompletedProcess:   # its sshd's mount namespace holds the tmpfs
        return sandbox.ssh("node2", command)

    assert on_node2(f"mount -t tmpfs -o size=1m tmpfs {models}").returncode == 0
    try:
        full = sandbox.playbook(inventory, tmp_path / "run-full", "--tags", "weights")
        text = _stopped(full)
        assert re.search(r"node2: the weights need 3\.\d\d MB more in /var/lib/dsaops/models/tiny-glm, whose "
                         r"filesystem has 1\.00 MB free; nothing was copied\. Free that much there, or set "
                         r"dsaops_weights_dir to a folder on a larger disk\.", text), text[-3000:]
        assert on_node2(f"find {models} -type f").stdout == ""
        assert not manifest.exists()

        # Room, but read-only: rsync's own reason, which went only to its log, is in `dsaops deploy`'s failure line.
        assert on_node2(f"mount -o remount,ro,size=8m {models}").returncode == 0
        stopped = sandbox.run([sys.executable, "-m", "dsaops", "deploy", "-i", str(inventory), "--tags", "weights"],
                              tmp_path / "run-ro")
        failed = [line for line in stopped.stderr.splitlines() if "FAILED" in line]
        assert stopped.returncode == 1 and len(failed) == 1, stopped.stderr[-3000:]
        assert "node2: The copy went through: node2: rsync from node1 stopped (exit 23): rsync: [" in failed[0]
        assert "Read-only file system (30)" in failed[0] and "weights-to-node2.log on node1" in failed[0]
        assert not manifest.exists()

        assert on_node2(f"mount -o remount,rw {models}").returncode == 0
        _ok(sandbox.playbook(inventory, tmp_path / "run-room", "--tags", "weights"))
        listed = on_node2(f"cd {models}/tiny-glm && sha256sum {' '.join(SHARDS)}").stdout
        assert all(f"{digest(model / name)}  {name}" in listed for name in SHARDS)
        assert json.loads(manifest.read_text()) == json.loads(
            (roots["node1"] / "var/lib/dsaops/manifests/tiny-glm.json").read_text())

        # A shard retrained at its size: rsync writes the new one beside the old, so half a MiB free is too little.
        shard = model / "model-00002-of-00002.safetensors"
        shard.write_bytes(os.urandom(SHARDS[shard.name]))
        assert on_node2(f"mount -o remount,size=$(( $(df --output=used -k {models} | tail -1) + 512 ))k {models}"
                        ).returncode == 0
        tight = sandbox.playbook(inventory, tmp_path / "run-tight", "--tags", "weights")
        assert tight.returncode != 0
        assert re.search(r"node2: the weights need 1\.00 MB more in /var/lib/dsaops/models/tiny-glm, whose filesystem "
                         r"has \d+\.\d\d KB free; nothing was copied\.", folded(tight.stdout)), tight.stdout[-3000:]
        assert on_node2(f"mount -o remount,size=8m {models}").returncode == 0
        _ok(sandbox.playbook(inventory, tmp_path / "run-changed", "--tags", "weights"))
        assert f"{digest(shard)}  {shard.name}" in on_node2(f"cd {models}/tiny-glm && sha256sum {shard.name}").stdout
    finally:
        on_node2(f"umount {models}")
