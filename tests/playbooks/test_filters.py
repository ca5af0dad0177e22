"""The playbooks' Jinja filters (playbooks/roles/dsaops/filter_plugins/dsaops_library.py), called as Ansible calls them."""
import importlib.util

import pytest
from ansible.errors import AnsibleFilterError

from tests.playbooks.ansible_sandbox import PLAYBOOKS

_SPEC = importlib.util.spec_from_file_location("dsaops_library", PLAYBOOKS / "roles/dsaops/filter_plugins/dsaops_library.py")
library = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(library)

EXPORTER = {"image": "dsaops/sglang:x", "node": "n1", "server_container": "dsaops-sglang", "server_port": 30000,
            "listen": "0.0.0.0:9860", "log_file": "/var/log/dsaops/sglang.log", "state_dir": "/var/lib/dsaops/exporter",
            "run_dir": "/run/dsaops", "api_key_file": "/etc/dsaops/exporter/api-key", "docker_gid": 999, "plan": "",
            "uid": "60582", "proxy_uid": 60583}


@pytest.mark.parametrize("kmsg, reads_kmsg", [(True, True), ("true", True), ("yes", True),
                                              (False, False), ("false", False), ("no", False)])
def test_a_switch_given_as_a_string_reads_as_ansible_reads_it(kmsg, reads_kmsg):
    """`-e monitoring_exporter_kmsg=false` reaches the filter as the string 'false': it turns /dev/kmsg off, and
    with it the exporter's uid 0 for its own (monitoring_exporter_uid, given as a string too)."""
    settings = {**EXPORTER, "kmsg": kmsg}
    proxy, exporter = (container["args"] for container in library.exporter_containers(settings))
    assert ("/dev/kmsg:/dev/kmsg:r" in exporter) is reads_kmsg
    # the users the role gives the exporter's and the proxy's folders are the ones they run as
    users = library.exporter_users(settings)
    assert users == {"exporter": 0 if reads_kmsg else 60582, "proxy": 60583}
    for args, uid in ((exporter, users["exporter"]), (proxy, users["proxy"])):
        assert args[args.index("--user") + 1] == f"{uid}:{uid}"
    # the exporter reaches the proxy's socket through the proxy's group, as root or as its own user
    assert exporter[exporter.index("--group-add") + 1] == "60583"


def test_the_monitoring_set_holds_each_monitoring_hosts_addresses_merged():
    """Each host's ansible_host and cluster address, and `allow`, merged; a host reached locally (the controller)
    too: its scrapes reach the other nodes from that address, not from loopback."""
    hostvars = {"mon": {"ansible_host": "10.0.0.5", "dsaops_cluster_address": "192.168.100.9"},
                "here": {"ansible_connection": "local", "ansible_host": "10.9.9.9"}}
    assert library.monitoring_sources(["mon", "here"], hostvars, ["10.0.0.0/24"], ["node1"]) == (
        "10.0.0.0/24, 10.9.9.9, 192.168.100.9")
    assert library.monitoring_sources(["here"], hostvars, [], ["node1"]) == "10.9.9.9"
    with pytest.raises(AnsibleFilterError, match="dsaops_monitoring_allow: .*give IPv4 addresses or networks"):
        library.monitoring_sources(["mon"], hostvars, ["10.0.0.0/8 } accept; #"])
    # a name no resolver is asked about (an empty label): the message, without waiting on DNS
    with pytest.raises(AnsibleFilterError, match="monitoring host mon: cannot resolve 'no..such' to an IPv4 address"):
        library.monitoring_sources(["mon"], {"mon": {"ansible_host": "no..such"}})


