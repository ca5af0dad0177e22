"""Playbooks without hosts: lint, syntax, `dsaops deploy --print-commands`, the plan check,
and the server flags pinned to the pinned SGLang's own argument definitions."""
import contextlib
import grp
import hashlib
import http.server
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import yaml

from dsaops import pins, targets
from dsaops.errors import UserError
from dsaops.image import image_name
from dsaops.inventory_checks import UIDS, refusal
from dsaops.launch_args import ClusterSpec, NodeSpec, cluster_args, launch_args
from tests.playbooks.ansible_sandbox import BIN, PLAYBOOKS, REPO, fake_kernel, folded, recap
from tests.support.sglang_cli import cli_flags

INVENTORIES = sorted((PLAYBOOKS / "inventories").glob("*.yml"))
MONITORING = yaml.safe_load((PLAYBOOKS / "roles/monitoring/defaults/main.yml").read_text())   # the role's defaults
ENV = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS.parent / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
       "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _run(*argv, cwd=REPO, env=None, timeout=300):
    return subprocess.run(argv, check=False, cwd=cwd, env=ENV | (env or {}), capture_output=True, text=True,
                          timeout=timeout)


def test_ansible_lint_production_profile():
    result = _run(str(BIN / "ansible-lint"), "--profile", "production", "--offline", "--nocolor", cwd=PLAYBOOKS)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in result.stderr + result.stdout


@pytest.mark.parametrize("inventory", INVENTORIES, ids=lambda p: p.stem)
@pytest.mark.parametrize("playbook", ["cluster.yml", "print-commands.yml"])
def test_syntax_check(inventory, playbook):
    result = _run(str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / playbook), "--syntax-check")
    assert result.returncode == 0, result.stderr[-3000:]


def print_commands(inventory, *extra, env=None, cwd=REPO, timeout=300):
    return _run(sys.executable, "-m", "dsaops", "deploy", "-i", inventory, "--print-commands", *extra, env=env, cwd=cwd,
                timeout=timeout)


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """--print-commands for dgx-spark-2x (with hosts that cannot resolve: nothing may connect) and h20-8gpu."""
    unreachable = tmp_path_factory.mktemp("inv") / "dgx-spark-2x-unreachable.yml"
    unreachable.write_text((PLAYBOOKS / "inventories/dgx-spark-2x.yml").read_text().replace(".local", ".invalid"))
    return {"dgx-spark-2x": print_commands(str(unreachable)), "h20-8gpu": print_commands("h20-8gpu")}


def _nodes(output: str) -> dict[str, str]:
    return dict(re.findall(r"^# ---- (\S+) ----\n(.*?)(?=^# ---- |\Z)", output, re.MULTILINE | re.DOTALL))


def _after_image(command: str) -> str:
    """The `sglang.launch_server` part of a rendered command: the lines after the server's image (its
    last mention: the `selftest` line names it first)."""
    return command.rsplit(f"dsaops/sglang:{pins.SGLANG}-", 1)[1].split("\n", 1)[1]


def _launch(command: str) -> list[str]:
    return [arg for line in _after_image(command).splitlines() for arg in shlex.split(line.rstrip(" \\"))]


def test_print_commands_dgx_spark_2x(printed):
    result = printed["dgx-spark-2x"]
    assert result.returncode == 0, result.stderr[-3000:]
    nodes = _nodes(result.stdout)
    assert list(nodes) == ["spark-1", "spark-2"]          # head first
    for name, rank, address in (("spark-1", 0, "192.168.100.1"), ("spark-2", 1, "192.168.100.2")):
        text = nodes[name]
        for expected in (f"--node-rank {rank}", "--nnodes 2", "--dist-init-addr 192.168.100.1:25000", "--tp-size 2",
                         "--kv-cache-dtype fp8_e4m3", "--dsa-prefill-backend tilelang",
                         "--dsa-decode-backend tilelang", "--enable-metrics", f"SGLANG_HOST_IP={address}",
                         f"SGLANG_ZMQ_SOURCE_IP={address}", "SGLANG_ZMQ_ALLOWED_PEERS=127.0.0.1,192.168.100.1,192.168.100.2",
                         "NCCL_SOCKET_IFNAME=enp1s0f0np0", "GLOO_SOCKET_IFNAME=enp1s0f0np0",
                         "TP_SOCKET_IFNAME=enp1s0f0np0", "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0",
                         "NCCL_CUMEM_ENABLE=0", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                         "--network host", "--ipc host", image_name("sm_121")):
            assert expected in text, (name, expected)
        assert ".cache/huggingface" not in text    # staged weights: no server downloads them
    # the checkpoint's folder on the head; the copy the weights phase made on the worker
    assert "--volume /data/models/GLM-5.3-Flash-NVFP4:/models/GLM-5.3-Flash-NVFP4:ro" in nodes["spark-1"]
    assert "--volume /var/lib/dsaops/models/GLM-5.3-Flash-NVFP4:/models/GLM-5.3-Flash-NVFP4:ro" in nodes["spark-2"]
    # the memory wait runs before each start, in the container too when Docker restarts it (no systemd here)
    for text in nodes.values():
        assert "--env 'DSAOPS_BEFORE_START=/usr/local/bin/dsaops-sglang wait-memory'" in text
        assert "--volume /usr/local/bin/dsaops-sglang:/usr/local/bin/dsaops-sglang:ro" in text
        assert '"${have:-0}" -ge 112197632 ]' in text     # the plan's 115 - 8 = 107 GiB free before weights, in KiB


@pytest.mark.parametrize("registry", ["", "registry.lan:5000"])
def test_one_registry_variable_names_the_image_for_make_image_and_the_spark_inventory(tmp_path, registry):
    """DSAOPS_REGISTRY is `make image`'s REGISTRY= default and the inventories' dsaops_image_registry default:
    dgx-spark-2x.yml runs exactly the image `make image ARCH=sm_121` tags, with or without a registry."""
    env = {"DSAOPS_REGISTRY": registry}
    plan = _run("make", "--no-print-directory", "image-plan", "ARCH=sm_121", env=env)
    assert plan.returncode == 0, plan.stderr
    [tag] = re.findall(r"--tag (\S+)", plan.stdout)
    assert tag == image_name("sm_121", registry=registry)
    inventory = tmp_path / "sparks.yml"
    inventory.write_text((PLAYBOOKS / "inventories/dgx-spark-2x.yml").read_text().replace(".local", ".invalid"))
    printed = print_commands(str(inventory), env=env)
    assert printed.returncode == 0, printed.stderr[-3000:]
    nodes = _nodes(printed.stdout)
    assert [re.findall(r"^  (\S*dsaops/sglang:\S+) \\$", text, re.MULTILINE) for text in nodes.values()] == [[tag], [tag]]


# The inventories' settings, as dsaops.launch_args specs: what each node's command must be.
MODEL = "zai-org/GLM-5.3-Flash"
# The weights are staged on every node and mounted read-only at /models/<name>; clients still see the model's name.
SPARKS = ClusterSpec(tp_size=2, nnodes=2, kv_cache_dtype="fp8_e4m3", dsa_prefill_backend="tilelang",
                     dsa_decode_backend="tilelang", mem_fraction_static=0.8, max_running_requests=16,
                     chunked_prefill_size=4096, served_model_name="GLM-5.3-Flash-NVFP4",   # GB10's prefill bound
                     enable_metrics=True)
H20 = ClusterSpec(tp_size=8, attn_dp_size=8, kv_cache_dtype="fp8_e4m3", dsa_prefill_backend="tilelang",
                  dsa_decode_backend="tilelang", mem_fraction_static=0.85, max_running_requests=240,
                  served_model_name=MODEL, enable_metrics=True, nccl_port=25000)   # one node: the fenced dist-init port
STAGED = "/models/GLM-5.3-Flash"
KEYS = "/etc/dsaops/sglang-secrets.yaml"   # both API keys, as SGLang's --config file


def test_every_sglang_flag_comes_from_launch_args(printed):
    """Each node's whole launch_server argument list is dsaops.launch_args' for its inventory, in its order:
    a flag the playbook wrote itself, dropped or reordered would show."""
    sparks = _nodes(printed["dgx-spark-2x"].stdout)
    for rank, name in enumerate(("spark-1", "spark-2")):
        node = NodeSpec(model_path="/models/GLM-5.3-Flash-NVFP4", host="0.0.0.0", port=30000, node_rank=rank,
                        dist_init_addr="192.168.100.1:25000", config_file=KEYS)
        assert _launch(sparks[name]) == launch_args(SPARKS, node), name
    (h20,) = _nodes(printed["h20-8gpu"].stdout).values()
    assert _launch(h20) == launch_args(H20, NodeSpec(model_path=STAGED, host="0.0.0.0", port=30000, config_file=KEYS))
    # the user's extras come last, through the builder too
    extra = print_commands("h20-8gpu", "-e", '{"sglang_server_extra_args": ["--trust-remote-code"]}')
    (text,) = _nodes(extra.stdout).values()
    assert _launch(text) == launch_args(H20, NodeSpec(model_path=STAGED, host="0.0.0.0", port=30000, config_file=KEYS,
                                                      extra_args=("--trust-remote-code",)))


