"""dsaops.sglang_ports against the pinned SGLang's own port arithmetic, run out of the wheel:
PortArgs.init_new (server_args.py), _resolve_dist_init_method (distributed/bootstrap.py, the TCPStore's
address) and the attention-DP worker-port handshake (DataParallelController._broadcast_worker_ports).
A change to any of them in the pinned source fails here, and the fence would follow it."""
from __future__ import annotations

import dataclasses
import ipaddress
import socket
import tempfile
import uuid
from types import SimpleNamespace

import pytest

from dsaops import sglang_ports
from dsaops.launch_args import ClusterSpec, NodeSpec, launch_args
from tests.support.sglang_definitions import lift, source_file, value

HEAD = "192.168.100.1"


def network_address():
    return lift(source_file("srt/utils/network.py"), ["_is_ipv6", "_wrap", "_parse_port", "NetworkAddress"],
                {"dataclass": dataclasses.dataclass, "ipaddress": ipaddress, "socket": socket})["NetworkAddress"]


def pinned_ports(*, server_port, dist_init_addr, nccl_port, nnodes, attn_dp_size, host="0.0.0.0"):
    """The ports the pinned SGLang binds for its own processes with these arguments."""
    address = network_address()
    checked = []
    server_args = SimpleNamespace(nccl_port=nccl_port, tokenizer_worker_num=1, decoupled_spec_role="null",
                                  nnodes=nnodes, dist_init_addr=dist_init_addr, port=server_port,
                                  attn_dp_size=attn_dp_size, host=host)
    envs = SimpleNamespace(SGLANG_RUST_SERVER=SimpleNamespace(get=lambda: False),
                           SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE=SimpleNamespace(get=lambda: None))
    ns = lift(source_file("srt/server_args.py"), ["ZMQ_TCP_PORT_DELTA", "PortArgs"], {
        "dataclasses": dataclasses, "tempfile": tempfile, "uuid": uuid, "NetworkAddress": address,
        "envs": envs, "resolving_view": lambda args: args, "attn_dp_enabled_of": lambda cfg: cfg.attn_dp_size > 1,
        "num_dp_ranks_of": lambda cfg: cfg.attn_dp_size, "ep_scale_joiner_of": lambda cfg: False,
        "ep_joiner_of": lambda cfg: False, "wait_port_available": lambda port, name: checked.append(port),
        "get_free_port_below_ephemeral": lambda: pytest.fail("the nccl port must be given"),
        "logger": None})
    port_args = ns["PortArgs"].init_new(server_args)
    serving = SimpleNamespace(host=host, port=server_port)
    parallel = SimpleNamespace(dist_init_addr=dist_init_addr, node_rank=0, nnodes=nnodes)
    store = lift(source_file("srt/distributed/bootstrap.py"), ["_resolve_dist_init_method"], {
        "envs": envs, "NetworkAddress": address, "get_parallel": lambda: parallel, "get_serving": lambda: serving,
    })["_resolve_dist_init_method"](dist_port=port_args.nccl_port)
    ports = {int(store.rsplit(":", 1)[1])}
    for name in ("tokenizer_ipc_name", "scheduler_input_ipc_name", "detokenizer_ipc_name", "rpc_ipc_name",
                 "metrics_ipc_name", "load_collector_ipc_name"):
        endpoint = getattr(port_args, name)
        if endpoint.startswith("tcp://"):
            ports.add(int(endpoint.rsplit(":", 1)[1]))
    if attn_dp_size > 1:
        handshake = []
        method = lift(source_file("srt/managers/data_parallel_controller.py"),
                      ["DataParallelController._broadcast_worker_ports"], {
                          "NetworkAddress": address, "DP_ATTENTION_HANDSHAKE_PORT_DELTA":
                          value("srt/server_args.py", "DP_ATTENTION_HANDSHAKE_PORT_DELTA"),
                          "get_exec": lambda: SimpleNamespace(moe=SimpleNamespace(is_ep_scale_joiner=False)),
                          "get_parallel": lambda: parallel, "get_serving": lambda: serving})["_broadcast_worker_ports"]
        controller = SimpleNamespace(_broadcast_ports_as_server=lambda endpoint, n, ports: handshake.append(endpoint))
        method(controller, server_args, [])
        ports.add(int(handshake[0].rsplit(":", 1)[1]))
    return sorted(ports), checked


