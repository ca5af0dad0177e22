"""Reading the exporter's /metrics: Prometheus text as {'name{labels}': value}."""
from __future__ import annotations

import urllib.request


def exposition(text: str) -> dict[str, float]:
    """Prometheus text as {'name{labels}': value}, labels in the exposition's order."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def scrape(url: str, token: str | None = None) -> dict[str, float]:
    """`url`'s series, sent with `Authorization: Bearer token` when given."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=5) as r:
        return exposition(r.read().decode())
