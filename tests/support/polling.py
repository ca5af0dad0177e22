"""Waiting for a condition: a server that answers, a process that is gone, a metric that changed."""
import time


def wait_for(predicate, timeout: float, step: float = 0.1):
    """The predicate's first truthy value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)