def playbook_flags(*, nnodes, server_port, dist_init_port, attn_dp_size):
    """--nccl-port / --dist-init-addr as the playbooks pass them (dsaops.launch_args)."""
    spec = ClusterSpec(tp_size=8, kv_cache_dtype="fp8_e4m3", nnodes=nnodes, attn_dp_size=attn_dp_size,
                       nccl_port=dist_init_port if nnodes == 1 else None)
    args = launch_args(spec, NodeSpec(model_path="/m", host="0.0.0.0", port=server_port,
                                      dist_init_addr=f"{HEAD}:{dist_init_port}" if nnodes > 1 else None))
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    return flag.get("--dist-init-addr"), int(flag["--nccl-port"]) if "--nccl-port" in flag else 12345


@pytest.mark.parametrize("nnodes", [1, 2])
@pytest.mark.parametrize("attn_dp_size", [1, 8])
@pytest.mark.parametrize("server_port, dist_init_port", [(30000, 25000), (65400, 65532), (30000, 65529)])
def test_the_fenced_ports_are_the_ones_sglang_binds(nnodes, attn_dp_size, server_port, dist_init_port):
    dist_init_addr, nccl_port = playbook_flags(nnodes=nnodes, server_port=server_port,
                                               dist_init_port=dist_init_port, attn_dp_size=attn_dp_size)
    bound, checked = pinned_ports(server_port=server_port, dist_init_addr=dist_init_addr, nccl_port=nccl_port,
                                  nnodes=nnodes, attn_dp_size=attn_dp_size)
    fenced = sglang_ports_of(nnodes, attn_dp_size, server_port, dist_init_port)
    assert fenced == bound
    # SGLang also checks free two ports it does not bind: one node's derived dist-init port (its ZeroMQ base
    # is computed from it) and, on more nodes, the nccl port (the TCPStore sits on the dist-init address)
    assert set(checked) - set(fenced) <= {server_port + 233, server_port - 233, nccl_port if nnodes > 1 else None}


def sglang_ports_of(nnodes, attn_dp_size, server_port, dist_init_port):
    return sglang_ports.internal_ports(server_port=server_port, dist_init_port=dist_init_port, nnodes=nnodes,
                                       attn_dp_size=attn_dp_size)


def test_the_arithmetic_is_what_a_deployment_opens():
    """The dgx-spark-2x shape with attention DP, and one node with TP only: the numbers, written out."""
    assert sglang_ports_of(2, 2, 30000, 25000) == [25000, 25001, 25002, 25003, 25004, 25005, 25006, 25013]
    assert sglang_ports_of(1, 1, 30000, 25000) == [25000]
    assert sglang_ports_of(1, 8, 30000, 25000) == [25000, 30013, 30234, 30235, 30236, 30237, 30238, 30239]


def test_a_changed_constant_is_caught(monkeypatch):
    """Control: the comparison above fails when dsaops' copy of SGLang's arithmetic drifts."""
    monkeypatch.setattr(sglang_ports, "DP_ATTENTION_HANDSHAKE_PORT_DELTA", 14)
    bound, _ = pinned_ports(server_port=30000, dist_init_addr=f"{HEAD}:25000", nccl_port=12345, nnodes=2,
                            attn_dp_size=8)
    assert sglang_ports_of(2, 8, 30000, 25000) != bound


def test_without_the_pinned_nccl_port_one_node_opens_a_random_one():
    """Control: one node without --nccl-port, SGLang draws the TCPStore's port (get_free_port_below_ephemeral)."""
    with pytest.raises(pytest.fail.Exception, match="the nccl port must be given"):
        pinned_ports(server_port=30000, dist_init_addr=None, nccl_port=None, nnodes=1, attn_dp_size=8)


def test_the_zeromq_allowlist_the_playbooks_set_is_sglangs():
    """Ports SGLang draws at random cannot be fenced by number: its ZeroMQ sockets on them admit only the peers
    in SGLANG_ZMQ_ALLOWED_PEERS (comma-separated), which the sglang_server role sets with SGLANG_ZMQ_SOURCE_IP
    (the rendered commands: tests/playbooks/test_static.py). Pinned to the wheel: the variables, their parsing,
    and the attention-DP worker sockets that use them."""
    environ = source_file("srt/environ.py").read_text()
    assert "SGLANG_ZMQ_ALLOWED_PEERS = EnvTuple(tuple())" in environ and "SGLANG_ZMQ_SOURCE_IP = EnvStr(None)" in environ
    parse = lift(source_file("srt/environ.py"), ["EnvTuple.parse"])["parse"]
    assert parse(None, "127.0.0.1,192.168.100.1, 192.168.100.2") == ("127.0.0.1", "192.168.100.1", "192.168.100.2")
    controller = source_file("srt/managers/data_parallel_controller.py").read_text()
    assert "get_zmq_socket_on_host(\n                    self.context, zmq.PUSH, host=bind_host, restrict_peers=True" in controller