def test_a_flag_written_in_the_playbook_is_caught(tmp_path):
    """Control: a copy of the playbooks whose role appends a flag of its own renders a command that
    the comparison above rejects."""
    shutil.copytree(PLAYBOOKS, tmp_path / "playbooks")
    shutil.copy(REPO / "ansible.cfg", tmp_path / "ansible.cfg")
    (tmp_path / "dsaops").symlink_to(REPO / "dsaops")
    role_vars = tmp_path / "playbooks/roles/sglang_server/vars/main.yml"
    text = role_vars.read_text()
    assert "extra_args=sglang_server_extra_args) }}" in text
    role_vars.write_text(text.replace("extra_args=sglang_server_extra_args) }}",
                                      "extra_args=sglang_server_extra_args) + ['--disable-cuda-graph'] }}"))
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(PLAYBOOKS / "inventories/h20-8gpu.yml"),
                             str(tmp_path / "playbooks/print-commands.yml"), "-e", f"sglang_server_print_dir={out}"],
                            check=False, cwd=tmp_path, env={**ENV, "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg")},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    rendered = _launch((out / "h20-1.sh").read_text())
    expected = launch_args(H20, NodeSpec(model_path=STAGED, host="0.0.0.0", port=30000, config_file=KEYS))
    assert rendered != expected and rendered == [*expected, "--disable-cuda-graph"]


def test_print_commands_h20_8gpu(printed):
    result = printed["h20-8gpu"]
    assert result.returncode == 0, result.stderr[-3000:]
    (text,) = _nodes(result.stdout).values()
    for expected in ("--tp-size 8", "--attn-dp-size 8", "--max-running-requests 240", image_name("sm_90")):
        assert expected in text, expected
    for absent in ("--nnodes", "--enable-dp-attention", "NCCL_CUMEM_ENABLE", "PYTORCH_CUDA_ALLOC_CONF",
                   "--chunked-prefill-size", "DSAOPS_BEFORE_START"):   # one node; new DP spelling; not GB10
        assert absent not in text, absent


def test_plan_contradiction_stops_unless_acknowledged():
    refused = print_commands("h20-8gpu", "-e", "dsaops_max_running_requests=8", "-e", '{"dsaops_plan_acknowledge": []}')
    assert refused.returncode != 0
    assert "bound by dp_split: at most 1 running request(s) per DP rank" in refused.stderr
    assert "dsaops_plan_acknowledge: [dp_split]" in refused.stderr
    assert print_commands("h20-8gpu", "-e", "dsaops_max_running_requests=8").returncode == 0   # acknowledged


def test_the_plan_takes_what_the_extra_arguments_set():
    """The server starts with sglang_server_extra_args after the inventory's flags, so they win: the preflight plans
    with them, and so stops where SGLang or the gate would."""
    pool = print_commands("h20-8gpu", "-e", '{"sglang_server_extra_args": ["--mm-feature-transport", "cuda_ipc"]}')
    assert pool.returncode != 0    # its 1 GiB feature pool leaves the mamba cache 29 requests a rank
    assert "concurrency is bound by mamba: at most 29 running request(s) per DP rank" in pool.stderr
    ipc = print_commands("dgx-spark-2x", "-e", '{"sglang_server_extra_args": ["--mm-feature-transport", "cuda_ipc"]}')
    assert ipc.returncode != 0
    assert ("`dsaops plan` refuses these settings: SGLang refuses this launch at startup: --mm-feature-transport=cuda_ipc "
            "only supports a single node.") in folded(ipc.stderr)


def test_extra_arguments_the_planner_cannot_take_or_that_differ_between_nodes_stop_the_run(tmp_path):
    """One line before anything renders: a value no launch takes, a flag dsaops writes from an inventory variable, a
    flag SGLang has not got (`dsaops deploy` before any play, the playbook in its preflight), or flags the plan models
    set differently on two nodes (one plan stands for the cluster, and SGLang needs them alike)."""
    typo_line = ("h20-1: sglang_server_extra_args: SGLang 0.5.23 has no flag --mem-fraction-statc (did you mean "
                 "--mem-fraction-static?); fix it or drop it")
    for extra, line in [
            ('["--max-r=8"]', ("h20-1: sglang_server_extra_args: --max-running-requests is written from "
                               "dsaops_max_running_requests, which other roles read too; set that in the inventory "
                               "and drop the flag")),
            ('["--context-length", "0"]', ("h20-1: sglang_server_extra_args: --context-length must be a whole "
                                           "number from 1 to 2147483647, got '0'; fix the value or drop the flag")),
            ('["--mem-fraction-statc", "0.9"]', typo_line)]:       # the server would stop at startup on it
        refused = print_commands("h20-8gpu", "-e", f'{{"sglang_server_extra_args": {extra}}}')
        assert refused.returncode == 2 and refused.stderr == f"dsaops deploy: {line}\n" and refused.stdout == "", extra
    out = tmp_path / "out"
    out.mkdir()
    typo = _run(str(BIN / "ansible-playbook"), "-i", str(PLAYBOOKS / "inventories/h20-8gpu.yml"),
                str(PLAYBOOKS / "print-commands.yml"), "-e", f"sglang_server_print_dir={out}",
                "-e", '{"sglang_server_extra_args": ["--mem-fraction-statc", "0.9"]}')
    assert typo.returncode != 0 and list(out.iterdir()) == [], typo.stdout[-3000:]
    assert typo_line in folded(typo.stdout)
    path = tmp_path / "mixed.yml"
    path.write_text((PLAYBOOKS / "inventories/dgx-spark-2x.yml").read_text().replace(
        "dsaops_cluster_address: 192.168.100.2", "dsaops_cluster_address: 192.168.100.2\n"
        "              sglang_server_extra_args: [--trust-remote-code, --context-length=8192]"))
    mixed = print_commands(str(path))
    failed = [line for line in mixed.stderr.splitlines() if "FAILED" in line]
    assert mixed.returncode != 0 and len(failed) == 1, mixed.stderr[-3000:]
    assert "--context-length differs between nodes ({'spark-1': 'unset', 'spark-2': '8192'})" in failed[0]


def test_inconsistent_inventory_refused_without_hosts():
    indivisible = print_commands("dgx-spark-2x", "-e", "dsaops_tp_size=3")
    assert indivisible.returncode != 0 and "dsaops_tp_size 3 must be divisible by the 2 node(s)" in indivisible.stderr


@pytest.mark.parametrize("ep, refused", [(3, True), (16, True), (8, False)])
def test_ep_size_must_divide_tp_size(ep, refused):
    """SGLang refuses tp_size % ep_size at model load (moe_ep_setup.py); the inventory check says so first."""
    result = print_commands("h20-8gpu", "-e", f"dsaops_ep_size={ep}")
    assert (result.returncode != 0) is refused, result.stderr[-3000:]
    assert (f"dsaops_attn_dp_size 8 and dsaops_ep_size {ep} must divide it" in result.stderr) is refused


@pytest.mark.parametrize("extra, says", [
    ("dsaops_exporter_port=30000", "h20-1: port 30000 is both dsaops_server_port and dsaops_exporter_port."),
    ("monitoring_grafana_port=25000", "h20-1: port 25000 is both dsaops_dist_init_port and monitoring_grafana_port."),
    # attention DP 8 on one node: SGLang's handshake listens at the server port + 13
    ("monitoring_prometheus_port=30013", ("h20-1: port 30013 is both a port SGLang derives from them "
                                          "(dsaops/sglang_ports.py) and monitoring_prometheus_port.")),
])
def test_two_listeners_on_one_port_are_refused_without_hosts(extra, says):
    result = print_commands("h20-8gpu", "-e", extra)
    assert result.returncode != 0 and says in folded(result.stderr), result.stderr[-3000:]


def test_print_commands_needs_a_target():
    result = print_commands("local")
    assert result.returncode != 0 and "set dsaops_target" in result.stderr
    assert "or pass -e dsaops_target=sm_90" in result.stderr          # make deploy-commands: DEPLOY_ARGS='-e ...'
    assert print_commands("local", "-e", "dsaops_target=sm_90").returncode == 0


def test_generated_flags_exist_in_pinned_sglang(printed):
    """Every flag the playbooks render, and every flag the builder can write (all settings on)."""
    flags = cli_flags()
    assert "--dsa-prefill-backend" in flags and "--bogus-flag" not in flags       # the parser itself works
    commands = printed["dgx-spark-2x"].stdout + printed["h20-8gpu"].stdout
    launch = [line.strip().rstrip(" \\") for text in _nodes(commands).values()
              for line in _after_image(text).splitlines() if line.strip()]
    everything = cluster_args(ClusterSpec(
        tp_size=8, dp_size=2, attn_dp_size=4, ep_size=8, nnodes=2, kv_cache_dtype="fp8_e4m3",
        dsa_prefill_backend="tilelang", dsa_decode_backend="tilelang", mem_fraction_static=0.85, context_length=4096,
        max_running_requests=64, max_mamba_cache_size=300, mamba_full_memory_ratio=0.5, mamba_ssm_dtype="bfloat16",
        speculative_num_draft_tokens=6, enable_metrics=True))
    for arg in everything:
        launch += [arg] if arg.startswith("--") else [launch.pop() + " " + arg]
    assert launch
    for line in launch:
        flag, *value = line.split()
        assert flag in flags, f"{flag} is not a sglang {pins.SGLANG} launch_server flag"
        if value and flags[flag]:
            assert value[0] in flags[flag], f"{flag} {value[0]} not in {flags[flag]}"


