"""What an inventory value may be before any playbook template renders it: one table for every role.

Every variable that reaches a rendered file (a shell script systemd runs as root, a systemd unit, an
nftables rule set, a YAML configuration) or a command has a kind here, and each kind a rule. The
playbooks ask `refusals({name: value})` through the dsaops_refusals filter (check-inventory.yml
for the whole inventory before anything runs, and the first task of each role for its own
variables): each refusal is one line naming the variable, its value and what it may be. The
templates still quote for their own language; this table keeps out what no quoting makes safe
(a newline in a unit file, a `;` in an nftables rule) and what SGLang or Docker would refuse later.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping

from dsaops.kernels.route import HEADS_MOST

# SGLang's parser takes any unambiguous prefix (allow_abbrev), so "--api-k" is --api-key too
_REFUSED_FLAGS = ("--api-key", "--admin-api-key", "--config")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9])?")
IMAGE_REFERENCE = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]{1,5})?(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*"
                             r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?")
_PATH = re.compile(r"(/[A-Za-z0-9_.+@-]+)+/?|/")
_HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# a branch, tag or commit of a Hub repository, as `hf download --revision` and SGLang's --revision take it
# (no '..', and a '/' only between two names)
_REVISION = re.compile(r"(?!.*\.\.)[A-Za-z0-9](?:[A-Za-z0-9_.-]|/(?=[A-Za-z0-9_.-]))*")
_SECRET = re.compile(r"[\x21-\x7e]*")     # printable ASCII, no space: one word in a file, a header, YAML
_SIZE = re.compile(r"[0-9]+[bkmg]?", re.IGNORECASE)
_DURATION = re.compile(r"([0-9]+(ms|s|m|h))+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# the host_memory role's own settings: as extras they would override its checked values unchecked
_GUARDED_SYSCTLS = ("vm.min_free_kbytes", "vm.vfs_cache_pressure", "vm.watermark_boost_factor")


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value):
        return int(value)
    return None


def _match(pattern: re.Pattern) -> Callable[[object], bool]:
    return lambda v: isinstance(v, str) and pattern.fullmatch(v) is not None


def _parses(parse: Callable[[str], object]) -> Callable[[object], bool]:
    """A check that `value` is a string `parse` (an ipaddress constructor) takes without ValueError."""
    def check(value) -> bool:
        if not isinstance(value, str):
            return False
        try:
            parse(value)
        except ValueError:
            return False
        return True
    return check


_ipv4 = _parses(ipaddress.IPv4Address)
_ip = _parses(ipaddress.ip_address)
_cidr = _parses(lambda v: ipaddress.IPv4Network(v, strict=False))


def _list_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _float(value) -> float | None:
    # float() also takes "12\n", "nan" and "1e3": a template would render them as given
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        return float(value)
    return None


def _between(low: float, high: float, whole: bool = True) -> Callable[[object], bool]:
    def check(value) -> bool:
        number = _int(value) if whole else _float(value)
        return number is not None and low <= number <= high
    return check


def _no_control(value) -> bool:
    return isinstance(value, str) and not any(ord(c) < 32 or ord(c) == 127 for c in value)


def _model_folder(value) -> bool:
    # its last name names the mount, --served-model-name, the weights folder and the manifest
    return _match(_PATH)(value) and value.rsplit("/", 1)[1] not in ("", ".", "..")


def _secret(value) -> bool:
    return value == "" or (_match(_SECRET)(value) and len(value) >= 16)


def _api_key(value) -> bool:
    # SGLang's --config merge hands the key to argparse, which reads a value starting with '-' as a flag
    return _secret(value) and not value.startswith("-")


def _refused_flag(argument: str) -> bool:
    name = argument.split("=", 1)[0]
    return len(name) > 2 and name.startswith("--") and any(flag.startswith(name) for flag in _REFUSED_FLAGS)


def _sets_a_key(value) -> bool:
    """Whether extra args name a refused flag: the value beside it may be a key, so the refusal shows none."""
    return isinstance(value, list) and any(isinstance(a, str) and _refused_flag(a) for a in value)


def _env(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and ENV_NAME.fullmatch(k) and _no_control(str(v)) for k, v in value.items())


# kind: (check, what a value of that kind may be)
KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "host": (lambda v: _match(_HOST)(v) or _ip(v), ("a host name or address: letters, digits, '.', '-', '_' (no spaces "
                                                   "or newlines)")),
    "name": (_match(_NAME), "a name of letters, digits, '_', '.', '-' (as Docker allows), starting with a letter or digit"),
    "interface": (_match(re.compile(r"[A-Za-z0-9_.-]{1,15}")), ("a network interface name: at most 15 letters, digits, "
                                                                "'_', '.', '-'")),
    "interfaces": (_list_of(_match(re.compile(r"[A-Za-z0-9_.-]{1,64}"))), ("a list of device names (letters, digits, "
                                                                           "'_', '.', '-')")),
    "ipv4": (_ipv4, "an IPv4 address such as 192.168.100.1"),
    "ip": (_ip, "an IP address such as 0.0.0.0 or 127.0.0.1"),
    # the exporter's HTTP server (healthchecks/http.py) binds IPv4 sockets, and the fence admits IPv4 sources only
    "exporter_listen": (_ipv4, ("an IPv4 address such as 0.0.0.0 (every address) or 127.0.0.1: the exporter "
                                "listens on IPv4 only")),
    "cidrs": (_list_of(_cidr), "a list of IPv4 addresses or networks such as 10.0.0.0/24"),
    # YAML reads an unquoted 010 as octal 8, -e and INI inventories pass "010" on: either is in doubt
    "port": (lambda v: _between(1, 65535)(v) and not str(v).startswith("0"),
             "a TCP port, 1 to 65535, without leading zeros (YAML reads 010 as octal 8)"),
    "positive": (_between(1, 1 << 20), "a whole number of 1 or more"),
    "heads": (_between(1, HEADS_MOST), f"a whole number of q heads from 1 to {HEADS_MOST} (dsaops kernels selftest --heads)"),
    "seconds": (_between(1, 1 << 31), "a whole number of seconds, 1 or more"),
    "fraction": (_between(0.01, 0.99, whole=False), "a fraction between 0 and 1, e.g. 0.85"),
    "gib": (_between(0.01, 1 << 20, whole=False), "a positive number of GiB"),
    "root_or_registry": (lambda v: v == "" or _match(re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*"))(v),
                         "empty, or a registry prefix such as registry.lan:5000/team"),
    "image": (_match(IMAGE_REFERENCE), ("a Docker image reference such as registry:5000/dsaops/sglang:TAG-sm_90 "
                                        "(not empty)")),
    "path": (_match(_PATH), "an absolute path of letters, digits and '_', '.', '+', '@', '-' (no spaces)"),
    "root": (lambda v: v == "" or _match(_PATH)(v), ("empty, or an absolute path of letters, digits and '_', '.', '+', "
                                                      "'@', '-'")),
    "model": (lambda v: _model_folder(v) or _match(_HF_ID)(v),
              "a Hugging Face id (org/name) or the absolute path of the checkpoint's folder, without a trailing '/'"),
    "revision": (lambda v: v == "" or _match(_REVISION)(v),
                 ("empty (the repository's default branch), or a branch, tag or commit of the model's Hub repository: "
                  "letters, digits, '_', '.', '-', '/'")),
    "secret": (_secret, "empty (generated), or at least 16 printable characters without spaces"),
    "api_key": (_api_key, "empty (generated), or at least 16 printable characters without spaces, not starting with '-'"),
    # the key in use (a *_value variable): empty would start SGLang without one
    "api_key_value": (lambda v: v != "" and _api_key(v),
                      "at least 16 printable characters without spaces, not starting with '-'"),
    "secret_value": (lambda v: v != "" and _secret(v), "at least 16 printable characters without spaces"),
    "token": (_match(_SECRET), "printable characters without spaces or newlines"),
    "size": (_match(_SIZE), "a size such as 32g"),
    "duration": (_match(_DURATION), "a Prometheus duration such as 5s"),
    "args": (lambda v: _list_of(_no_control)(v) and not _sets_a_key(v),
             ("a list of strings without newlines or other control characters, and without --api-key, "
              "--admin-api-key, --config or an abbreviation of them (set dsaops_api_key / dsaops_admin_api_key: "
              "they stay off the command line)")),
    "env": (_env, "a mapping of NAME (letters, digits, '_') to values without newlines"),
    "url": (lambda v: v == "" or (_no_control(v) and re.fullmatch(r"https?://\S+", v) is not None),
            "empty, or an http(s) URL without spaces"),
    "docker_host": (lambda v: v == "" or (_no_control(v) and re.fullmatch(r"(unix|tcp|ssh)://\S+", v) is not None),
                    "empty, or a Docker address such as unix:///run/docker.sock"),
    "levels": (_match(re.compile(r"[0-9]+(,[0-9]+)*")), "comma-separated whole numbers such as 1,2"),
    "mtu": (_between(576, 9216), "an MTU of 576 to 9216"),
    "oom_score": (_between(-1000, 1000), "a whole number from -1000 to 1000"),
    # a container's own user and group: not root, not nobody (65534), within the 65536 ids a user namespace maps
    "uid": (_between(1, 65533), "a whole number from 1 to 65533: a uid of the container's own, not root (0) or nobody"),
    # min_free_kbytes's ceiling: past a quarter of MemTotal the kernel's free reserve starves the server and the OS
    "reserved_percent": (_between(1, 25), "a whole percentage of MemTotal from 1 to 25"),
    "headroom_mib": (_between(1, 1 << 18), "a whole number of MiB from 1 to 262144 (256 GiB)"),
    "exporter_mode": (lambda v: v in ("container", "inside"),
                      "container (its own container) or inside (the server container's entrypoint runs it)"),
    "supervisor": (lambda v: v in ("auto", "systemd", "docker"),
                   ("auto (systemd where the node runs it, else docker), systemd (a unit) or docker (a detached "
                    "container with Docker's restart policy)")),
    # YAML reads a bare yes or no as a boolean, which the monitoring role's test for 'yes' misses
    "monitoring_start": (lambda v: v in ("auto", "yes", "no"),
                         ("auto (where Docker answers), 'yes' or 'no' (quoted: YAML reads a bare yes or no as "
                          "true or false)")),
    "sysctls": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and re.fullmatch(r"vm\.[a-z_]+", k)
                                                      and k not in _GUARDED_SYSCTLS and _int(x) is not None
                                                      for k, x in v.items()),
                ("a mapping of vm.* keys to whole numbers, without vm.min_free_kbytes, vm.vfs_cache_pressure and "
                 "vm.watermark_boost_factor (set host_memory_min_free_kbytes, host_memory_vfs_cache_pressure and "
                 "host_memory_watermark_boost_factor, which the guard rails check)")),
}

# variable: kind. Variables that are unset (None) are skipped.
VARIABLES: dict[str, str] = {
    "inventory_hostname": "host", "ansible_host": "host",
    "dsaops_target": "name", "dsaops_image": "image", "dsaops_image_registry": "root_or_registry",
    "dsaops_docker_host": "docker_host", "dsaops_model_path": "model", "dsaops_model_revision": "revision",
    "dsaops_weights_source_host": "host",
    "dsaops_weights_dir": "path", "dsaops_gpus_per_node": "positive", "dsaops_tp_size": "positive",
    "dsaops_attn_dp_size": "positive", "dsaops_ep_size": "positive", "dsaops_kv_cache_dtype": "name",
    "dsaops_dsa_prefill_backend": "name", "dsaops_dsa_decode_backend": "name", "dsaops_gpu_memory_gib": "gib",
    "dsaops_weights_gib": "gib", "dsaops_max_running_requests": "positive", "dsaops_mem_fraction_static": "fraction",
    "dsaops_cluster_interface": "interface", "dsaops_cluster_address": "ipv4", "dsaops_ib_hca": "interfaces",
    "dsaops_server_container": "name", "dsaops_exporter_container": "name", "dsaops_log_dir": "path", "dsaops_config_dir": "path",
    "dsaops_server_port": "port", "dsaops_server_listen_host": "ip", "dsaops_dist_init_port": "port",
    "dsaops_exporter_mode": "exporter_mode",
    "dsaops_exporter_port": "port", "dsaops_exporter_listen_host": "exporter_listen", "dsaops_monitoring_allow": "cidrs",
    "dsaops_root": "root", "dsaops_api_key": "api_key", "dsaops_admin_api_key": "api_key",
    "dsaops_exporter_token": "secret", "monitoring_exporter_token_file": "path",
    "network_mtu": "mtu", "network_firewall_file": "path", "network_firewall_allow": "cidrs",
    "sglang_server_extra_args": "args", "sglang_server_extra_env": "env",
    "sglang_server_hf_token": "token", "sglang_server_container_name": "name", "sglang_server_shm_size": "size",
    "sglang_server_memory_limit": "size", "sglang_server_memory_gate_gib": "gib",
    "sglang_server_memory_wait_s": "seconds", "sglang_server_memory_poll_s": "seconds", "sglang_server_stop_timeout": "seconds",
    "sglang_server_hf_cache": "path",
    "sglang_server_script": "path", "sglang_server_cache_dir": "path", "sglang_server_selftest_heads": "heads",
    "sglang_server_supervisor": "supervisor", "sglang_server_health_probe_timeout": "seconds",
    "sglang_server_health_wait_s": "seconds", "sglang_server_smoke_bench_concurrency": "levels",
    "monitoring_exporter_api_key_file": "path", "monitoring_exporter_state_dir": "path",
    "monitoring_exporter_run_dir": "path", "monitoring_exporter_script": "path",
    "monitoring_prometheus_dir": "path", "monitoring_alertmanager_dir": "path", "monitoring_grafana_dir": "path",
    "monitoring_prometheus_data_dir": "path", "monitoring_alertmanager_data_dir": "path",
    "monitoring_prometheus_image": "image", "monitoring_alertmanager_image": "image",
    "monitoring_grafana_image": "image", "monitoring_prometheus_port": "port", "monitoring_alertmanager_port": "port",
    "monitoring_grafana_port": "port", "monitoring_scrape_interval": "duration", "monitoring_alertmanager_listen": "ip",
    "monitoring_prometheus_listen": "ip",
    "monitoring_alert_webhook_url": "url", "monitoring_datasource_uid": "name",
    "monitoring_grafana_admin_password": "secret", "monitoring_start": "monitoring_start",
    "monitoring_prometheus_uid": "uid", "monitoring_alertmanager_uid": "uid", "monitoring_grafana_uid": "uid",
    "monitoring_exporter_uid": "uid", "monitoring_docker_proxy_uid": "uid", "image_source": "host",
    "transfer_dir": "path", "transfer_user": "name", "transfer_authorized_keys": "path", "transfer_host_key": "path",
    "transfer_port": "port", "weights_manifest": "path", "weights_log_dir": "path", "weights_hash_jobs": "positive",
    "weights_hf_token": "token", "weights_hf_token_file": "path", "weights_check_record": "path",
    "weights_hf_cli": "root", "weights_hf_endpoint": "url", "host_memory_sysctl_file": "path",
    "host_memory_sshd_unit": "name", "host_memory_sshd_pidfile": "path",
    "host_memory_extra_sysctls": "sysctls", "host_memory_sshd_oom_score_adj": "oom_score",
    "sglang_server_oom_score_adj": "oom_score", "host_memory_max_reserved_percent": "reserved_percent",
    "host_memory_os_headroom_mib": "headroom_mib",
    "host_memory_root": "root", "monitoring_root": "root", "network_root": "root", "sglang_server_root": "root",
    "transfer_root": "root", "weights_root": "root",
}
# The keys the roles write (each default: the key set above, else the password lookup's generated one). Set
# directly (-e @FILE, the inventory), dsaops deploy checks them; names() leaves them out of the playbooks' check,
# which would render the default and so run the lookup, writing the generated key even under --print-commands.
VALUES: dict[str, str] = {"dsaops_api_key_value": "api_key_value", "dsaops_admin_api_key_value": "api_key_value",
                          "dsaops_exporter_token_value": "secret_value",
                          "monitoring_grafana_admin_password_value": "secret_value"}
# Variables renamed, old name: new name. A value set under the old name is refused, naming the new
# one, so that an inventory written for the old name stops instead of being ignored.
RENAMED: dict[str, str] = {"sglang_server_config_dir": "dsaops_config_dir", "sglang_server_log_dir": "dsaops_log_dir",
                           "sglang_server_listen_host": "dsaops_server_listen_host"}
_SECRETS = {"secret", "api_key", "token", "api_key_value", "secret_value"}     # never repeated in a message
# The variables of those kinds: what `ps` must never show on ansible-playbook's command line (dsaops deploy)
SECRET_VARIABLES = tuple(name for name, kind in (VARIABLES | VALUES).items() if kind in _SECRETS)
# The containers' users: each one's files are its alone only while no other container runs as its uid
UIDS = tuple(name for name, kind in VARIABLES.items() if kind == "uid")


def refusal(name: str, value) -> str | None:
    """Why `value` cannot be variable `name`, in one line; None when it can (or `name` is not in the table)."""
    if value is None:      # unset
        return None
    if name in RENAMED:
        return f"{name}={value!r} is refused: it is {RENAMED[name]} now; set that instead."
    kind = VARIABLES.get(name) or VALUES.get(name)
    if kind is None:
        return None
    check, allowed = KINDS[kind]
    if check(value):
        return None
    if kind in _SECRETS or (kind == "args" and _sets_a_key(value)):
        return f"{name} (not shown) is refused: it must be {allowed}."
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return f"{name}={shown} is refused: it must be {allowed}."


def refusals(values: Mapping[str, object]) -> list[str]:
    """One line per refused value, in the table's order, then one per uid two of the containers' users share, and
    one for a revision of a model that is a folder."""
    verdicts = {name: refusal(name, values[name]) for name in (*VARIABLES, *VALUES, *RENAMED) if name in values}
    return [line for line in verdicts.values() if line is not None] + _shared_uids(
        {name: values[name] for name in UIDS if name in verdicts and verdicts[name] is None and values[name] is not None}
    ) + _revision_of_a_folder(values.get("dsaops_model_path"), values.get("dsaops_model_revision"))


def _revision_of_a_folder(model, revision) -> list[str]:
    """A revision names a commit of a Hub repository: a folder's checkpoint is whatever the folder holds."""
    if revision and _model_folder(model):
        return [(f"dsaops_model_revision={revision!r} is refused: dsaops_model_path={model!r} is a folder, which has "
                 "no revision; drop dsaops_model_revision, or set dsaops_model_path to the Hugging Face id.")]
    return []


def _shared_uids(uids: Mapping[str, object]) -> list[str]:
    """One line for each uid two of `uids` ({variable: uid}) share: each container's must be its own."""
    claims: dict[int, list[str]] = {}
    for name, uid in uids.items():
        claims.setdefault(_int(uid), []).append(name)
    return [f"{' and '.join(names)} share uid {uid}: give each container a uid of its own."
            for uid, names in sorted(claims.items()) if len(names) > 1]


def names(prefix: str = "") -> list[str]:
    """The table's variables, and the renamed ones' old names, starting with `prefix` (all with '')."""
    return [name for name in (*VARIABLES, *RENAMED) if name.startswith(prefix)]


def port_collisions(ports: Mapping[str, object]) -> list[str]:
    """One line for each TCP port two of one host's listeners share; `ports` is {what: a port or a list of ports}."""
    claims: dict[int, list[str]] = {}
    for what, value in ports.items():
        for port in value if isinstance(value, list) else [value]:
            claims.setdefault(int(port), []).append(what)
    return [f"port {port} is both {' and '.join(names)}" for port, names in sorted(claims.items()) if len(names) > 1]
