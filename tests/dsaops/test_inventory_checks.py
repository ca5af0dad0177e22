"""dsaops.inventory_checks: the one table of what an inventory value may be (the playbook runs that use it
are in tests/playbooks)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from dsaops.healthchecks.http import serve

from dsaops.inventory_checks import (
    KINDS,
    SECRET_VARIABLES,
    UIDS,
    VALUES,
    VARIABLES,
    names,
    port_collisions,
    refusal,
    refusals,
)

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
ROLE_DEFAULTS = {k: v for path in sorted(PLAYBOOKS.glob("roles/*/defaults/main.yml"))
                 for k, v in (yaml.safe_load(path.read_text()) or {}).items()}


def _resolved(value):
    """A default with its plain `{{ name }}` references to other plain defaults filled in (paths such
    as "{{ dsaops_config_dir }}/prometheus"); anything else as it is."""
    if not isinstance(value, str):
        return value
    return re.sub(r"\{\{ ([a-z_]+) \}\}",
                  lambda m: str(ROLE_DEFAULTS.get(m.group(1), m.group(0))), value)


def test_every_variable_in_the_table_is_one_the_playbooks_read():
    text = "\n".join(p.read_text() for p in PLAYBOOKS.rglob("*") if p.suffix in (".yml", ".j2"))
    assert [name for name in VARIABLES if name not in text] == []
    assert set(VARIABLES.values()) <= set(KINDS)


@pytest.mark.parametrize("name", [n for n in VARIABLES if n in ROLE_DEFAULTS and "{{" not in str(_resolved(ROLE_DEFAULTS[n]))])
def test_the_defaults_pass(name):
    assert refusal(name, _resolved(ROLE_DEFAULTS[name])) is None


@pytest.mark.parametrize("name", [n for n, kind in VARIABLES.items() if kind not in ("sysctls", "env")])
def test_a_newline_is_refused_everywhere(name):
    value = ROLE_DEFAULTS.get(name)
    value = value if isinstance(value, str) and "{{" not in value and value else "x"
    hostile = [f"{value}\ntouch /tmp/x"] if VARIABLES[name] in ("args", "cidrs", "interfaces") else f"{value}\ntouch /tmp/x"
    assert refusal(name, hostile) is not None, name


@pytest.mark.parametrize("name, good, bad", [
    ("dsaops_tp_size", 8, 0), ("dsaops_server_port", "30000", 99999), ("dsaops_image", "registry.lan:5000/dsaops/sglang:dev-sm_90", ""),
    ("dsaops_cluster_address", "192.168.100.1", "10.0.0.256"), ("network_firewall_allow", ["10.0.0.0/24"],
                                                                ["1.2.3.4; flush ruleset"]),
    ("ansible_host", "spark-1.local", "10.0.0.1 -oProxyCommand=x"), ("dsaops_cluster_interface", "enp1s0f0np0", "eth0 x"),
    ("dsaops_mem_fraction_static", 0.85, 1.5), ("dsaops_model_path", "zai-org/GLM-5.3-Flash", "../../etc"),
    ("sglang_server_extra_args", ["--trust-remote-code"], ["--api-key", "k"]),
    ("sglang_server_extra_env", {"A_B": "x y"}, {"A-B": "x"}), ("host_memory_sshd_oom_score_adj", -900, "-900x"),
    ("dsaops_api_key", "", "short"), ("dsaops_api_key", "a" * 16, "a" * 15 + " "),
    ("dsaops_exporter_mode", "inside", "contianer"), ("sglang_server_supervisor", "docker", "systemd-run"),
    ("monitoring_start", "no", "maybe"),
    ("sglang_server_memory_gate_gib", 107.3, "1$(touch /tmp/x)"), ("sglang_server_memory_gate_gib", "12.5", "12\n"),
    ("sglang_server_memory_gate_gib", 0.5, "nan"), ("monitoring_exporter_api_key_file", "/etc/dsaops/exporter/api-key",
                                                  "/etc/x; touch /tmp/x"),
    ("weights_hf_token_file", "/etc/dsaops/weights-hf-token", "weights-hf-token"),
    ("host_memory_sshd_pidfile", "/run/sshd.pid", "/run/$(id).pid"), ("sglang_server_root", "", "/srv/root x"),
    ("host_memory_root", "/srv/roots/node1", "srv"), ("weights_root", "", "/x\n"),
    ("sglang_server_selftest_heads", 32, 0), ("sglang_server_selftest_heads", "1024", 1025),
    ("host_memory_extra_sysctls", {"vm.swappiness": 10}, {"vm.swappiness": "10\nkernel.sysrq = 1"}),
    ("host_memory_max_reserved_percent", 10, 0), ("host_memory_max_reserved_percent", "25", 26),
    ("host_memory_max_reserved_percent", 1, "100"), ("host_memory_os_headroom_mib", 8192, 0),
    ("host_memory_os_headroom_mib", "262144", 262145), ("host_memory_os_headroom_mib", 1, "-8192"),
    ("monitoring_prometheus_uid", 60580, 0), ("monitoring_alertmanager_uid", "60581", 65534),
    ("monitoring_exporter_uid", 1, "60582x"), ("monitoring_docker_proxy_uid", 65533, 70000),
    ("monitoring_grafana_uid", 472, True), ("dsaops_model_revision", "", "v1 --force"),
    ("dsaops_model_revision", "refs/pr/12", "../main"), ("dsaops_model_revision", "0123abc", "a//b"),
    ("dsaops_model_revision", "v1.0-rc_2", "main/"), ("dsaops_model_revision", "main", "-main"),
])
def test_each_kind_takes_what_it_should_and_refuses_the_rest(name, good, bad):
    assert refusal(name, good) is None
    assert refusal(name, bad).startswith(name)


@pytest.mark.parametrize("name", [n for n, kind in VARIABLES.items() if kind == "port"])
@pytest.mark.parametrize("value", ["08000", "030000", "0022", "00"])
def test_a_port_with_a_leading_zero_is_refused(name, value):
    """YAML reads an unquoted 010 as octal 8 while -e and an INI inventory pass "010" on as written: a port
    written with a leading zero is in doubt, so every port variable refuses it, saying why."""
    assert refusal(name, value) == (f"{name}={value!r} is refused: it must be a TCP port, 1 to 65535, without "
                                    "leading zeros (YAML reads 010 as octal 8).")
    assert refusal(name, value.lstrip("0") or "1") is None


@pytest.mark.parametrize("path", ["/data/models/GLM-5.3-Flash/", "/data/models/GLM-5.3-Flash/..", "/data/models/.", "/"])
def test_a_model_folder_without_a_name_of_its_own_is_refused(path):
    """Its basename names the mount, the served model, the weights folder and the manifest: a tab-completed
    trailing '/' gave /models/ and no --served-model-name, and staged the copy into the folder of every model."""
    assert refusal("dsaops_model_path", path).startswith(f"dsaops_model_path={path!r} is refused")
    assert refusal("dsaops_model_path", path.rstrip("/.") or "/x") is None


def test_a_revision_of_a_model_folder_is_refused_in_one_line():
    """A folder's checkpoint is whatever the folder holds: a revision beside it would be ignored in silence."""
    folder = {"dsaops_model_path": "/data/models/GLM-5.3-Flash", "dsaops_model_revision": "v1"}
    assert refusals(folder) == [("dsaops_model_revision='v1' is refused: dsaops_model_path='/data/models/GLM-5.3-Flash' "
                                 "is a folder, which has no revision; drop dsaops_model_revision, or set "
                                 "dsaops_model_path to the Hugging Face id.")]
    assert refusals({**folder, "dsaops_model_revision": ""}) == []
    assert refusals({**folder, "dsaops_model_path": "zai-org/GLM-5.3-Flash"}) == []