@pytest.mark.parametrize("argv, message", [
    (["-i", "no-such-cluster"], "inventory 'no-such-cluster' not found; give a file or one of: dgx-spark-2x, h20-8gpu"),
    (["-i", "local", "--tags", "preflight,gpus"], "unknown phase(s) gpus; phases: preflight, host_memory"),
    (["-i", "local", "--tags", ""], "unknown phase(s) ''; phases: preflight, host_memory"),
    (["-i", "local", "--print-commands", "--check"], "--print-commands renders commands only"),
])
def test_deploy_refuses_bad_input(argv, message):
    result = _run(sys.executable, "-m", "dsaops", "deploy", *argv)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("inventory, says", [
    ("README.md", "README.md: Ansible cannot read it as an inventory"),
    ("ini", "it puts no host in group dsaops_cluster"),
])
def test_deploy_stops_on_an_inventory_without_serving_hosts(tmp_path, inventory, says):
    if inventory == "ini":
        inventory = tmp_path / "other.ini"
        inventory.write_text("[other]\nsomewhere ansible_connection=local\n")
    result = _run(sys.executable, "-m", "dsaops", "deploy", "-i", str(inventory), "--check")
    assert result.returncode == 2 and says in result.stderr and "dsaops_head and dsaops_workers" in result.stderr
    assert result.stderr.count("\n") == 1 and "summary" not in result.stdout, result.stdout + result.stderr


def test_an_inventory_script_that_hangs_stops_the_deploy_in_one_line(tmp_path, monkeypatch):
    """ansible-inventory runs an executable inventory; one that never answers used to end in a traceback."""
    import dsaops.deploy
    from dsaops.errors import UserError

    script = tmp_path / "cloud.sh"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(dsaops.deploy, "LISTING_TIMEOUT_S", 3)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    with pytest.raises(UserError, match=r"cloud\.sh: ansible-inventory listed no hosts within 3 s .*finishes$"):
        dsaops.deploy.check_inventory(script, path)


@pytest.mark.parametrize("playbook", ["cluster.yml", "print-commands.yml"])
def test_ansible_playbook_stops_on_a_missing_inventory(tmp_path, playbook):
    """Ansible alone runs no play of an unreadable inventory and exits 0; the first play stops it."""
    result = _run(str(BIN / "ansible-playbook"), "-i", str(tmp_path / "nosuch.yml"), str(PLAYBOOKS / playbook),
                  "--tags", "preflight")
    assert result.returncode == 2, result.stdout[-3000:]
    assert "nosuch.yml: no host in group dsaops_cluster (groups found: none" in folded(result.stdout)
    assert recap(result.stdout) == {"localhost": {"ok": 0, "changed": 0, "unreachable": 0, "failed": 1}}


