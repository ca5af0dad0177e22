"""A stand-in for SGLang's launcher: spawns real processes titled like its schedulers.

Usage: launcher.py TITLE...  Prints the children's pids (one JSON list) and reaps
children as they die, like multiprocessing's join. SIGTERM stops every child cleanly and
exits 0 (a whole-server stop).
"""
import json
import signal
import subprocess
import sys
import time

CHILD = ("import setproctitle, signal, sys, time; setproctitle.setproctitle(sys.argv[1]); "
         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); print('ready', flush=True); time.sleep(3600)")


def main() -> None:
    children = [subprocess.Popen([sys.executable, "-c", CHILD, title], stdout=subprocess.PIPE, text=True)
                for title in sys.argv[1:]]
    for child in children:
        child.stdout.readline()  # titled before the test looks

    # The handler only notes the stop: Python runs it on the main thread between bytecodes, and one
    # that waited for the children there could land inside Popen.poll(), which holds the child's
    # (non-reentrant) wait lock: the launcher then hung for good (a CI trial saw it; in a loop of
    # starts and stops, 1 stop of 150 hung).
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(json.dumps([c.pid for c in children]), flush=True)
    while not stopping:
        for child in children:
            child.poll()  # reap the dead, as multiprocessing does
        time.sleep(0.1)
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        child.wait()


if __name__ == "__main__":
    main()