@pytest.mark.parametrize("facts", [{}, {"ansible_host": "127.0.0.1"}, {"dsaops_cluster_address": "127.0.0.1"}])
def test_a_local_monitoring_host_without_an_address_the_nodes_see_is_refused(facts):
    """Its scrapes leave by an address the inventory does not name, which the nodes' fence would drop: the run
    stops naming ansible_host, unless the one node it fences is itself (its own traffic arrives on loopback)."""
    hostvars = {"here": {"ansible_connection": "local", **facts}}
    with pytest.raises(AnsibleFilterError, match=r"^monitoring host here: .*set its ansible_host to"):
        library.monitoring_sources(["here"], hostvars, [], ["here", "node1"])
    assert library.monitoring_sources(["here"], hostvars, [], ["here"]) in ("", "127.0.0.1")
    assert library.monitoring_sources(["here"], {"here": {**hostvars["here"], "dsaops_cluster_address": "10.1.0.2"}},
                                      [], ["here", "node1"]).startswith("10.1.0.2")


def test_a_local_monitoring_host_fencing_only_nodes_on_its_own_machine_is_admitted():
    """A node reached locally or at a loopback address is the controller's machine too: the scrapes arrive there on
    loopback, so nothing is refused (a one-machine test cluster); a node named otherwise still stops the run."""
    hostvars = {"here": {"ansible_connection": "local"}, "n1": {"ansible_host": "127.0.0.1"},
                "n2": {"ansible_connection": "local"}, "far": {"ansible_host": "node-far"}}
    assert library.monitoring_sources(["here"], hostvars, [], ["n1", "n2"]) in ("", "127.0.0.1")
    with pytest.raises(AnsibleFilterError, match=r"^monitoring host here: "):
        library.monitoring_sources(["here"], hostvars, [], ["n1", "far"])


def test_a_local_monitoring_host_whose_address_is_in_allow_is_admitted():
    """dsaops_monitoring_allow is where the sources the inventory does not name go: the controller's address
    listed there admits its scrapes, so the run goes on."""
    hostvars = {"here": {"ansible_connection": "local"}}
    assert library.monitoring_sources(["here"], hostvars, ["10.9.9.9"], ["here", "node1"]) == "10.9.9.9"


@pytest.mark.parametrize("listen_host, probed", [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"),
                                                 ("10.0.0.5", "10.0.0.5"), ("::", "[::1]"), ("::1", "[::1]"),
                                                 ("fd00::5", "[fd00::5]")])
def test_a_probe_reaches_the_address_its_listener_is_bound_to(listen_host, probed):
    """A wildcard bind answers on loopback; a named address answers only on itself (IPv6 bracketed for a URL)."""
    assert library.probe_host(listen_host, "dsaops_exporter_listen_host") == probed


@pytest.mark.parametrize("listen_host, scraped", [("0.0.0.0", "node-1.lan"), ("127.0.0.1", "node-1.lan"),
                                                  ("10.0.0.5", "10.0.0.5"), ("::", "node-1.lan"),
                                                  ("fd00::5", "[fd00::5]")])
def test_a_scrape_reaches_a_nodes_listener_at_the_one_address_it_is_bound_to(listen_host, scraped):
    """From another machine: the node's own address for a wildcard bind, or for loopback (which that machine would
    take for its own: the scrape fails at the node instead); else the bound address, IPv6 bracketed."""
    assert library.scrape_host(listen_host, "node-1.lan", "dsaops_exporter_listen_host") == scraped
    assert library.scrape_host("0.0.0.0", "fd00::9", "dsaops_exporter_listen_host") == "[fd00::9]"


@pytest.mark.parametrize("listen_host, address", [("127.0.0.1", "127.0.0.1:9093"), ("::", "[::]:9093"),
                                                  ("fd00::5", "[fd00::5]:9093")])
def test_a_listen_address_brackets_ipv6(listen_host, address):
    assert library.listen_address(listen_host, 9093, "monitoring_alertmanager_listen") == address
    with pytest.raises(AnsibleFilterError, match="monitoring_alertmanager_listen: 'am.lan' is not an IP address"):
        library.listen_address("am.lan", 9093, "monitoring_alertmanager_listen")


def test_a_probe_host_that_is_no_address_is_named():
    with pytest.raises(AnsibleFilterError, match="dsaops_exporter_listen_host: 'exporter.lan' is not an IP address"):
        library.probe_host("exporter.lan", "dsaops_exporter_listen_host")