def _detect(tmp_path, target: str, smi_output: str, running: tuple[str, ...] = (), **cluster_vars):
    """preflight on this machine (local connection) with a fake nvidia-smi first on PATH, and a fake docker for
    which exactly the containers `running` run."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{smi_output}'\n")
    (fake / "docker").write_text(f'#!/bin/sh\nfor name; do :; done\ncase " {" ".join(running)} " in *" $name "*) echo true;;\n'
                                 '*) echo "Error: No such object: $name" >&2; exit 1;; esac\n')
    for tool in ("nvidia-smi", "docker"):
        (fake / tool).chmod(0o755)
    inventory = tmp_path / "local.yml"
    here = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    cluster = {"vars": {"dsaops_target": target, "dsaops_cluster_interface": "lo", "dsaops_cluster_address": "127.0.0.1",
                        "preflight_ports": [1], "dsaops_dist_init_port": 2,   # ports nothing here listens on
                        **cluster_vars},
               "children": {"dsaops_head": {"hosts": {"here": here}}}}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"dsaops_cluster": cluster}}}))
    env = {**ENV, "PATH": f"{fake}{os.pathsep}{ENV['PATH']}"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / "cluster.yml"),
                           "--tags", "preflight"], check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_preflight_maps_compute_capability_to_target(tmp_path):
    detected = _detect(tmp_path, "auto", "12.1, 580.95.05, NVIDIA GB10")
    assert detected.returncode == 0, detected.stdout[-3000:]
    assert "here: target sm_121 (detected), 1 GPU(s), driver 580.95.05, unified memory True" in \
        folded(detected.stdout)


def test_preflight_refuses_a_target_the_gpus_contradict(tmp_path):
    refused = _detect(tmp_path, "sm_90", "12.1, 580.95.05, NVIDIA GB10")
    assert refused.returncode != 0
    assert "here has sm_121 GPUs but the inventory says dsaops_target=sm_90" in folded(refused.stdout)


@pytest.mark.parametrize("cluster_vars, says", [
    ({"dsaops_tp_size": 2, "dsaops_gpus_per_node": 2},
     ("here: has 1 GPU(s), but SGLang starts 2 scheduler ranks there, a GPU each: dsaops_tp_size 2 over 1 node(s). "
      "Set dsaops_tp_size and dsaops_gpus_per_node to the GPUs the nodes have.")),
    ({"sglang_server_extra_args": ["--data-parallel-size", "2"]},
     ("here: has 1 GPU(s), but SGLang starts 2 scheduler ranks there, a GPU each: dsaops_tp_size 1 over 1 node(s), "
      "times the replicas (--dp-size) and pipeline stages (--pp-size) of sglang_server_extra_args. Lower those, "
      "or dsaops_tp_size and dsaops_gpus_per_node, to the GPUs the nodes have.")),
    ({"sglang_server_extra_args": ["--pp-size", "0"]},
     "here: sglang_server_extra_args: --pp-size must be >= 1, got 0; fix the value or drop the flag"),
])
def test_preflight_counts_a_gpu_for_each_rank_the_server_starts(tmp_path, cluster_vars, says):
    """SGLang starts a scheduler rank a GPU for each TP rank, data-parallel replica and pipeline stage (dsaops.node_ranks,
    as the image's health check counts them); a node with fewer GPUs stops in preflight, not at the server's start."""
    refused = _detect(tmp_path, "sm_121", "12.1, 580.95.05, NVIDIA GB10", **cluster_vars)
    assert refused.returncode != 0
    assert says in folded(refused.stdout), refused.stdout[-3000:]


def test_preflight_takes_extra_arguments_that_start_a_rank_a_gpu(tmp_path):
    """The negative control of the refusals above: one replica on the one GPU, attention DP adding none."""
    taken = _detect(tmp_path, "sm_121", "12.1, 580.95.05, NVIDIA GB10",
                    sglang_server_extra_args=["--dp-size", "1", "--pp-size=1"])
    assert taken.returncode == 0, taken.stdout[-3000:]


def test_preflight_leaves_the_exporters_port_to_its_own_container(tmp_path):
    """The server died, its exporter's container still serves: a re-run may start the server again, but a port
    anything else holds still stops it."""
    with socket.create_server(("127.0.0.1", 0)) as exporter, socket.create_server(("127.0.0.1", 0)) as other:
        ports = {"dsaops_exporter_port": exporter.getsockname()[1], "dsaops_server_port": other.getsockname()[1]}
        held = _detect(tmp_path, "sm_121", "12.1, 580.95.05, NVIDIA GB10", running=("dsaops-exporter",),
                       preflight_ports=list(ports.values()), **ports)
        assert held.returncode != 0
        assert f"here: port(s) {ports['dsaops_server_port']} already in use" in folded(held.stdout)
        rerun = _detect(tmp_path, "sm_121", "12.1, 580.95.05, NVIDIA GB10", running=("dsaops-exporter",),
                        preflight_ports=[ports["dsaops_exporter_port"]], **ports)
        assert rerun.returncode == 0, rerun.stdout[-3000:]
        serving = _detect(tmp_path, "sm_121", "12.1, 580.95.05, NVIDIA GB10", running=("dsaops-sglang",),
                          preflight_ports=list(ports.values()), **ports)   # a running server's ports are all ours
        assert serving.returncode == 0, serving.stdout[-3000:]


def test_the_quick_start_without_a_gpu_says_so_first(tmp_path):
    """README's `ansible-playbook playbooks/cluster.yml` (local.yml) on a host whose nvidia-smi and rocminfo fail:
    the no-GPU reason comes right after the value checks, before the cluster's checks and the rest of preflight."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("nvidia-smi", "rocminfo"):
        (fake / tool).write_text("#!/bin/sh\nexit 9\n")
        (fake / tool).chmod(0o755)
    result = _run(str(BIN / "ansible-playbook"), "playbooks/cluster.yml", env={"PATH": f"{fake}{os.pathsep}{ENV['PATH']}"})
    assert result.returncode == 2, result.stdout[-3000:]
    assert "No GPU found on this-host (nvidia-smi and rocminfo both failed)" in folded(result.stdout)
    # 9 tasks pass before it (value checks, the probe); check-cluster.yml alone would add 9 more, as it once did.
    assert recap(result.stdout)["this-host"]["ok"] <= 12, recap(result.stdout)


def test_one_target_and_image_on_every_node(tmp_path):
    """Every cluster-wide setting that differs is named, in the one line of the one failing task."""
    inventory = (PLAYBOOKS / "inventories/dgx-spark-2x.yml").read_text().replace(
        "dsaops_cluster_address: 192.168.100.2", "dsaops_cluster_address: 192.168.100.2\n              dsaops_image: mine:1"
        "\n              dsaops_server_port: 31000")
    path = tmp_path / "mixed.yml"
    path.write_text(inventory)
    result = print_commands(str(path))
    assert result.returncode != 0
    failed = [line for line in result.stderr.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "Cluster-wide settings agree on every node" in failed[0]
    assert (f"image differs between nodes ({{'spark-1': '{image_name('sm_121')}', 'spark-2': 'mine:1'}}); "
            "server_port differs between nodes ({'spark-1': '30000', 'spark-2': '31000'}); Set each once") in failed[0]


def test_a_weights_source_outside_the_cluster_is_refused_without_hosts():
    """The weights role said so only after host_memory, network, transfer and image had changed the nodes."""
    result = print_commands("dgx-spark-2x", "-e", "dsaops_weights_source_host=spark-3")
    assert result.returncode != 0
    assert ("dsaops_weights_source_host spark-3 is not in dsaops_cluster (spark-1, spark-2); name the node that holds "
            "or downloads the weights") in folded(result.stderr)
    assert print_commands("dgx-spark-2x", "-e", "dsaops_weights_source_host=spark-3", "-e",
                          "dsaops_weights_stage=false").returncode == 0


def test_an_image_source_outside_the_cluster_is_refused_without_hosts():
    """The image role read it only after host_memory, network and transfer had changed the nodes (and, with a
    registry, every node had pulled), then said the image was 'on no node named by image_source'."""
    result = print_commands("dgx-spark-2x", "-e", "image_source=spark-3")
    assert result.returncode != 0
    assert ("image_source spark-3 is not auto, controller or a node of dsaops_cluster (spark-1, spark-2); name the "
            "node that holds the image, or leave it auto.") in folded(result.stderr)
    spaced = print_commands("dgx-spark-2x", "-e", '{"image_source": "spark 2"}')
    assert spaced.returncode == 2 and "image_source='spark 2' is refused: it must be a host name" in spaced.stderr
    assert print_commands("dgx-spark-2x", "-e", "image_source=spark-2").returncode == 0
    assert print_commands("dgx-spark-2x", "-e", "image_source=controller").returncode == 0


def test_two_nodes_on_one_cluster_address_are_refused(tmp_path):
    path = tmp_path / "one-address.yml"
    path.write_text((PLAYBOOKS / "inventories/dgx-spark-2x.yml").read_text().replace(
        "dsaops_cluster_address: 192.168.100.2", "dsaops_cluster_address: 192.168.100.1"))
    result = print_commands(str(path))
    assert result.returncode != 0
    assert ("dsaops_cluster_address must be each node's own address on the cluster link (distinct, not loopback with "
            "more than one node); got {'spark-1': '192.168.100.1', 'spark-2': '192.168.100.1'}") in \
        folded(result.stderr)


# One hostile value for each template the playbooks render (the variable it would reach), and the
# invalid values the checks used to let through. Every one must stop the run before anything renders,
# in a message naming its variable.
HOSTILE = {
    # dsaops-sglang.sh.j2 (shell, run by systemd as root) and dsaops-sglang.service.j2 (systemd unit)
    "dsaops_server_container": "x\ntouch /tmp/dsaops-pwned",
    "sglang_server_container_name": "dsaops\nExecStartPost=/bin/sh -c 'touch /tmp/dsaops-pwned'",
    "sglang_server_extra_env": {"OK": "a\nEVIL=1"},
    "sglang_server_memory_gate_gib": "1$(touch /tmp/dsaops-pwned)",
    "sglang_server_extra_args": ["--api-k", "k", "--config", "/srv/x.yaml"],
    # dsaops.nft.j2 (nftables)
    "network_firewall_allow": ["1.2.3.4; flush ruleset"],
    "dsaops_monitoring_allow": ["10.0.0.0/8 } accept; #"],
    # prometheus.yml.j2, alertmanager.yml.j2, grafana-datasource.yml.j2 (YAML)
    "monitoring_scrape_interval": "5s\nscrape_configs: []",
    "monitoring_alert_webhook_url": "http://x\n  evil: 1",
    "monitoring_datasource_uid": "x\nurl: http://evil",
    # dsaops-exporter.sh.j2 (shell)
    "dsaops_log_dir": "/var/log/x\ntouch /tmp/dsaops-pwned",
    # sysctl.conf.j2, sshd-oom.conf.j2 (a systemd drop-in)
    "host_memory_extra_sysctls": {"vm.x\nkernel.sysrq": 1},
    "host_memory_sshd_oom_score_adj": "-900\nExecStartPre=/bin/touch /tmp/dsaops-pwned",
    # the server's --config file and token file, and the files and roots every role writes under
    "sglang_server_hf_token": "hf_x\nEVIL=1",
    "dsaops_api_key": "short", "dsaops_admin_api_key": "-dash-0123456789abcdef",
    "dsaops_exporter_token": "spaced token 0123456789",
    "monitoring_exporter_api_key_file": "/etc/x\ntouch /tmp/dsaops-pwned", "weights_hf_token_file": "hf-token",
    "host_memory_sshd_pidfile": "/run/sshd.pid; touch /tmp/dsaops-pwned", "host_memory_root": "roots/x",
    "monitoring_root": "/srv/a b", "network_root": "/srv/$(id)", "sglang_server_root": "/srv/x\n",
    "transfer_root": "~/x", "weights_root": "/srv/x;y",
    # values that passed before: TP 0, port 99999, an empty image, and others
    "dsaops_tp_size": 0, "dsaops_server_port": 99999, "dsaops_image": "", "dsaops_gpus_per_node": -1,
    "dsaops_attn_dp_size": 0, "dsaops_cluster_interface": "eth0; reboot", "dsaops_mem_fraction_static": 1.5,
    "dsaops_exporter_port": 0, "dsaops_exporter_mode": "contianer", "sglang_server_supervisor": "systemd-run",
    "monitoring_start": "maybe",
    # renamed variables: set under their old names, they would be ignored
    "sglang_server_config_dir": "/srv/dsaops", "sglang_server_log_dir": "/srv/logs",
}
SECRET_VALUES = ("hf_x", "short", "-dash-0123456789abcdef", "spaced token 0123456789")


def _hostile_inventory(tmp_path):
    hosts = {"h1\ntouch /tmp/dsaops-pwned": {"ansible_host": "10.0.0.1 -oProxyCommand=x\n",
                                             "dsaops_cluster_address": "10.0.0.256"}}
    inventory = tmp_path / "hostile.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"dsaops_cluster": {
        "vars": {"dsaops_target": "sm_90", **HOSTILE},
        "children": {"dsaops_head": {"hosts": hosts}}}}}}))
    return inventory


def test_hostile_values_stop_the_run_before_anything_renders(tmp_path):
    """A host name with a newline and a command, ansible_host with spaces and a newline, a cluster address that
    is no address, and HOSTILE: one run of print-commands.yml, refused in the first play, nothing rendered."""
    inventory = _hostile_inventory(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    result = _run(str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / "print-commands.yml"),
                  "-e", f"sglang_server_print_dir={out}")
    text = result.stdout
    assert result.returncode != 0 and "Refuse values no template can carry safely" in text
    for name in [*HOSTILE, "inventory_hostname", "ansible_host", "dsaops_cluster_address"]:
        assert f"{name}=" in text or f"{name} (not shown) is refused" in text, name
    assert not any(secret in text for secret in SECRET_VALUES)       # secrets are named, never shown
    assert list(out.iterdir()) == [] and not os.path.exists("/tmp/dsaops-pwned")


@pytest.mark.parametrize("extra", ["sglang_server_hf_token=hf_abc", '{"dsaops_api_key": "x"}',
                                   "a=1 monitoring_grafana_admin_password=p", "dsaops_exporter_token=t"])
def test_a_secret_on_the_command_line_is_refused(extra):
    result = print_commands("h20-8gpu", "-e", extra)
    assert result.returncode == 2 and "a secret on the command line is shown by ps" in result.stderr
    assert result.stderr.count("\n") == 1


def test_every_secret_kind_of_variable_is_refused_inline():
    """The variables inventory_checks keeps out of messages are the ones -e may not carry; a new one
    is covered without a second list (a variable of another kind passes)."""
    from dsaops.deploy import inline_secret, read_extra_vars
    from dsaops.inventory_checks import SECRET_VARIABLES

    def found(extra):
        return inline_secret(extra, read_extra_vars(extra)[1])

    assert {"dsaops_api_key", "sglang_server_hf_token", "weights_hf_token"} <= set(SECRET_VARIABLES)
    for name in SECRET_VARIABLES:
        assert found(f"a=1 {name}=x") == name and found(f'{{"{name}": "x"}}') == name
    assert found("dsaops_tp_size=8") is None
    # a file's variables are not on the command line, whatever they set
    assert inline_secret(f"@{SECRET_VARIABLES[0]}.yml", {SECRET_VARIABLES[0]: "x"}) is None