def test_two_containers_on_one_uid_are_refused_in_one_line():
    """Each container's files are its own only while no other container runs as its uid: two variables of one
    number (written as a string or not) are named together; a value refused on its own is not counted twice."""
    assert set(UIDS) == {"monitoring_prometheus_uid", "monitoring_alertmanager_uid", "monitoring_grafana_uid",
                         "monitoring_exporter_uid", "monitoring_docker_proxy_uid"}
    defaults = {name: ROLE_DEFAULTS[name] for name in UIDS}
    assert refusals(defaults) == [] and len(set(defaults.values())) == len(UIDS)
    assert 65534 not in defaults.values()
    assert refusals({**defaults, "monitoring_exporter_uid": "60580"}) == [
        "monitoring_prometheus_uid and monitoring_exporter_uid share uid 60580: give each container a uid of its own."]
    assert refusals({**defaults, "monitoring_exporter_uid": 0, "monitoring_docker_proxy_uid": 0}) == [
        f"{name}=0 is refused: it must be a whole number from 1 to 65533: a uid of the container's own, not root (0) "
        "or nobody." for name in ("monitoring_exporter_uid", "monitoring_docker_proxy_uid")]


def test_a_refused_secret_is_named_but_never_shown():
    [line] = refusals({"sglang_server_hf_token": "hf_secret\nEVIL=1"})
    assert line.startswith("sglang_server_hf_token (not shown) is refused") and "hf_secret" not in line
    assert refusals({"unknown_variable": "\n", "dsaops_mem_fraction_static": None}) == []


