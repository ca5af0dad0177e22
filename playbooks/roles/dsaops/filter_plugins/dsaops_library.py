"""The dsaops library inside the playbooks, as Jinja filters evaluated on the controller.

Every role depends on the dsaops role, so Ansible loads these wherever the roles run.

  preflight_cluster | dsaops_sglang_args(nnodes=, node_rank=, dist_init_addr=, host=,
                                         enable_metrics=, target=, plan=, extra_args=, model_path=,
                                         served_model_name=, config_file=)
      one node's whole `sglang.launch_server` argument list (dsaops.launch_args); the prefill
      bound is the plan's (fitted to its memory) or, without a plan, the targets table's; on one
      node the TCPStore's port (--nccl-port) is the dist-init port, which the network role fences
  extra_args | dsaops_plan_extras(env=)
      {"settings": what the server's extra arguments and environment set that `dsaops plan` models
      (dsaops.plan_extras), "error": null}, or {"settings": null, "error": why}
  preflight_cluster | dsaops_plan(target=, nodes=, extras=)
      {"plan": the `dsaops plan --json` object, "error": null}, or {"plan": null, "error": why}; the
      extras (dsaops_plan_extras' settings) win over the inventory's, as at launch
  preflight_cluster | dsaops_node_ranks(nodes=, extra_args=)
      {"ranks": the scheduler ranks, a GPU each, SGLang starts on one node with the inventory's
      parallelism and the extra arguments (dsaops.node_ranks), "error": null}, or {"ranks": null, "error": why}
  dsaops_target | dsaops_image(registry=)
      [REGISTRY/]dsaops/sglang:<SGLang pin>-<target>, the tag `make image` gives (dsaops.image)
  image | dsaops_image_load_needs(history=, held=, containerd=)
      the bytes `docker load` of the image (`docker image inspect`'s object; `history`: its `docker history`
      sizes) writes at its peak under the data root of an engine whose images have the layer lists `held`;
      `containerd`: both engines keep their images in containerd (dsaops.image_load)
  settings | dsaops_exporter_containers
      [{name, args}] of the node's Docker proxy and exporter containers (dsaops.healthchecks.deploy)
  settings | dsaops_exporter_users
      {exporter, proxy}: the uid (and gid) each of those containers runs as (dsaops.healthchecks.deploy)
  rule_files | dsaops_exporter_job
      the scrape job name the packaged alert rules select (dsaops.healthchecks.scrape)
  prefix | dsaops_checked_names
      the variables dsaops.inventory_checks has a rule for, starting with prefix ('' for all)
  {name: value} | dsaops_refusals
      one line per value that rule refuses, naming the variable (dsaops.inventory_checks)
  {what: port or ports} | dsaops_port_collisions
      one line per port two of one host's listeners share (dsaops.inventory_checks)
  {variable: uid} | dsaops_taken_uids(passwd, group)
      one line per uid a host account has, from `getent passwd` / `getent group` lines (dsaops.host_accounts)
  settings | dsaops_sglang_ports
      the ports SGLang opens for its own processes, which the network role fences (dsaops.sglang_ports)
  addresses | dsaops_nft_elements(what)
      IPv4 addresses and networks, checked and merged for an nftables set (dsaops.fence)
  monitoring_hosts | dsaops_monitoring_sources(hostvars, allow, nodes)
      the addresses the monitoring hosts scrape from, plus `allow`, for the fence's set on `nodes` (dsaops.fence)
  listen_host | dsaops_listen_address(port, what)
      listen_host:port as a listen flag takes it, IPv6 in brackets (dsaops.fence)
  listen_host | dsaops_probe_host(what)
      the URL host a probe on the same node reaches a listener on listen_host at (dsaops.fence)
  listen_host | dsaops_scrape_host(node_address, what)
      the URL host another machine reaches a node's listener on listen_host at (dsaops.fence)

`preflight_cluster` is the inventory's cluster-wide settings as preflight/tasks/inventory.yml
records them. The dsaops package is imported from this checkout (the folder that holds
playbooks/), so an ansible installed without dsaops runs these too.
"""
import dataclasses
import functools
import importlib
import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[4]   # playbooks/roles/dsaops/filter_plugins/
if (_CHECKOUT / "dsaops" / "__init__.py").is_file() and str(_CHECKOUT) not in sys.path:
    sys.path.insert(0, str(_CHECKOUT))