def test_an_unclosed_quote_in_extra_vars_is_one_line_that_hides_the_value():
    result = print_commands("h20-8gpu", "-e", "sglang_server_hf_token='hf_abc")
    assert result.returncode == 2 and "an -e argument has an unclosed quote" in result.stderr
    assert result.stderr.count("\n") == 1 and "hf_abc" not in result.stderr


@pytest.mark.parametrize("token", ["hf_abc\nEVIL=1", "\u201chf_abc\u201d", "hf_abc\u00e9"])
def test_an_hf_token_the_roles_refuse_is_refused_before_ansible_runs(token):
    """As the weights and sglang_server roles refuse it (the token rule: printable ASCII, no space); they
    check it only when they start, after host_memory and network changed the nodes."""
    assert refusal("weights_hf_token", token) is not None
    result = print_commands("h20-8gpu", env={"HF_TOKEN": token})
    assert result.returncode == 2 and "HF_TOKEN in the environment holds a newline" in result.stderr
    assert "hf_abc" not in result.stderr and result.stderr.count("\n") == 1


def test_deploy_refuses_what_the_playbook_refuses_in_one_line_before_ansible_runs(tmp_path):
    """The values check-inventory.yml refuses (the hostile inventory above) stop `dsaops deploy` with exit 2
    in one line, each named, no secret shown, before any playbook runs."""
    result = print_commands(str(_hostile_inventory(tmp_path)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stdout == "", result.stderr
    for name in [*HOSTILE, "inventory_hostname", "ansible_host", "dsaops_cluster_address"]:
        assert f"{name}=" in result.stderr or f"{name} (not shown) is refused" in result.stderr, name
    assert result.stderr.startswith("dsaops deploy: h1?touch??tmp?dsaops-pwned: ")
    assert not any(secret in result.stderr for secret in SECRET_VALUES)


@pytest.mark.parametrize("name, value, line", [
    ("dsaops_tp_size", 0, "h20-1: dsaops_tp_size=0 is refused: it must be a whole number of 1 or more."),
    ("dsaops_mem_fraction_static", 1.5, "h20-1: dsaops_mem_fraction_static=1.5 is refused: it must be a fraction"),
    ("dsaops_server_port", "08000", ("h20-1: dsaops_server_port='08000' is refused: it must be a TCP port, "
                                     "1 to 65535, without leading zeros")),
    ("monitoring_alertmanager_uid", 0, ("h20-1: monitoring_alertmanager_uid=0 is refused: it must be a whole number "
                                        "from 1 to 65533")),
    # the extras as the preflight's plan reads them: SGLang's parser checks every use of a flag, not the last alone
    ("sglang_server_extra_args", ["--context-length", "abc", "--context-length", "8192"],
     "h20-1: sglang_server_extra_args: SGLang 0.5.23 would stop at startup: argument --context-length: 'abc' is not a"),
    ("sglang_server_extra_env", {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "maybe"},
     "h20-1: sglang_server_extra_env: SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK='maybe' is neither true"),
    # the role's default for Prometheus: the deploy's check sees the defaults too
    ("monitoring_exporter_uid", MONITORING["monitoring_prometheus_uid"],
     (f"h20-1: monitoring_prometheus_uid and monitoring_exporter_uid share uid {MONITORING['monitoring_prometheus_uid']}: "
      "give each container a uid of its own.")),
])
def test_a_refused_inventory_value_is_one_line_and_exit_2(tmp_path, name, value, line):
    """It used to run the playbook, which stopped with one line per host and a summary, exit 1."""
    inventory = tmp_path / "inv.yml"
    content = yaml.safe_load((PLAYBOOKS / "inventories/h20-8gpu.yml").read_text())
    content["all"]["children"]["dsaops_cluster"]["vars"][name] = value
    inventory.write_text(yaml.safe_dump(content))
    result = print_commands(str(inventory))
    assert result.returncode == 2 and result.stderr.startswith(f"dsaops deploy: {line}"), result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_a_uid_another_containers_default_has_stops_the_playbook_before_anything_renders(tmp_path):
    """The playbook run without `dsaops deploy` (check-inventory.yml sees the inventory's values, not the monitoring
    role's defaults): check-cluster.yml refuses it with the role's defaults, before anything renders."""
    out = tmp_path / "out"
    out.mkdir()
    shared = MONITORING["monitoring_alertmanager_uid"]
    result = _run(str(BIN / "ansible-playbook"), "-i", str(PLAYBOOKS / "inventories/h20-8gpu.yml"),
                  str(PLAYBOOKS / "print-commands.yml"), "-e", f"sglang_server_print_dir={out}",
                  "-e", f"monitoring_docker_proxy_uid={shared}")
    assert result.returncode != 0 and "Refuse the monitoring role's values" in result.stdout, result.stdout[-3000:]
    assert (f"monitoring_alertmanager_uid and monitoring_docker_proxy_uid share uid {shared}: give each container a "
            "uid of its own.") in result.stdout
    assert list(out.iterdir()) == []


def test_the_inventory_check_takes_extra_vars_templates_vaults_and_the_limit(tmp_path):
    """What Ansible would run with passes: -e overrides a refused value, a template or a vault is left to the
    playbook, and hosts outside --limit are not checked (the playbook's plays skip them)."""
    from dsaops.deploy import check_inventory

    inventory = tmp_path / "inv.yml"
    inventory.write_text("""
all:
  children:
    dsaops_cluster:
      vars: {dsaops_tp_size: 0, dsaops_weights_dir: "{{ elsewhere }}"}
      children:
        dsaops_head:
          hosts:
            a:
              sglang_server_hf_token: !vault |
                $ANSIBLE_VAULT;1.1;AES256
                3036
        dsaops_workers:
          hosts:
            b: {dsaops_server_port: 99999}
""")
    path = str(BIN)
    assert check_inventory(inventory, path, limit="a", overrides={"dsaops_tp_size": "8"}) == {"a", "b"}
    with pytest.raises(UserError, match=r"^b: dsaops_server_port=99999 is refused"):
        check_inventory(inventory, path, overrides={"dsaops_tp_size": "8"})
    with pytest.raises(UserError, match=r"^a, b: dsaops_tp_size=0 is refused.* b: dsaops_server_port=99999"):
        check_inventory(inventory, path, limit="dsaops_cluster", overrides={})
    assert check_inventory(inventory, path, overrides=None) == {"a", "b"}      # an encrypted -e file: the playbook checks


def test_a_limit_that_matches_no_host_is_one_line_and_exit_2():
    """It used to run Ansible, which printed its warnings and "failed (0 failure(s) above)", exit 1."""
    result = print_commands("h20-8gpu", "--limit", "h20-9")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--limit 'h20-9' matches no host of " in result.stderr and result.stderr.endswith("its hosts: h20-1\n")


def test_an_extra_vars_file_is_read_from_the_current_folder(tmp_path, monkeypatch):
    """Ansible reads a relative @FILE from the playbooks' folder: it used to be "Could not find or access"."""
    from dsaops.deploy import read_extra_vars

    (tmp_path / "vars.yml").write_text("dsaops_server_port: 30123\n")
    result = print_commands("h20-8gpu", "-e", "@vars.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--port 30123" in result.stdout
    monkeypatch.chdir(tmp_path)
    assert read_extra_vars("@vars.yml") == (f"@{tmp_path}/vars.yml", {"dsaops_server_port": 30123})
    assert read_extra_vars('{"a": 1}') == ('{"a": 1}', {"a": 1}) and read_extra_vars("a=1 b='x y'")[1] == {
        "a": "1", "b": "x y"}


@pytest.mark.parametrize("extra, says", [
    ("@nofile.yml", "-e @nofile.yml: no such file ("),
    ("@adir", "adir is a folder; give a YAML or JSON file of variables"),
    ("@bin.json", "bin.json is not UTF-8 text (invalid start byte at byte 0): give a readable YAML or JSON file"),
    ("@broken.yml", "-e @broken.yml is not valid JSON or YAML at line 2, column 1 ("),
    ("@list.yml", "-e @list.yml holds no mapping of variables; give NAME: VALUE lines or a JSON object"),
    ("@empty.yml", "-e @empty.yml holds no mapping of variables"),
    ('{bad json', "an -e argument starting with { is not valid JSON or YAML at line 1, column 10 ("),
    ('{"dsaops_api_key": "hf_abc",', "an -e argument starting with { is not valid JSON or YAML"),
    ("[1]", "an -e argument starting with [ holds no mapping of variables"),
    ("./vars.yml", "-e ./vars.yml: give a file of variables with @, as -e @./vars.yml"),
    ("[" * 100_000, "an -e argument starting with [ nests deeper than the parser follows"),
    ("@deep.json", "-e @deep.json nests deeper than the parser follows"),
    ("@deep.yml", "-e @deep.yml nests deeper than the parser follows"),
])
def test_bad_extra_vars_are_one_line_and_exit_2(tmp_path, extra, says):
    """They used to reach Ansible, which printed some 40 lines in colour and exit 1."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "bin.json").write_bytes(bytes(range(128, 256)))
    (tmp_path / "broken.yml").write_text("a: [\n")
    (tmp_path / "list.yml").write_text("- 1\n")
    (tmp_path / "empty.yml").write_text("")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    (tmp_path / "deep.yml").write_text("a:\n" + "".join(" " * i + "- \n" for i in range(1000)))  # 0.5 MB: under the 1 MiB read
    result = print_commands("h20-8gpu", "-e", extra, cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "hf_abc" not in result.stderr


@pytest.mark.parametrize("extra, says", [
    ("@/dev/zero", "-e @/dev/zero: /dev/zero is not a regular file (a pipe or device); give a YAML or JSON file"),
    ("@fifo", "fifo is not a regular file (a pipe or device); give a YAML or JSON file of variables"),
    ("@big.yml", "big.yml is larger than 1 MiB: give a readable YAML or JSON file of variables"),
])
def test_an_extra_vars_file_is_read_to_a_bound(tmp_path, extra, says):
    """/dev/zero and a pipe hung deploy, and a file of any size was read whole into memory."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big.yml").write_text("# " + "x" * (1 << 20) + "\n")
    result = print_commands("h20-8gpu", "-e", extra, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and says in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_an_unreadable_extra_vars_file_is_one_line():
    """A regular file whose read fails (root reads any mode, so not a chmod 000 file)."""
    from dsaops.deploy import read_extra_vars

    with pytest.raises(UserError, match=r"^cannot read -e @/proc/self/mem: /proc/self/mem: Input/output error; "
                                        r"give a readable YAML or JSON file of variables$"):
        read_extra_vars("@/proc/self/mem")


def test_ansible_tags_and_vaults_in_an_extra_vars_file_pass_to_ansible(tmp_path):
    from dsaops.deploy import _Opaque, read_extra_vars

    (tmp_path / "tagged.yml").write_text('x: !unsafe "{{ y }}"\n')
    (tmp_path / "vault.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n3036\n")
    assert isinstance(read_extra_vars(f"@{tmp_path}/tagged.yml")[1]["x"], _Opaque)
    assert read_extra_vars(f"@{tmp_path}/vault.yml") == (f"@{tmp_path}/vault.yml", None)


def test_the_monitoring_stack_runs_as_its_images_users_with_a_password_file():
    """The containers' `docker run` arguments as the monitoring role gives them: no root, and Grafana's admin
    password from a file (never the default, never in its environment)."""
    tasks = yaml.safe_load((PLAYBOOKS / "roles/monitoring/tasks/containers.yml").read_text())
    containers = {c["name"]: c["args"] for c in tasks[0]["ansible.builtin.set_fact"]["monitoring_containers"]}
    defaults = yaml.safe_load((PLAYBOOKS / "roles/monitoring/defaults/main.yml").read_text())
    for name, uid in (("dsaops-prometheus", "prometheus"), ("dsaops-alertmanager", "alertmanager"),
                      ("dsaops-grafana", "grafana")):
        args = containers[name]
        user = args[args.index("--user") + 1]
        assert user == f"{{{{ monitoring_{uid}_uid }}}}:{{{{ monitoring_{uid}_uid }}}}", user
        assert defaults[f"monitoring_{uid}_uid"] not in (0, 65534)     # neither root nor nobody
    grafana = containers["dsaops-grafana"]
    assert "GF_SECURITY_ADMIN_PASSWORD__FILE=/run/secrets/grafana-admin-password" in grafana
    assert not any(a.startswith("GF_SECURITY_ADMIN_PASSWORD=") for a in grafana)
    assert defaults["monitoring_grafana_admin_password"] == "" and "password" in defaults[
        "monitoring_grafana_admin_password_value"]


def role_here(tmp_path, role, *flags, env=None, tasks_from=None, fails=False, **extra) -> subprocess.CompletedProcess:
    """One role (or one of its task files) on this machine (a one-node cluster reached locally), its machine-wide
    paths under tmp_path/root; the run must succeed, or with `fails` stop."""
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"dsaops_cluster": {"children": {
        "dsaops_head": {"hosts": {"here": {"ansible_connection": "local",
                                           "ansible_python_interpreter": sys.executable}}}}}}}}))
    run = ({"tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}]} if tasks_from
           else {"roles": [role]})
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "dsaops_cluster", "gather_facts": False, **run}]))
    settings = {"dsaops_root": str(tmp_path / "root"), "dsaops_target": "sm_90", "dsaops_api_key": "k" * 20,
                "preflight_plan": {}, **extra}
    result = _run(str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"),
                  *flags, "-e", json.dumps(settings), env={"ANSIBLE_ROLES_PATH": str(PLAYBOOKS / "roles"), **(env or {})})
    assert (result.returncode != 0) == fails, result.stdout[-3000:]
    return result