def test_a_mistyped_exporter_mode_names_the_allowed_values():
    """A typo used to turn the exporter off silently (neither mode's tasks run)."""
    line = refusal("dsaops_exporter_mode", "contianer")
    assert line.startswith("dsaops_exporter_mode='contianer' is refused: it must be container (")
    assert "or inside (" in line and "\n" not in line


def test_the_renamed_folders_are_refused_naming_their_new_names():
    """sglang_server_config_dir, sglang_server_log_dir and sglang_server_listen_host became dsaops_config_dir,
    dsaops_log_dir and dsaops_server_listen_host (the exporter reads the plan and the log in those folders, and
    reaches the server at that address): an inventory that still sets an old name stops instead of being ignored."""
    assert refusals({"sglang_server_config_dir": "/srv/dsaops"}) == [
        "sglang_server_config_dir='/srv/dsaops' is refused: it is dsaops_config_dir now; set that instead."]
    assert refusal("sglang_server_log_dir", "/srv/logs") == (
        "sglang_server_log_dir='/srv/logs' is refused: it is dsaops_log_dir now; set that instead.")
    assert {"sglang_server_config_dir", "sglang_server_log_dir"} <= set(names("sglang_server_"))
    assert refusal("sglang_server_listen_host", "10.0.0.5") == (
        "sglang_server_listen_host='10.0.0.5' is refused: it is dsaops_server_listen_host now; set that instead.")
    assert refusal("sglang_server_config_dir", None) is None and refusal("dsaops_config_dir", "/srv/dsaops") is None


def test_a_mistyped_supervisor_names_the_allowed_values():
    """The print-commands path runs no argument_specs: this rule is its only check."""
    line = refusal("sglang_server_supervisor", "systemd-run")
    assert line.startswith("sglang_server_supervisor='systemd-run' is refused: it must be auto (")
    assert "systemd (a unit) or docker (" in line and "\n" not in line


@pytest.mark.parametrize("bare", [True, False])
def test_a_bare_yes_or_no_for_monitoring_start_says_to_quote_it(bare):
    """`monitoring_start: yes` in an inventory arrives as true, which the role's test for 'yes' would miss."""
    line = refusal("monitoring_start", bare)
    assert line.startswith(f"monitoring_start={bare!r} is refused: it must be auto (")
    assert "'yes' or 'no' (quoted" in line and "\n" not in line
    assert refusal("monitoring_start", "yes") is None


@pytest.mark.parametrize("host", ["::", "::1"])
def test_an_ipv6_exporter_address_is_refused_naming_an_ipv4_one(host):
    """The exporter would fail only once started ("Address family not supported"): the inventory says so first."""
    assert refusal("dsaops_exporter_listen_host", host) == (
        f"dsaops_exporter_listen_host={host!r} is refused: it must be an IPv4 address such as 0.0.0.0 (every address) "
        "or 127.0.0.1: the exporter listens on IPv4 only.")
    assert refusal("dsaops_exporter_listen_host", "10.0.0.5") is None


def test_the_exporter_cannot_listen_on_ipv6_which_is_why_the_rule_refuses_it():
    """Pins the rule to the server: once the exporter's server binds IPv6, this fails and the rule (and the fence's
    IPv4-only sets) must change with it."""
    with pytest.raises(OSError, match="[Aa]ddress family"):
        serve(object(), "::1", 0).server_close()


@pytest.mark.parametrize("args", [["--api-k", "k"], ["--admin-api=k"], ["--a", "k"], ["--config", "/srv/x.yaml"],
                                  ["--trust-remote-code", "--conf=/srv/x.yaml"]])
def test_extra_args_may_not_set_a_key_or_a_config_file_by_any_spelling(args):
    """SGLang's parser takes abbreviations, and a second --config would carry flags of its own."""
    line = refusal("sglang_server_extra_args", args)
    assert line.startswith("sglang_server_extra_args (not shown) is refused: it must be a list of strings")
    assert "--config or an abbreviation of them" in line and "\n" not in line


