"""The scheduler ranks SGLang 0.5.23 runs on one node, from its launch arguments.

    python3 -m dsaops.node_ranks -- <sglang.launch_server args...>   # prints N, or exits 2 saying why

The image's entrypoint asks this once and hands `--expect-ranks N` to the container's
HEALTHCHECK, so a SIGKILLed rank makes the container unhealthy (a worker node's /health is a
dummy that always answers 200). SGLang's own rule (entrypoints/engine.py `_calculate_rank_ranges`,
data_parallel_controller.py `launch_tensor_parallel_group`): a node runs
max(pp // nnodes, 1) pipeline stages x tp // max(nnodes // pp, 1) tensor ranks, once per
data-parallel replica (`--dp-size` without attention DP); attention DP (`--attn-dp-size`, or the
deprecated `--dp-size N --enable-dp-attention`) runs inside the TP group and adds none.
Options are read as SGLang's argparse reads them, abbreviations included (`--tp 8`), and with its
`--config` YAML's keys ahead of the command line (dsaops/sglang_config.py).
"""
from __future__ import annotations

import argparse
import sys

from dsaops.sglang_config import merged

# SGLang's spellings (srt/arg_groups/fields/parallel.py; --enable-dp-attention: server_args.py)
OPTIONS = {
    "tp_size": ("--tp-size", "--tensor-parallel-size"),
    "pp_size": ("--pp-size", "--pipeline-parallel-size"),
    "dp_size": ("--dp-size", "--data-parallel-size"),
    "attn_dp_size": ("--attn-dp-size", "--attention-data-parallel-size"),
    "nnodes": ("--nnodes",),
}


class BadArguments(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise BadArguments(message)


def ranks_per_node(argv: list[str]) -> int:
    """Scheduler processes SGLang starts on this node for these launch arguments."""
    parser = _Parser(add_help=False)
    for dest, flags in OPTIONS.items():
        parser.add_argument(*flags, dest=dest, type=int, default=1)
    parser.add_argument("--enable-dp-attention", action="store_true")
    args, _ = parser.parse_known_args(argv)
    for dest, flags in OPTIONS.items():
        if getattr(args, dest) < 1:
            raise BadArguments(f"{flags[0]} must be >= 1, got {getattr(args, dest)}")
    # the deprecated spelling moves --dp-size to attention DP (parallel_hook.handle_deprecated_dp_attention)
    replicas = 1 if args.enable_dp_attention and args.attn_dp_size == 1 else args.dp_size
    nnodes_per_stage = max(args.nnodes // args.pp_size, 1)
    if args.tp_size % nnodes_per_stage:
        raise BadArguments(f"--tp-size {args.tp_size} does not split over {nnodes_per_stage} nodes a pipeline stage")
    return replicas * max(args.pp_size // args.nnodes, 1) * (args.tp_size // nnodes_per_stage)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(ranks_per_node(merged(argv[1:] if argv[:1] == ["--"] else argv).args))
    except BadArguments as e:
        print(f"dsaops.node_ranks: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
