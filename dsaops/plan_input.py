"""What `dsaops plan` accepts: every flag and model-config field checked before any arithmetic.

argparse turns "nan", "inf" and "1e308" into floats, Python callers (the playbook's filter) pass
whatever their inventory holds, and a config.json can hold anything JSON can; past this point
such values made NaN pool sizes, overflows, divisions by zero and tracebacks. `check(request)`
refuses each flag, and model_geometry reads each config field through `whole`/`number`/`read_json`,
in one line (a UserError: exit 2) that names the flag or key and the values it takes. The other
subcommands read their JSON files (a reference, a plan, a selftest verdict, the patches marker)
through `read_json` too.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from dsaops.errors import UserError

INT_MOST = 2**31 - 1        # SGLang keeps these counts in int32 (request and token tables)
GIB_MOST = float(1 << 20)   # 1 PiB: far above any GPU or checkpoint, far below overflow in byte sums
RATIO_MOST = 1000.0         # mamba_full_memory_ratio: 1000 already gives the mamba state 99.9%
JSON_MOST_BYTES = 1 << 20   # the JSON files read are a few KiB; reading stops here (/dev/zero, a weights file)

MAMBA_SSM_DTYPES = ("float32", "bfloat16", "float16")
MAMBA_RADIX_CACHE_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
# SGLang's third, cuda_vmm, is refused at startup for every DSA model class (none supports it)
MM_FEATURE_TRANSPORTS = ("cpu", "cuda_ipc")

# whole numbers from 1; each may be None (not given) unless required
_COUNTS = ("nodes", "gpus_per_node", "tp_size", "dp_size", "attn_dp_size", "context_length", "max_running_requests",
           "max_mamba_cache_size", "speculative_num_draft_tokens")
# counts whose least is not 1: MTP drafts a chain of N - 1 steps
_LEAST = {"speculative_num_draft_tokens": 2}
# field: (largest value, unit); each above 0
_AMOUNTS = {"gpu_memory_gib": (GIB_MOST, " GiB"), "free_memory_gib": (GIB_MOST, " GiB"),
            "weights_gib": (GIB_MOST, " GiB"), "mamba_full_memory_ratio": (RATIO_MOST, "")}
_SWITCHES = ("enable_dp_attention", "disable_radix_cache", "disable_overlap_schedule", "skip_decode_lock",
             "speculative_adaptive")
_NAMES = ("target", "kv_cache_dtype", "model", "model_config", "dsa_prefill_backend", "dsa_decode_backend")
_CHOICES = {"mamba_ssm_dtype": MAMBA_SSM_DTYPES, "mamba_radix_cache_strategy": MAMBA_RADIX_CACHE_STRATEGIES,
            "mm_feature_transport": MM_FEATURE_TRANSPORTS}
_REQUIRED = ("target", "nodes", "gpus_per_node", "tp_size", "kv_cache_dtype", "mem_fraction_static",
             "gpu_memory_gib")


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def shown(value) -> str:
    """A value as the user wrote it, cut short: a config.json can hold a megabyte in one field."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def whole(value, what: str, *, least: int = 1, most: int = INT_MOST, error: type[Exception] = UserError) -> int:
    """`value` if it is an int from `least` to `most` (not a bool, not 12.0); else `error` naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what} must be a whole number, not {shown(value)}")
    if value < least:
        raise error(f"{what} must be {'positive' if least == 1 else f'at least {least}'}, not {value}")
    if value > most:
        raise error(f"{what} must be at most {most}, not {value}")
    return value


def number(value, what: str, *, most: float, unit: str = "", error: type[UserError] = UserError) -> float:
    """`value` if it is a finite number above 0 and at most `most`; else `error` naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be a number, not {shown(value)}")
    if not math.isfinite(value):
        raise error(f"{what} must be a finite number, not {value}")
    if value <= 0:
        raise error(f"{what} must be positive, not {value:g}")
    if value > most:
        raise error(f"{what} must be at most {most:g}{unit}, not {value:g}")
    return float(value)


def parse_json(text: str | bytes):
    """json.loads, a document nested past the parser's recursion limit refused with the ValueError
    of any other bad document (it raised RecursionError: a traceback)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("it nests deeper than the parser follows") from None


def open_no_wait(path: str | Path):
    """open(path, "rb") that does not wait for a FIFO's writer (one without reads as empty)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(fd, True)   # a pipe that has its writer is then read as it comes
    return open(fd, "rb")


def read_text(path: str | Path, what: str, *, fix: str, error: type[Exception] = UserError) -> str:
    """The UTF-8 text of the file at `path`, read to at most JSON_MOST_BYTES; else `error` ending in `fix`."""
    where = f"{what} {path}"
    try:
        with open_no_wait(path) as f:
            data = f.read(JSON_MOST_BYTES + 1)
    except IsADirectoryError:
        raise error(f"{where} is a directory: {fix}") from None
    except OSError as e:
        raise error(f"cannot read {where}: {e.strerror or e}; {fix}") from None
    if len(data) > JSON_MOST_BYTES:
        raise error(f"{where} is larger than {JSON_MOST_BYTES >> 20} MiB: {fix}")
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise error(f"{where} is not UTF-8 text ({e.reason} at byte {e.start}): {fix}") from None


def read_json(path: str | Path, what: str, *, fix: str, error: type[Exception] = UserError) -> dict:
    """The JSON object in the file at `path` (read_text); else `error` ending in `fix`."""
    where = f"{what} {path}"
    text = read_text(path, what, fix=fix, error=error)
    try:
        raw = parse_json(text)
    except ValueError as e:
        raise error(f"{where} is not JSON ({e}): {fix}") from None
    if not isinstance(raw, dict):
        raise error(f"{where} holds a JSON {type(raw).__name__}, not an object: {fix}")
    return raw


def check(req) -> None:
    """Raise UserError for the first field of `req` (a dsaops.plan.PlanRequest) that no plan can take."""
    for field in _REQUIRED:
        if getattr(req, field) is None:
            raise UserError(f"{flag(field)} is required")
    for field in _NAMES:
        if (value := getattr(req, field)) is not None and not isinstance(value, str):
            raise UserError(f"{flag(field)} must be a name, not {shown(value)}")
    for field, choices in _CHOICES.items():
        if getattr(req, field) not in choices:
            raise UserError(f"{flag(field)} must be one of {', '.join(choices)}, not {shown(getattr(req, field))}")
    for field in _SWITCHES:
        if not isinstance(getattr(req, field), bool):
            raise UserError(f"{flag(field)} is a switch: true or false, not {shown(getattr(req, field))}")
    for field in _COUNTS:
        if (value := getattr(req, field)) is not None:
            whole(value, flag(field), least=_LEAST.get(field, 1))
    fraction = req.mem_fraction_static
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise UserError(f"--mem-fraction-static must be between 0 and 1 (SGLang's default is about 0.8-0.9), "
                        f"not {shown(fraction)}")
    for field, (most, unit) in _AMOUNTS.items():
        if (value := getattr(req, field)) is not None:
            number(value, flag(field), most=most, unit=unit)
