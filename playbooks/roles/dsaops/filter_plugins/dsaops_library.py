"""The dsaops library inside the playbooks, as Jinja filters evaluated on the controller.

Every role depends on the dsaops role, so Ansible loads these wherever the roles run.

  preflight_cluster | dsaops_sglang_args(nnodes=, node_rank=, dist_init_addr=, host=,
                                         enable_metrics=, target=, plan=, extra_args=, model_path=,
                                         served_model_name=)
      one node's whole `sglang.launch_server` argument list (dsaops.launch_args); the prefill
      bound is the plan's (fitted to its memory) or, without a plan, the targets table's
  preflight_cluster | dsaops_plan(target=, nodes=)
      {"plan": the `dsaops plan --json` object, "error": null}, or {"plan": null, "error": why}
  dsaops_target | dsaops_image(registry=)
      [REGISTRY/]dsaops/sglang:<SGLang pin>-<target>, the tag `make image` gives (dsaops.image)
  settings | dsaops_exporter_containers
      [{name, args}] of the node's Docker proxy and exporter containers (dsaops.healthchecks.deploy)
  rule_files | dsaops_exporter_job
      the scrape job name the packaged alert rules select (dsaops.healthchecks.scrape)

`preflight_cluster` is the inventory's cluster-wide settings as preflight/tasks/inventory.yml
records them. The dsaops package is imported from this checkout (the folder that holds
playbooks/), so an ansible installed without dsaops runs these too.
"""
import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[4]   # playbooks/roles/dsaops/filter_plugins/
if (_CHECKOUT / "dsaops" / "__init__.py").is_file() and str(_CHECKOUT) not in sys.path:
    sys.path.insert(0, str(_CHECKOUT))

# importable only once the checkout is on the path
from dsaops.healthchecks import deploy, scrape

from dsaops import targets
from dsaops.errors import UserError
from dsaops.image import image_name
from dsaops.launch_args import ClusterSpec, NodeSpec, launch_args
from dsaops.plan import PlanRequest, make_plan


def _int(value):
    return None if value is None else int(value)


def _float(value):
    return None if value is None else float(value)


def sglang_args(cluster, *, nnodes, node_rank, dist_init_addr, host, enable_metrics, target, plan=None, extra_args=(),
                model_path=None, served_model_name=None):
    chunk = plan["prefill_chunk_tokens"] if plan else targets.get(str(target)).chunked_prefill_size or None
    spec = ClusterSpec(
        tp_size=int(cluster["tp_size"]), attn_dp_size=int(cluster["attn_dp_size"]), ep_size=int(cluster["ep_size"]),
        nnodes=int(nnodes), kv_cache_dtype=str(cluster["kv_cache_dtype"]),
        dsa_prefill_backend=str(cluster["dsa_prefill_backend"]), dsa_decode_backend=str(cluster["dsa_decode_backend"]),
        mem_fraction_static=_float(cluster["mem_fraction_static"]),
        max_running_requests=_int(cluster["max_running_requests"]), chunked_prefill_size=_int(chunk),
        served_model_name=str(served_model_name) if served_model_name else None, enable_metrics=bool(enable_metrics))
    node = NodeSpec(model_path=str(model_path or cluster["model_path"]), host=str(host), port=int(cluster["server_port"]),
                    node_rank=int(node_rank), dist_init_addr=str(dist_init_addr),
                    extra_args=tuple(str(a) for a in extra_args))
    return launch_args(spec, node)


def plan(cluster, *, target, nodes):
    request = PlanRequest(
        target=str(target), nodes=int(nodes), gpus_per_node=int(cluster["gpus_per_node"]),
        tp_size=int(cluster["tp_size"]), attn_dp_size=int(cluster["attn_dp_size"]),
        kv_cache_dtype=str(cluster["kv_cache_dtype"]), dsa_prefill_backend=str(cluster["dsa_prefill_backend"]),
        dsa_decode_backend=str(cluster["dsa_decode_backend"]),
        mem_fraction_static=float(cluster["mem_fraction_static"]), gpu_memory_gib=float(cluster["gpu_memory_gib"]),
        weights_gib=_float(cluster["weights_gib"]), max_running_requests=_int(cluster["max_running_requests"]))
    try:
        return {"plan": make_plan(request).to_json(), "error": None}
    except UserError as e:
        return {"plan": None, "error": str(e)}


def image(target, *, registry=""):
    return image_name(str(target), registry=str(registry or ""))


def exporter_containers(settings):
    fields = {**settings, "server_port": int(settings["server_port"]), "kmsg": bool(settings["kmsg"]),
              "plan": settings.get("plan") or None}
    return deploy.containers(deploy.ExporterDeployment(**fields))


def exporter_job(rule_files):
    return scrape.exporter_job([str(path) for path in rule_files])


class FilterModule:
    def filters(self):
        return {"dsaops_sglang_args": sglang_args, "dsaops_plan": plan, "dsaops_image": image,
                "dsaops_exporter_containers": exporter_containers, "dsaops_exporter_job": exporter_job}
