"""The transfer gate (playbooks/roles/transfer/files/gate.sh), the one command another node's transfer key runs:
real rsync copies through it, with a stand-in for sshd's forced command (SSH_ORIGINAL_COMMAND set to what the
client asked, the gate run instead, with the copies the key's line names), and every other request, or a copy
the line does not name, refused in one line, exit 2, with nothing written.
Over a real sshd and the authorized_keys line the transfer role writes: test_staging.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.prerequisites import need

GATE = Path(__file__).parents[2] / "playbooks/roles/transfer/files/gate.sh"
COPY = ["--recursive", "--times", "--copy-links", "--partial", "--partial-dir=.rsync-partial", "--stats"]  # weights/copy.yml


@pytest.fixture
def node(tmp_path):
    """A receiving node's gate, its gate.conf, an empty weights folder, and an rsh that runs the gate as sshd does."""
    need(shutil.which("rsync") is not None, "rsync copies the weights")
    gate_dir = tmp_path / "transfer"
    gate_dir.mkdir()
    shutil.copy(GATE, gate_dir / "gate")
    weights = tmp_path / "models/tiny-glm"
    weights.mkdir(parents=True)
    (gate_dir / "gate.conf").write_text(f"weights={weights}\ndocker_host=unix://{tmp_path}/no-engine.sock\n")
    rsh = forced_command(tmp_path / "forced-command", gate_dir / "gate", "weights")   # the weights source's line
    source = tmp_path / "source"
    source.mkdir()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs/abc").write_bytes(os.urandom(4096))
    (source / "model-00001-of-00001.safetensors").symlink_to(tmp_path / "blobs/abc")   # a Hugging Face cache snapshot
    (source / "config.json").write_text("{}\n")
    (source / "original").mkdir()
    (source / "original/params.json").write_text("{}\n")
    return {"gate": gate_dir / "gate", "weights": weights, "rsh": rsh, "source": source, "tmp": tmp_path}


def forced_command(rsh: Path, gate: Path, *copies: str) -> Path:
    """An rsh that runs the gate as sshd runs an authorized_keys line's command="<gate> <copies>"."""
    rsh.write_text(f'#!/bin/sh\nshift\nSSH_ORIGINAL_COMMAND="$*" exec /bin/sh {gate} {" ".join(copies)}\n')
    rsh.chmod(0o755)
    return rsh


def rsync(node, *args: str, stdin: str | None = None, rsh: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["rsync", f"--rsh={rsh or node['rsh']}", *args], check=False, input=stdin, capture_output=True,
                          text=True, timeout=60)


def through_gate(node, command: str, *copies: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", str(node["gate"]), *copies], check=False,
                          env={**os.environ, "SSH_ORIGINAL_COMMAND": command}, capture_output=True, text=True, timeout=60)


def refused(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("dsaops transfer gate on ")]
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    return lines[0]


def test_the_weights_copies_go_through_and_links_arrive_as_files(node):
    dest = f"x:{node['weights']}/"
    first = rsync(node, *COPY, "--exclude=.*", f"{node['source']}/", dest)
    assert first.returncode == 0, first.stderr
    copied = node["weights"] / "model-00001-of-00001.safetensors"
    assert not copied.is_symlink() and copied.read_bytes() == (node["tmp"] / "blobs/abc").read_bytes()
    assert (node["weights"] / "original/params.json").read_text() == "{}\n"
    # copy.yml's second rsync: what differs from the manifest, named on stdin (--files-from implies -R)
    copied.write_bytes(b"corrupt")
    again = rsync(node, *COPY, "--ignore-times", "--files-from=-", f"{node['source']}/", dest,
                  stdin="model-00001-of-00001.safetensors\noriginal/params.json\n")
    assert again.returncode == 0, again.stderr
    assert copied.read_bytes() == (node["tmp"] / "blobs/abc").read_bytes()


@pytest.mark.parametrize("args, why", [
    (["--archive"], "rsync -logDtpr: the weights copy sends only -r, -t, -I and -R"),   # links, devices, owners
    (["--recursive", "--delete"], "rsync --delete: not an option"),
    (["--recursive", "--temp-dir=/etc"], "rsync --temp-dir: not an option the weights copy sends"),
    (["--recursive", "--partial-dir=/root/.ssh"], "rsync --partial-dir /root/.ssh: the weights copy keeps partial"),
])
def test_a_push_with_other_options_is_refused_and_writes_nothing(node, args, why):
    result = rsync(node, *args, f"{node['source']}/", f"x:{node['weights']}/")
    assert why in refused(result)
    assert list(node["weights"].iterdir()) == []


def test_a_push_elsewhere_and_a_pull_are_refused(node):
    elsewhere = node["tmp"] / "etc"
    elsewhere.mkdir()
    assert f"rsync writes only into {node['weights']}/ here" in refused(
        rsync(node, *COPY, f"{node['source']}/", f"x:{elsewhere}/"))
    assert f"rsync writes only into {node['weights']}/ here" in refused(   # a folder inside it is elsewhere too
        rsync(node, *COPY, f"{node['source']}/", f"x:{node['weights']}/original/"))
    assert list(elsewhere.iterdir()) == [] and list(node["weights"].iterdir()) == []
    (node["weights"] / "secret").write_text("x")
    pulled = node["tmp"] / "pulled"
    pull = rsync(node, "--recursive", f"x:{node['weights']}/", f"{pulled}/")
    assert "rsync --sender: only rsync's receiver runs here" in refused(pull)
    assert not pulled.exists()


@pytest.mark.parametrize("command", ["id", "sh -c id", "rsync --server", "docker load; id", "docker run --rm x",
                                     "rsync --server -tre.iLsfxCIvu . /tmp/x/ ; id", ""])
def test_any_other_command_is_refused(node, command):
    result = through_gate(node, command, "image", "weights")
    assert result.returncode == 2 and result.stdout == ""
    assert f"refused '{command}': " in refused(result)


@pytest.mark.parametrize("copies", [(), ("image",)])
def test_a_copy_the_keys_line_does_not_name_is_refused(node, copies):
    """The weights copy by a key let in for the image copy alone, or by a line that names no copy."""
    rsh = forced_command(node["tmp"] / "image-only", node["gate"], *copies)
    pushed = rsync(node, *COPY, f"{node['source']}/", f"x:{node['weights']}/", rsh=rsh)
    assert (f"authorized here for the copies its authorized_keys line names ({' '.join(copies) or 'none'}), "
            "not the weights copy") in refused(pushed)
    assert list(node["weights"].iterdir()) == []


@pytest.mark.parametrize("copies", [(), ("weights",)])
def test_docker_load_by_a_key_not_let_in_for_the_image_is_refused(node, copies):
    result = through_gate(node, "docker load", *copies)
    assert result.returncode == 2 and result.stdout == ""
    assert (f"refused 'docker load': this key is authorized here for the copies its authorized_keys line names "
            f"({' '.join(copies) or 'none'}), not the image copy") in refused(result)


@pytest.mark.parametrize("copies", [("image",), ("image", "weights")])
def test_docker_load_runs_against_the_node_engine(node, copies):
    need(shutil.which("docker") is not None, "the docker CLI, which the gate runs for the image copy")
    result = through_gate(node, "docker load", *copies)
    # no engine listens there: docker itself says so, with the gate.conf's DOCKER_HOST
    assert result.returncode == 1 and "dsaops transfer gate" not in result.stderr
    assert f"unix://{node['tmp']}/no-engine.sock" in result.stderr