def test_the_extra_arguments_win_over_the_inventory_in_the_plan():
    """The server starts with the extras after the inventory's flags, so the plan takes theirs; a value the planner
    cannot take comes back as the one-line error the preflight shows."""
    cluster = {"gpus_per_node": "8", "tp_size": "8", "attn_dp_size": "8", "kv_cache_dtype": "fp8_e4m3",
               "dsa_prefill_backend": "tilelang", "dsa_decode_backend": "tilelang", "mem_fraction_static": "0.85",
               "gpu_memory_gib": "96", "weights_gib": None, "max_running_requests": "240"}
    inventory = library.plan(cluster, target="sm_90", nodes=1)["plan"]
    read = library.extras(["--trust-remote-code", "--disable-radix-cache", "--context-len", "8192"])
    assert read["error"] is None
    extra = library.plan(cluster, target="sm_90", nodes=1, extras=read["settings"])["plan"]
    assert extra["context_length"] == 8192 != inventory["context_length"]
    assert (inventory["mamba_slots_source"], extra["mamba_slots_source"]) == ("auto", "--max-running-requests")
    assert "--context-length 8192" in " ".join(extra["sglang_args"])
    assert library.extras(["--context-length", "0"]) == {"settings": None, "error": (
        "sglang_server_extra_args: --context-length must be a whole number from 1 to 2147483647, got '0'; fix the "
        "value or drop the flag")}
    assert library.extras(["--context-length", "128k"])["settings"] == {"--context-length": 128_000}


def test_adaptive_steps_in_the_extra_arguments_are_planned_without_attention_dp_only():
    """SGLang turns --speculative-adaptive off under attention DP, which the inventory sets: the plan refuses it there."""
    cluster = {"gpus_per_node": "8", "tp_size": "8", "attn_dp_size": "1", "kv_cache_dtype": "fp8_e4m3",
               "dsa_prefill_backend": "tilelang", "dsa_decode_backend": "tilelang", "mem_fraction_static": "0.85",
               "gpu_memory_gib": "96", "weights_gib": None, "max_running_requests": "48"}
    read = library.extras(["--speculative-adaptive", "--speculative-algorithm", "NEXTN"])
    assert read == {"settings": {"--speculative-adaptive": True, "--speculative-num-draft-tokens": 4}, "error": None}
    planned = library.plan(cluster, target="sm_90", nodes=1, extras=read["settings"])["plan"]
    assert any(a.startswith("--speculative-adaptive: ") for a in planned["assumptions"])
    dp = library.plan({**cluster, "attn_dp_size": "8"}, target="sm_90", nodes=1, extras=read["settings"])
    assert dp == {"plan": None, "error": "SGLang turns --speculative-adaptive off under attention DP (size 8: its step "
                                         "choices are not kept alike across DP ranks) and runs the static steps; drop it"}


def test_a_revision_reaches_only_a_server_that_downloads_the_model_itself():
    """Staged weights are the revision already (the weights role downloaded them at it): their server gets the mount
    alone; a server that downloads the Hub id at start gets --revision after it; without one, neither does."""
    cluster = {"tp_size": 8, "attn_dp_size": 1, "ep_size": 1, "kv_cache_dtype": "fp8_e4m3", "dsa_prefill_backend":
               "tilelang", "dsa_decode_backend": "tilelang", "mem_fraction_static": None, "max_running_requests": None,
               "dist_init_port": 25000, "server_port": 30000, "model_path": "zai-org/GLM-5.3-Flash",
               "model_revision": "v1"}
    node = {"nnodes": 1, "node_rank": 0, "dist_init_addr": "10.0.0.1:25000", "host": "0.0.0.0", "enable_metrics": False,
            "target": "sm_90"}
    assert library.sglang_args(cluster, **node)[:4] == ["--model-path", "zai-org/GLM-5.3-Flash", "--revision", "v1"]
    staged = library.sglang_args(cluster, **node, model_path="/models/GLM-5.3-Flash")
    assert staged[:2] == ["--model-path", "/models/GLM-5.3-Flash"] and "--revision" not in staged
    assert "--revision" not in library.sglang_args({**cluster, "model_revision": ""}, **node)
