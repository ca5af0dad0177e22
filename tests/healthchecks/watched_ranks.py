"""A ProcessWatcher seen from the tests: a launcher's ranks all up, and the deaths it counted."""
from __future__ import annotations

from tests.support.polling import wait_for


def ranks_up(watcher, lch) -> bool:
    """Every scheduler of this launcher is watched, and no other is up (a rank of the previous test
    can still be alive for a moment after its SIGKILL: counting ranks alone was satisfied by those,
    and a kill then hit a process the watcher had not seen yet)."""
    def ours():
        try:
            watched = set(watcher.live)
        except RuntimeError:  # the watcher thread changed the dict while it was read
            return False
        return set(lch.pids) <= watched and sum(watcher.snapshot()[0].values()) == len(lch.pids)

    return wait_for(ours, 10)


def deaths(watcher) -> dict[tuple[str, str], int]:
    """(rank, cause) -> count, the causes counted at least once."""
    return {k: v for k, v in watcher.snapshot()[1].items() if v}
