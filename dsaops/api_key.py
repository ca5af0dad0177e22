"""The server's API key for dsaops' own clients (`dsaops verify`, `dsaops bench`, the exporter),
and the exporter's scrape token, read the same way.

A key is read from a file, never taken on a command line, where `ps` shows it to every user of
the machine. The playbooks keep the cluster's key beside the inventory
(`<inventory>.secrets/api-key`, mode 0600) and put a copy on each node for the exporter. SGLang
leaves /health, /health_generate, /ready and /metrics open, so health checks need no key.
"""
from __future__ import annotations

from dsaops.errors import UserError
from dsaops.plan_input import open_no_wait

KEY_MOST_CHARS = 4096   # a key is tens of characters; reading stops here (/dev/zero, a wrong file)


def read(path: str | None, flag: str = "--api-key-file", what: str = "the server's API key") -> str | None:
    """The key in `path` (surrounding whitespace dropped), or None without a path; UserError naming
    `flag` and saying to write `what` when the file cannot be read or holds no key."""
    if path is None:
        return None
    try:
        with open_no_wait(path) as f:
            raw = f.read(KEY_MOST_CHARS + 1)
        if len(raw) > KEY_MOST_CHARS:
            raise UserError(f"{flag} {path} holds more than {KEY_MOST_CHARS} characters: give the file that "
                            f"holds {what} alone")
        key = raw.decode()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise UserError(f"{flag} {path}: {why}; give a file that holds {what}") from None
    key = key.strip()
    if not key:
        raise UserError(f"{flag} {path} is empty: write {what} in it")
    if any(c.isspace() for c in key):
        raise UserError(f"{flag} {path}: holds more than the key; write {what} alone on one line")
    if not key.isascii() or not key.isprintable():    # an HTTP header carries no more; the playbooks' keys are ASCII
        raise UserError(f"{flag} {path} holds a character other than printable ASCII: write {what} alone")
    return key


def headers(key: str | None) -> dict[str, str]:
    """The Authorization header SGLang's API key middleware checks (`Bearer KEY`); none without a key."""
    return {"Authorization": f"Bearer {key}"} if key else {}