# importable only once the checkout is on the path. Ansible imports every filter plugin in the worker it
# forks for each task and host, so the heavier modules are imported by the filters that call them.
from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from dsaops.healthchecks import deploy, scrape

from dsaops import fence, host_accounts, image_load, sglang_ports
from dsaops.errors import UserError


def _int(value):
    return None if value is None else int(value)


def _float(value):
    return None if value is None else float(value)


def _bool(value):
    """As Jinja's `| bool` reads it: `-e name=false` arrives as the string 'false', which bool() calls true."""
    return boolean(value, strict=False)


def sglang_args(cluster, *, nnodes, node_rank, dist_init_addr, host, enable_metrics, target, plan=None, extra_args=(),
                model_path=None, served_model_name=None, config_file=None):
    from dsaops import targets
    from dsaops.launch_args import ClusterSpec, NodeSpec, launch_args
    chunk = plan["prefill_chunk_tokens"] if plan else targets.get(str(target)).chunked_prefill_size or None
    spec = ClusterSpec(
        tp_size=int(cluster["tp_size"]), attn_dp_size=int(cluster["attn_dp_size"]), ep_size=int(cluster["ep_size"]),
        nnodes=int(nnodes), kv_cache_dtype=str(cluster["kv_cache_dtype"]),
        dsa_prefill_backend=str(cluster["dsa_prefill_backend"]), dsa_decode_backend=str(cluster["dsa_decode_backend"]),
        mem_fraction_static=_float(cluster["mem_fraction_static"]),
        max_running_requests=_int(cluster["max_running_requests"]), chunked_prefill_size=_int(chunk),
        served_model_name=str(served_model_name) if served_model_name else None, enable_metrics=_bool(enable_metrics),
        nccl_port=int(cluster["dist_init_port"]) if int(nnodes) == 1 else None)
    node = NodeSpec(model_path=str(model_path or cluster["model_path"]), host=str(host), port=int(cluster["server_port"]),
                    node_rank=int(node_rank), dist_init_addr=str(dist_init_addr),
                    config_file=str(config_file) if config_file else None, extra_args=tuple(str(a) for a in extra_args),
                    # staged weights are the revision already: only a server that downloads them asks for it
                    model_revision=None if model_path else cluster.get("model_revision") or None)
    return launch_args(spec, node)


def extras(args, *, env=None):
    from dsaops import plan_extras
    try:
        return {"settings": plan_extras.read(args, env), "error": None}
    except UserError as e:
        return {"settings": None, "error": str(e)}


def plan(cluster, *, target, nodes, extras=None):
    from dsaops import plan_extras
    from dsaops.plan import PlanRequest, make_plan
    request = PlanRequest(
        target=str(target), nodes=int(nodes), gpus_per_node=int(cluster["gpus_per_node"]),
        tp_size=int(cluster["tp_size"]), attn_dp_size=int(cluster["attn_dp_size"]),
        kv_cache_dtype=str(cluster["kv_cache_dtype"]), dsa_prefill_backend=str(cluster["dsa_prefill_backend"]),
        dsa_decode_backend=str(cluster["dsa_decode_backend"]),
        mem_fraction_static=float(cluster["mem_fraction_static"]), gpu_memory_gib=float(cluster["gpu_memory_gib"]),
        weights_gib=_float(cluster["weights_gib"]), max_running_requests=_int(cluster["max_running_requests"]))
    try:
        request = dataclasses.replace(request, **plan_extras.request_fields(extras or {}))
        return {"plan": make_plan(request).to_json(), "error": None}
    except UserError as e:
        return {"plan": None, "error": str(e)}