def test_extra_args_that_set_a_key_are_refused_without_showing_it():
    """The message repeated the key the arguments carried (on the terminal, in Ansible's output)."""
    for args in (["--api-key", "sk-supersecret-1234567890"], ["--trust-remote-code", "--admin-api-key=sk-supersecret-1234567890"]):
        assert "sk-supersecret" not in refusal("sglang_server_extra_args", args)
    assert "'--x\\n'" in refusal("sglang_server_extra_args", ["--x\n"])    # a control character: shown, to find it


def test_extra_args_that_only_resemble_those_flags_pass():
    assert refusal("sglang_server_extra_args", ["--trust-remote-code", "--context-length", "8192", "--",
                                                "--api-key-x", "--served-model-name=config"]) is None


@pytest.mark.parametrize("name", ["dsaops_api_key", "dsaops_admin_api_key"])
def test_an_api_key_starting_with_a_dash_is_refused(name):
    assert refusal(name, "-" + "a" * 20) == (f"{name} (not shown) is refused: it must be empty (generated), or at least "
                                             "16 printable characters without spaces, not starting with '-'.")
    assert refusal(name, "a-" + "a" * 20) is None
    assert refusal("monitoring_grafana_admin_password", "-" + "a" * 20) is None    # a file, never a flag's value


def test_sglang_reads_those_spellings_as_the_rules_assume(tmp_path):
    """Pins both rules to the pinned SGLang's --config merge and argparse: a key starting with '-' stops the parse,
    and an abbreviated flag after --config replaces the file's key."""
    from tests.support.sglang_definitions import parse_server_args

    config = tmp_path / "sglang-secrets.yaml"
    config.write_text(yaml.safe_dump({"api-key": "-" + "a" * 20}))
    with pytest.raises(SystemExit):
        parse_server_args(["--model-path", "/models/x", "--config", str(config)])
    config.write_text(yaml.safe_dump({"api-key": "k" * 20}))
    args, _ = parse_server_args(["--model-path", "/models/x", "--config", str(config), "--api-k", "mine"])
    assert args.api_key == "mine"


def test_port_collisions_name_each_shared_port_once():
    assert port_collisions({"dsaops_server_port": 30000, "derived": [30013, 30234], "dsaops_exporter_port": "9860",
                            "monitoring_grafana_port": 30013, "monitoring_prometheus_port": 9090}) == [
        "port 30013 is both derived and monitoring_grafana_port"]
    assert port_collisions({"a": 1, "b": "1", "c": [1]}) == ["port 1 is both a and b and c"]
    assert port_collisions({"a": 1, "b": [2, 3]}) == []


@pytest.mark.parametrize("key, variable", [("vm.min_free_kbytes", "host_memory_min_free_kbytes"),
                                           ("vm.vfs_cache_pressure", "host_memory_vfs_cache_pressure"),
                                           ("vm.watermark_boost_factor", "host_memory_watermark_boost_factor")])
def test_an_extra_sysctl_may_not_pass_the_guard_rails_by_another_name(key, variable):
    """The role checks these three through their own variables; set as extras they would win unchecked."""
    line = refusal("host_memory_extra_sysctls", {key: 100_000_000})
    assert line is not None and variable in line


def test_every_value_a_role_writes_a_key_into_is_checked():
    assert sorted(VALUES) == sorted(name for name in ROLE_DEFAULTS if name.endswith("_value"))


@pytest.mark.parametrize("name, dash", [(name, kind == "secret_value") for name, kind in sorted(VALUES.items())])
def test_a_key_in_use_set_directly_is_checked_as_the_key_it_replaces(name, dash):
    """`-e @FILE` (or the inventory) may set the *_value keys the roles write, past the key rules; checked here, by
    dsaops deploy, and never queried by the playbooks' check, which would render the default's password lookup
    (it writes the generated key, even under --print-commands). Empty would start SGLang without a key."""
    for bad in ("short", "k" * 15 + " ", "k" * 20 + "\n", ""):
        [line] = refusals({name: bad})
        assert line.startswith(f"{name} (not shown) is refused: it must be at least 16 printable") and (bad == "" or bad not in line)
    assert (refusal(name, "-" + "k" * 20) is None) is dash
    assert refusal(name, "k" * 20) is None and name in SECRET_VARIABLES and name not in names()