def monitoring_role(tmp_path, *flags, **extra) -> subprocess.CompletedProcess:
    """The monitoring role on this machine, its exporter neither started nor probed unless `extra` says so."""
    return role_here(tmp_path, "monitoring", *flags,
                     **{"monitoring_exporter_start": False, "monitoring_probe_exporter": False, **extra})


def render_exporter(tmp_path, **extra) -> str:
    """The monitoring role in check mode (nothing written, nothing started): the exporter's start script as it
    would render, from --diff."""
    result = monitoring_role(tmp_path, "--check", "--diff", **extra)
    assert not (tmp_path / "root").exists()
    script = result.stdout.split("TASK [monitoring : Render the exporter's start script]", 1)[1].split("TASK [", 1)[0]
    return "\n".join(line[1:] for line in script.splitlines() if line.startswith("+") and not line.startswith("+++"))


def render_stack(tmp_path, **extra) -> tuple[subprocess.CompletedProcess, str]:
    """The monitoring host's stack in check mode (nothing written, nothing started): the run, and the configuration
    files as they would render, from --diff."""
    result = role_here(tmp_path, "monitoring", "--check", "--diff", tasks_from="stack", monitoring_start="no",
                       **{f"monitoring_{what}": str(REPO / "healthchecks" / path) for what, path in (
                           ("rules_glob", "rules/*.yml"), ("dashboards_glob", "dashboards/*.json"),
                           ("dashboard_provider", "dashboards/provisioning/dashboards.yml"))}, **extra)
    config = result.stdout.split("TASK [monitoring : Configure Prometheus and the Grafana datasource]", 1)[1]
    return result, config.split("TASK [", 1)[0]


@pytest.mark.parametrize("listen, address, target", [("::1", "[::1]:9093", "[::1]:9093"),
                                                    ("::", "[::]:9093", "[::1]:9093")])
def test_alertmanager_on_ipv6_listens_and_is_reached_in_brackets(tmp_path, listen, address, target):
    """'::' written bare would be ':::9093', which neither Alertmanager nor Prometheus parses: the listen address
    and Prometheus's target (loopback for a wildcard, as the exporter's probe) carry IPv6 in brackets."""
    result, config = render_stack(tmp_path, monitoring_alertmanager_listen=listen)
    assert f'- targets: ["{target}"]' in config
    assert f"alerts show in Alertmanager ({address}) and go nowhere" in result.stdout
    tasks = yaml.safe_load((PLAYBOOKS / "roles/monitoring/tasks/containers.yml").read_text())
    alertmanager = next(c for c in tasks[0]["ansible.builtin.set_fact"]["monitoring_containers"]
                        if c["name"] == "dsaops-alertmanager")
    assert "--web.listen-address={{ monitoring_alertmanager_address }}" in alertmanager["args"]


@pytest.mark.parametrize("listen, url", [(None, "http://127.0.0.1:9090"), ("10.0.0.7", "http://10.0.0.7:9090"),
                                         ("::", "http://[::1]:9090")])
def test_prometheus_listens_on_loopback_unless_asked_and_grafana_follows(tmp_path, listen, url):
    """Prometheus asks no password: it listened on every address; Grafana's datasource reaches it where it listens."""
    _, config = render_stack(tmp_path, **({"monitoring_prometheus_listen": listen} if listen else {}))
    assert f'url: "{url}"' in config
    tasks = yaml.safe_load((PLAYBOOKS / "roles/monitoring/tasks/containers.yml").read_text())
    prometheus = next(c for c in tasks[0]["ansible.builtin.set_fact"]["monitoring_containers"]
                      if c["name"] == "dsaops-prometheus")
    assert "--web.listen-address={{ monitoring_prometheus_address }}" in prometheus["args"]
    defaults = yaml.safe_load((PLAYBOOKS / "roles/monitoring/defaults/main.yml").read_text())
    assert defaults["monitoring_prometheus_listen"] == "127.0.0.1"


@pytest.mark.parametrize("settings, exporter, server", [
    ({}, "here:9860", "here:30000"),
    ({"dsaops_exporter_listen_host": "10.0.0.5"}, "10.0.0.5:9860", "here:30000"),
    ({"dsaops_server_listen_host": "10.0.0.6"}, "here:9860", "10.0.0.6:30000")])
