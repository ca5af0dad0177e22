"""Host memory, read at scrape time: /proc/meminfo, two vm sysctls, PSI memory pressure.

On GB10 the CPU and GPU share this memory and DCGM has no framebuffer fields, so these
are the GPU's memory figures too.
"""
from __future__ import annotations

from dsaops.healthchecks.metrics import ErrorCounts, Families

_MEMINFO = {"MemTotal": ("dsa_host_memory_total_bytes", "MemTotal"),
            "MemAvailable": ("dsa_host_memory_available_bytes", "MemAvailable: what can be allocated without swapping"),
            "MemFree": ("dsa_host_memory_free_bytes", "MemFree"),
            "SwapFree": ("dsa_host_swap_free_bytes", "SwapFree")}
_SYSCTLS = {"min_free_kbytes": ("dsa_host_vm_min_free_kbytes", "vm.min_free_kbytes"),
            "vfs_cache_pressure": ("dsa_host_vm_vfs_cache_pressure", "vm.vfs_cache_pressure")}


def read_meminfo(proc: str) -> dict[str, int]:
    values = {}
    with open(f"{proc}/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in _MEMINFO:
                values[key] = int(rest.split()[0]) * 1024  # kB
    return values


def read_pressure(proc: str) -> list[tuple[str, str, float]]:
    """`some avg10=0.12 avg60=… avg300=… total=…` -> (kind, window, ratio 0..1)."""
    out = []
    with open(f"{proc}/pressure/memory") as f:
        for line in f:
            kind, *fields = line.split()
            for field in fields:
                key, _, value = field.partition("=")
                if key.startswith("avg"):
                    out.append((kind, key[3:] + "s", float(value) / 100))
    return out


class HostMemoryCollector:
    def __init__(self, errors: ErrorCounts, families: Families, proc: str = "/proc"):
        self.errors, self.f, self.proc = errors, families, proc

    def collect(self):
        out = []
        try:
            mem = read_meminfo(self.proc)
            for key, (name, doc) in _MEMINFO.items():
                if key in mem:
                    out.append(self.f.gauge(name, doc + " (bytes)").add(mem[key]).family)
        except (OSError, ValueError, IndexError):
            self.errors.inc("hostmem")
        for key, (name, doc) in _SYSCTLS.items():
            try:
                with open(f"{self.proc}/sys/vm/{key}") as f:
                    out.append(self.f.gauge(name, doc).add(int(f.read())).family)
            except (OSError, ValueError):
                self.errors.inc("hostmem")
        try:
            psi = self.f.gauge("dsa_host_memory_pressure_ratio", "PSI memory pressure: share of time tasks stalled "
                               "on memory (some: at least one, full: all)", ("kind", "window"))
            for kind, window, ratio in read_pressure(self.proc):
                psi.add(ratio, kind, window)
            out.append(psi.family)
        except FileNotFoundError:  # a kernel without PSI: nothing to say, not an error
            pass
        except (OSError, ValueError):
            self.errors.inc("hostmem")
        return out
