"""SGLang 0.5.23 log lines, rendered as the wheel's own format strings render them
(dsaops.healthchecks.logparse.FORMAT_STRINGS lists the pieces; tests/healthchecks/test_contract.py
finds them in the wheel)."""
from __future__ import annotations

import time


def stamp(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() if at is None else at))


def line(message: str, parts: tuple[str, ...] = (), at: float | None = None) -> str:
    """configure_logger: `[%(asctime)s{prefix}] %(message)s`, prefix like ` DP3 TP3 EP3`."""
    prefix = "".join(f" {p}" for p in parts)
    return f"[{stamp(at)}{prefix}] {message}\n"


def kv_allocated(tokens: int, size_gb: float, dtype: str = "torch.float8_e4m3fn") -> str:
    return f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, KV size: {size_gb:.2f} GB"


def kv_allocated_split(tokens: int, k_gb: float, v_gb: float, dtype: str = "torch.bfloat16") -> str:
    return f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, K size: {k_gb:.2f} GB, V size: {v_gb:.2f} GB"


def swa_allocated(tokens: int, size_gb: float) -> str:
    return f"SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, KV size: {size_gb:.2f} GB"


def mamba_allocated(size: int) -> str:
    return (f"Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: 0.14GB, "
            "ssm_state size: 4.00GB ")


# kv_cache_configurator.py logs these two with %-style arguments
MAMBA_CAPPED = ("max_running_requests is capped to %d by the mamba state cache (max_mamba_cache_size=%d, %d state "
                "slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or "
                "halve the state size with --mamba-ssm-dtype bfloat16.")
REDUCED = ("max_running_requests was reduced from the requested %d to %d (per dp worker) due to the available KV "
           "cache capacity.")


def mamba_capped(cap: int, size: int, ratio: int) -> str:
    return MAMBA_CAPPED % (cap, size, ratio)


def reduced(requested: int, effective: int) -> str:
    return REDUCED % (requested, effective)


def crashed(name: str, pid: int, code: int) -> str:
    return f"Subprocess {name} (pid={pid}) crashed with exit code {code}. Triggering SIGQUIT for cleanup..."


def terminated(pid: int, code: int) -> str:
    return f"Scheduler or DataParallelController {pid} terminated with {code}"


def sigterm() -> str:
    return "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."


def sigquit() -> str:
    return "SIGQUIT received. signum=3, frame=None. It usually means one child failed."


def health_failed() -> str:
    return ("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. "
            "tic start time: 10:00:00. last_heartbeat time: 09:59:30")


def sigterm_worker(node_rank: int) -> str:
    return (f"SIGTERM received on node_rank {node_rank}; waiting for the rank-0 ShutdownReq broadcast to stop "
            "the schedulers.")


def every_message() -> list[str]:
    """One rendering of each message above (the contract test checks them against the wheel)."""
    return [kv_allocated(4922240, 32.48), kv_allocated_split(1000, 1.0, 1.5), mamba_allocated(40),
            mamba_capped(8, 40, 5), reduced(64, 12), crashed("scheduler_1", 4242, -9), terminated(4242, -9),
            sigterm(), sigterm_worker(1), sigquit(), health_failed()]