def test_prometheus_scrapes_a_listener_at_the_address_it_listens_on(tmp_path, settings, exporter, server):
    """An exporter or server bound to one address answers there only: Prometheus scrapes that address, else
    (unset: every address) the node's."""
    _, config = render_stack(tmp_path, **settings)
    assert f'- targets: ["{exporter}"]' in config and f'- targets: ["{server}"]' in config


def test_the_exporter_reads_the_plan_where_the_server_writes_it(tmp_path):
    """One folder for the plan and the keys: moved with dsaops_config_dir, the exporter's mounts follow."""
    server = print_commands("h20-8gpu", "-e", "dsaops_config_dir=/srv/dsaops-conf")
    assert server.returncode == 0, server.stderr[-3000:]
    assert "--volume /srv/dsaops-conf/plan.json:/srv/dsaops-conf/plan.json:ro" in server.stdout
    exporter = render_exporter(tmp_path, dsaops_config_dir="/srv/dsaops-conf")
    assert "--volume /srv/dsaops-conf/plan.json:/srv/dsaops-conf/plan.json:ro" in exporter
    assert "--plan /srv/dsaops-conf/plan.json" in exporter and "/etc/dsaops/plan.json" not in exporter
    assert "/srv/dsaops-conf/exporter/api-key" in exporter and "/etc/dsaops" not in exporter


def test_a_new_plan_re_creates_the_exporter(tmp_path):
    """The exporter reads plan.json only at start (its pool and binding, which the alerts weigh): its start script
    names the plan's checksum, so a new plan changes the script and the role re-creates the containers."""
    plan = {"kv_pool_tokens_per_rank": 2400000, "binding_limit": "kv"}
    written = json.dumps(plan, indent=4, sort_keys=True) + "\n"  # the server role's plan.json (to_nice_json)
    assert hashlib.sha256(written.encode()).hexdigest() in render_exporter(tmp_path, preflight_plan=plan)


@contextlib.contextmanager
def answering(host: str, headers: list | None = None):
    """A real HTTP server on `host` (a free port) that answers every GET with 200: yields it and the paths asked
    (and appends each request's headers to `headers`)."""
    asked = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            if headers is not None:
                headers.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.HTTPServer((host, 0), Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield server, asked
        finally:
            server.shutdown()


def test_the_exporter_is_probed_at_the_address_it_listens_on(tmp_path):
    """An exporter bound to one address answers there and nowhere else (not on 127.0.0.1): the role's probe
    reaches a real listener on 127.0.0.2, with the scrape token, which the run's output does not show."""
    headers = []
    with answering("127.0.0.2", headers) as (exporter, probed):
        result = monitoring_role(tmp_path, "-v", dsaops_exporter_mode="inside", monitoring_probe_exporter=True,
                                 dsaops_exporter_token=SCRAPE_TOKEN,
                                 dsaops_exporter_listen_host="127.0.0.2", dsaops_exporter_port=exporter.server_port)
    assert probed == ["/metrics"] and headers[0]["Authorization"] == f"Bearer {SCRAPE_TOKEN}"
    assert SCRAPE_TOKEN not in result.stdout + result.stderr


SCRAPE_TOKEN = "the-scrape-token-0123456789"


def test_the_scrape_token_reaches_the_exporter_and_prometheus_only(tmp_path):
    """One token: on the node a file only the exporter's user reads, mounted into the exporter's container alone
    and named by --token-file; on the monitoring host a file only Prometheus' user reads, beside prometheus.yml,
    which names it in the exporters' job (relative: /etc/prometheus/exporter-token in the container)."""
    for host in ("node", "mon"):
        (tmp_path / host).mkdir()
    monitoring_role(tmp_path / "node", monitoring_exporter_kmsg=False, dsaops_exporter_token=SCRAPE_TOKEN)
    token = tmp_path / "node/root/etc/dsaops/exporter/token"
    exporter_uid = MONITORING["monitoring_exporter_uid"]
    assert (token.read_text(), token.stat().st_mode & 0o777, token.stat().st_uid, token.stat().st_gid) == (
        SCRAPE_TOKEN + "\n", 0o400, exporter_uid, exporter_uid)
    script = (tmp_path / "node/root/usr/local/bin/dsaops-exporter").read_text()
    proxy, exporter = (line for line in script.splitlines() if line.startswith("docker run"))
    assert "token" not in proxy and SCRAPE_TOKEN not in script
    assert "--volume /etc/dsaops/exporter/token:/etc/dsaops/exporter/token:ro" in exporter
    assert "--token-file /etc/dsaops/exporter/token" in exporter

    role_here(tmp_path / "mon", "monitoring", tasks_from="stack", monitoring_start="no", dsaops_exporter_token=SCRAPE_TOKEN,
              **{f"monitoring_{what}": str(REPO / "healthchecks" / path) for what, path in (
                  ("rules_glob", "rules/*.yml"), ("dashboards_glob", "dashboards/*.json"),
                  ("dashboard_provider", "dashboards/provisioning/dashboards.yml"))})
    prometheus = tmp_path / "mon/root/etc/dsaops/prometheus"
    token = prometheus / "exporter-token"
    prometheus_uid = MONITORING["monitoring_prometheus_uid"]
    assert (token.read_text(), token.stat().st_mode & 0o777, token.stat().st_uid, token.stat().st_gid) == (
        SCRAPE_TOKEN + "\n", 0o400, prometheus_uid, prometheus_uid)
    jobs = yaml.safe_load((prometheus / "prometheus.yml").read_text())["scrape_configs"]
    assert [job.get("authorization") for job in jobs] == [{"type": "Bearer", "credentials_file": "exporter-token"}, None]
    assert SCRAPE_TOKEN not in (prometheus / "prometheus.yml").read_text()



STACK = {f"monitoring_{what}": str(REPO / "healthchecks" / path) for what, path in (
    ("rules_glob", "rules/*.yml"), ("dashboards_glob", "dashboards/*.json"),
    ("dashboard_provider", "dashboards/provisioning/dashboards.yml"))}


def test_a_uid_a_host_account_has_stops_the_role_before_anything_is_written(tmp_path):
    """A host user with the exporter's uid, or a group with Prometheus' gid, could read the files given to that
    container: the role stops naming the variable, nothing written; a number no account has passes and owns
    them. The accounts are this machine's own (a root prefix moves files, not accounts): none is created here."""
    users, groups = pwd.getpwall(), grp.getgrall()
    user = next((u for u in users if 1 <= u.pw_uid <= 65533), None)
    group = next((g for g in groups if 1 <= g.gr_gid <= 65533 and g.gr_gid not in {u.pw_uid for u in users}), None)
    if user is None or group is None:
        pytest.skip("needs a user, and a group of a number no user has, between 1 and 65533 on this machine")
    taken = {u.pw_uid for u in users} | {g.gr_gid for g in groups} | {MONITORING[n] for n in UIDS}
    free = next(n for n in range(60600, 61184) if n not in taken)
    for what in ("node", "mon", "free"):
        (tmp_path / what).mkdir()

    refused = monitoring_role(tmp_path / "node", fails=True, monitoring_exporter_kmsg=False,
                              monitoring_exporter_uid=user.pw_uid)
    assert (f"here: monitoring_exporter_uid={user.pw_uid} is user {user.pw_name}'s uid on this host, which could read "
            "that container's files; set monitoring_exporter_uid to a number no user or group here has") in \
        folded(refused.stdout)
    refused = role_here(tmp_path / "mon", "monitoring", tasks_from="stack", fails=True, monitoring_start="no",
                        monitoring_prometheus_uid=group.gr_gid, **STACK)
    assert (f"here: monitoring_prometheus_uid={group.gr_gid} is group {group.gr_name}'s gid on this host"
            in folded(refused.stdout))
    assert not (tmp_path / "node/root").exists() and not (tmp_path / "mon/root").exists()

    monitoring_role(tmp_path / "free", monitoring_exporter_kmsg=False, monitoring_exporter_uid=free)
    for path in ("etc/dsaops/exporter/token", "etc/dsaops/exporter/api-key", "var/lib/dsaops/exporter"):
        stat = (tmp_path / "free/root" / path).stat()
        assert (stat.st_uid, stat.st_gid) == (free, free), path
    run_dir = (tmp_path / "free/root/run/dsaops").stat()
    assert (run_dir.st_uid, run_dir.st_gid) == (MONITORING["monitoring_docker_proxy_uid"],) * 2


def test_alertmanagers_receivers_stay_out_of_the_runs_diff(tmp_path):
    """alertmanager.yml is its user's alone (a webhook URL or SMTP password may be a secret): `--diff` printed it
    whole; the file is still written, the output names it only."""
    hook, password = "https://hooks.example/services/T0/B0/hook-secret-0123", "smtp-secret-0123456789"
    result = role_here(tmp_path, "monitoring", "--diff", "-vvv", tasks_from="stack", monitoring_start="no",
                       monitoring_alert_webhook_url=hook,
                       monitoring_alertmanager_global={"smtp_smarthost": "smtp.example.org:587",
                                                       "smtp_from": "dsaops@example.org",
                                                       "smtp_auth_password": password},
                       **{f"monitoring_{what}": str(REPO / "healthchecks" / path) for what, path in (
                           ("rules_glob", "rules/*.yml"), ("dashboards_glob", "dashboards/*.json"),
                           ("dashboard_provider", "dashboards/provisioning/dashboards.yml"))})
    written = tmp_path / "root/etc/dsaops/alertmanager/alertmanager.yml"
    assert hook in written.read_text() and password in written.read_text() and written.stat().st_mode & 0o777 == 0o600
    assert hook not in result.stdout + result.stderr and password not in result.stdout + result.stderr
    assert "+  - job_name: " in result.stdout      # the other files' diffs are still shown


def test_an_exporter_inside_the_server_container_gets_the_token(printed):
    """dsaops_exporter_mode inside: the server container's exporter listens on dsaops_exporter_listen_host (every
    address), so it gets the token file, mounted read-only; the exporter's own container leaves it out."""
    inside = print_commands("h20-8gpu", "-e", "dsaops_exporter_mode=inside")
    assert inside.returncode == 0, inside.stderr[-3000:]
    for text, expected in ((inside.stdout, True), (printed["h20-8gpu"].stdout, False)):
        assert ("--env DSAOPS_EXPORTER_TOKEN_FILE=/etc/dsaops/exporter-token " in text) == expected
        assert ("--volume /etc/dsaops/exporter-token:/etc/dsaops/exporter-token:ro" in text) == expected


@pytest.mark.parametrize("docker_says", ["removed", "none there"])
def test_a_switch_to_the_exporter_inside_retires_its_own_containers_and_secrets(tmp_path, docker_says):
    """Left from container mode, they would hold the port the exporter inside binds, and their key and token copies
    would stay: both containers go (a Docker that finds none is no failure) and both files."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "docker.log"
    answer = ('shift 2; printf "%s\\n" "$@"' if docker_says == "removed"
              else 'echo "Error response from daemon: No such container: dsaops-exporter" >&2; exit 1')
    (fake / "docker").write_text(f'#!/bin/sh\necho "$@" >> {log}\n{answer}\n')
    (fake / "docker").chmod(0o755)
    folder = tmp_path / "root/etc/dsaops/exporter"
    folder.mkdir(parents=True)
    for name in ("api-key", "token"):
        (folder / name).write_text("old-secret-0123456789\n")
    result = role_here(tmp_path, "monitoring", tasks_from="retire", env={"PATH": f"{fake}{os.pathsep}{ENV['PATH']}"})
    assert log.read_text() == "rm --force dsaops-docker-proxy dsaops-exporter\n"
    assert not (folder / "api-key").exists() and not (folder / "token").exists()
    assert ("changed=2" if docker_says == "removed" else "changed=1") in result.stdout


def test_the_server_role_retires_the_exporters_containers_before_an_inside_start():
    tasks = yaml.safe_load((PLAYBOOKS / "roles/sglang_server/tasks/main.yml").read_text())
    names = [task["name"] for task in tasks]
    retire = tasks[names.index("Retire the exporter's own containers, which the exporter inside the server replaces")]
    assert retire["ansible.builtin.include_role"]["tasks_from"] == "retire" and "inside" in retire["when"]
    assert names.index(retire["name"]) < names.index("Start or restart the server")


def test_the_head_is_awaited_at_the_address_it_listens_on(tmp_path):
    """A server bound to one address answers /health only there: the health wait reaches a real listener on
    127.0.0.2 (with 127.0.0.1 it retries, then stops the run)."""
    with answering("127.0.0.2") as (server, probed):
        role_here(tmp_path, "sglang_server", tasks_from="health", preflight_targets=json.loads(targets.as_json()),
                  sglang_server_start=True,
                  dsaops_server_listen_host="127.0.0.2", dsaops_server_port=server.server_port,
                  sglang_server_health_probe_timeout=1, sglang_server_health_wait_s=6)
    assert probed == ["/health"]


def test_the_server_containers_checks_reach_it_at_the_address_it_listens_on(printed):
    """The image's health check and an exporter inside the server container read DSAOPS_SERVER_HOST."""
    assert "--env DSAOPS_SERVER_HOST=127.0.0.1 " in printed["h20-8gpu"].stdout
    bound = print_commands("h20-8gpu", "-e", "dsaops_server_listen_host=10.0.0.5")
    assert bound.returncode == 0, bound.stderr[-3000:]
    assert "--host 10.0.0.5 " in bound.stdout and "--env DSAOPS_SERVER_HOST=10.0.0.5 " in bound.stdout


@pytest.mark.parametrize("listen_host, url", [("0.0.0.0", "http://127.0.0.1:30000"),
                                              ("127.0.0.2", "http://127.0.0.2:30000"), ("::", "http://[::1]:30000")])
def test_the_exporter_reads_the_server_at_the_address_it_listens_on(tmp_path, listen_host, url):
    assert f"--server-url {shlex.quote(url)} " in render_exporter(tmp_path, dsaops_server_listen_host=listen_host)


def test_the_download_token_goes_once_the_inventory_no_longer_gives_it(tmp_path):
    """The root-only copy of HF_TOKEN an earlier download left on the source node stays while HF_TOKEN is given
    and is removed by the first run without it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    token = tmp_path / "root/etc/dsaops/weights-hf-token"
    token.parent.mkdir(parents=True)
    token.write_text("hf_earlier\n")
    role_here(tmp_path, "weights", env={"HF_TOKEN": "hf_earlier"}, dsaops_model_path=str(model))
    assert token.read_text() == "hf_earlier\n"
    role_here(tmp_path, "weights", env={"HF_TOKEN": ""}, dsaops_model_path=str(model))
    assert not token.exists()


def test_a_sysctl_the_kernel_lacks_stops_before_the_file_is_written(tmp_path):
    """A mistyped extra key has no /proc/sys file: the run stops before the sysctl.d file (which the next boot
    would apply) is written."""
    fake_kernel(tmp_path / "root", sshd_pid=4242)
    result = role_here(tmp_path, "host_memory", fails=True, host_memory_extra_sysctls={"vm.swapiness": 10})
    assert "vm/swapiness" in result.stdout
    assert not (tmp_path / "root/etc/sysctl.d").exists()


FAKE_DOCKER = r"""#!/bin/sh
# A Docker engine that remembers each container's labels: `run` records them, `inspect` answers as the role asks
# (running, and the dsaops.args label when asked), `rm` forgets; every call is logged.
state="$(dirname "$0")/containers"
mkdir -p "$state"
echo "$*" >> "$(dirname "$0")/calls"
case "$1" in
  inspect) [ -f "$state/$4" ] || exit 1
           case "$3" in *dsaops.args*) printf 'true %s\n' "$(cat "$state/$4")" ;; *) echo true ;; esac ;;
  rm) rm -f "$state/$3" ;;
  run) name=""; label="<no value>"; prev=""
       for a in "$@"; do
         [ "$prev" = --name ] && name="$a"
         [ "$prev" = --label ] && label="${a#dsaops.args=}"
         prev="$a"
       done
       printf '%s' "$label" > "$state/$name" ;;