def ranks(cluster, *, nodes, extra_args=()):
    from dsaops import node_ranks
    from dsaops.launch_args import ClusterSpec, cluster_args
    # the parallel flags as launch_args writes them, then the extras, as at launch: the last given wins
    spec = ClusterSpec(tp_size=int(cluster["tp_size"]), attn_dp_size=int(cluster["attn_dp_size"]), nnodes=int(nodes),
                       kv_cache_dtype=str(cluster["kv_cache_dtype"]))
    argv = [*cluster_args(spec), *(str(a) for a in extra_args)]
    try:
        return {"ranks": node_ranks.ranks_per_node(argv), "error": None}
    except node_ranks.BadArguments as e:
        return {"ranks": None, "error": f"sglang_server_extra_args: {e}; fix the value or drop the flag"}


def image(target, *, registry=""):
    from dsaops.image import image_name
    return image_name(str(target), registry=str(registry or ""))


def image_load_needs(image, *, history, held, containerd):
    return image_load.load_needs(int(image["Size"]), [str(layer) for layer in image["RootFS"].get("Layers") or []],
                                 [int(size) for size in history], [[str(layer) for layer in layers or []] for layers in held],
                                 containerd=containerd)


def _exporter(settings):
    return deploy.ExporterDeployment(**{**settings, "server_port": int(settings["server_port"]),
                                        "kmsg": _bool(settings["kmsg"]), "plan": settings.get("plan") or None,
                                        "uid": int(settings["uid"]), "proxy_uid": int(settings["proxy_uid"]),
                                        "docker_gid": int(settings.get("docker_gid", 0))})


def exporter_containers(settings):
    return deploy.containers(_exporter(settings))


def exporter_users(settings):
    return deploy.users(_exporter(settings))


def exporter_job(rule_files):
    return scrape.exporter_job([str(path) for path in rule_files])


def sglang_internal_ports(settings):
    return sglang_ports.internal_ports(server_port=int(settings["server_port"]),
                                       dist_init_port=int(settings["dist_init_port"]), nnodes=int(settings["nnodes"]),
                                       attn_dp_size=int(settings["attn_dp_size"]))


def _stops_the_run(fn):
    """The filter raises AnsibleFilterError with the one-line message of the UserError `fn` raises."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise AnsibleFilterError(str(e)) from None
    return wrapped


def _on_call(module, name):
    """dsaops.<module>.<name> as a filter that imports its module on its first call, not with the plugin."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(f"dsaops.{module}"), name)(*args, **kwargs)
    return call


@_stops_the_run
def nft_elements(addresses, what):
    return fence.nft_elements([str(a) for a in addresses], str(what))


@_stops_the_run
def monitoring_sources(hosts, hostvars, allow=(), nodes=()):
    return fence.monitoring_sources({str(host): hostvars[host] for host in hosts}, [str(a) for a in allow],
                                    {str(n): hostvars.get(n, {}) for n in nodes})


@_stops_the_run
def listen_address(listen_host, port, what):
    return fence.listen_address(str(listen_host), port, str(what))


@_stops_the_run
def probe_host(listen_host, what):
    return fence.probe_host(str(listen_host), str(what))


@_stops_the_run
def scrape_host(listen_host, node_address, what):
    return fence.scrape_host(str(listen_host), str(node_address), str(what))


class FilterModule:
    def filters(self):
        return {"dsaops_sglang_args": sglang_args, "dsaops_plan": plan, "dsaops_plan_extras": extras,
                "dsaops_node_ranks": ranks, "dsaops_image": image, "dsaops_image_load_needs": image_load_needs,
                "dsaops_exporter_containers": exporter_containers, "dsaops_exporter_users": exporter_users,
                "dsaops_exporter_job": exporter_job,
                "dsaops_checked_names": _on_call("inventory_checks", "names"),
                "dsaops_refusals": _on_call("inventory_checks", "refusals"),
                "dsaops_port_collisions": _on_call("inventory_checks", "port_collisions"),
                "dsaops_taken_uids": host_accounts.taken,
                "dsaops_sglang_ports": sglang_internal_ports, "dsaops_nft_elements": nft_elements,
                "dsaops_monitoring_sources": monitoring_sources, "dsaops_listen_address": listen_address,
                "dsaops_probe_host": probe_host,
                "dsaops_scrape_host": scrape_host}
