"""The TCP ports SGLang 0.5.23 opens for its own processes, by SGLang's own arithmetic.

The network role fences them to the cluster's addresses (nftables); tests/dsaops/test_sglang_ports.py
runs the pinned wheel's PortArgs.init_new, _resolve_dist_init_method and the attention-DP handshake and
fails when these differ. What they open, for a deployment the playbooks launch:

- torch.distributed's TCPStore (it accepts pickled objects): on the head at the dist-init port
  (`--dist-init-addr HEAD:PORT`, more than one node); on one node at `--nccl-port`, which the
  playbooks set to the same port (SGLang would otherwise draw it at random from 22000-29999).
- with attention DP, ZeroMQ sockets for the tokenizer, detokenizer, RPC, metrics, scheduler input
  and load collector on the six ports after the dist-init port (below it when that would pass
  65535), and the worker-port handshake 13 ports above it. On one node there is no dist-init
  address: the six sit on 127.0.0.1 from the HTTP port + 234, and the handshake listens on the HTTP
  bind address at the HTTP port + 13.

Ports SGLang draws at random (attention-DP scheduler inputs, the cross-node message-queue
broadcaster, NCCL's and Gloo's own sockets) cannot be fenced by number: the ZeroMQ ones are held to
the cluster's addresses by SGLang's SGLANG_ZMQ_ALLOWED_PEERS, which the playbooks set.
"""
from __future__ import annotations

ZMQ_TCP_PORT_DELTA = 233                    # server_args.py
DP_ATTENTION_HANDSHAKE_PORT_DELTA = 13      # server_args.py
NUM_DERIVED_PORTS = 6                       # PortArgs.init_new, without SGLANG_RUST_SERVER


def _zmq_ports(dist_init_port: int) -> list[int]:
    """PortArgs.init_new's port_base .. port_base + 5 from the (real or derived) dist-init port."""
    if dist_init_port + NUM_DERIVED_PORTS > 65535:
        base = dist_init_port - NUM_DERIVED_PORTS - 1
    else:
        base = dist_init_port + 1
    return [base + i for i in range(NUM_DERIVED_PORTS)]


def internal_ports(*, server_port: int, dist_init_port: int, nnodes: int, attn_dp_size: int) -> list[int]:
    """The ports, sorted, that SGLang binds for its own processes on some node of the deployment.
    One node: `--nccl-port dist_init_port`; more: `--dist-init-addr HEAD:dist_init_port`."""
    ports = {dist_init_port}
    if attn_dp_size > 1:
        if nnodes > 1:
            ports.update(_zmq_ports(dist_init_port))
            ports.add(dist_init_port + DP_ATTENTION_HANDSHAKE_PORT_DELTA)
        else:
            derived = server_port + ZMQ_TCP_PORT_DELTA
            if derived > 65535:
                derived = server_port - ZMQ_TCP_PORT_DELTA
            ports.update(_zmq_ports(derived))
            ports.add(server_port + DP_ATTENTION_HANDSHAKE_PORT_DELTA)
    return sorted(ports)