esac
"""


def test_a_changed_listen_address_re_creates_the_stacks_container(tmp_path):
    """Prometheus moved from every address back to loopback is started again with the new address, though none
    of its files changed; a run with nothing changed starts nothing."""
    docker = tmp_path / "bin/docker"
    docker.parent.mkdir()
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    path = {"PATH": f"{docker.parent}{os.pathsep}{ENV['PATH']}"}
    stack = {f"monitoring_{what}": str(REPO / "healthchecks" / where) for what, where in (
        ("rules_glob", "rules/*.yml"), ("dashboards_glob", "dashboards/*.json"),
        ("dashboard_provider", "dashboards/provisioning/dashboards.yml"))}
    calls = tmp_path / "bin/calls"

    def runs(listen: str) -> list[str]:
        calls.unlink(missing_ok=True)
        role_here(tmp_path, "monitoring", tasks_from="stack", env=path, monitoring_start="yes", network_firewall=False,
                  monitoring_prometheus_listen=listen, **stack)
        return [line for line in calls.read_text().splitlines() if line.startswith("run ")]

    assert any("--web.listen-address=0.0.0.0:9090" in line for line in runs("0.0.0.0"))
    started = runs("127.0.0.1")
    assert len(started) == 1 and "--web.listen-address=127.0.0.1:9090" in started[0], started
    assert runs("127.0.0.1") == []


def test_the_unified_memory_guard_counts_the_kernels_whole_reserve(tmp_path):
    """MemAvailable loses each zone's high watermark, min + 2 x max(min/4, MemTotal x watermark_scale_factor/10000),
    not min_free_kbytes alone: 12 GiB of it on a 121 GiB GB10 at --mem-fraction-static 0.8 reserves 18 GiB, which
    leaves no 8 GiB headroom."""
    fake_kernel(tmp_path / "root", sshd_pid=4242, memtotal_kib=127_000_000)
    result = role_here(tmp_path, "host_memory", fails=True, host_memory_unified_memory=True,
                       dsaops_mem_fraction_static=0.8, host_memory_min_free_kbytes=12 * 1024 * 1024)
    assert "On unified memory (GB10) vm.min_free_kbytes comes out of the memory SGLang sees" in result.stdout
    assert not (tmp_path / "root/etc").exists()
    role_here(tmp_path, "host_memory", host_memory_unified_memory=True, dsaops_mem_fraction_static=0.8)
