"""A stand-in for SGLang's launcher: spawns real processes titled like its schedulers.

Usage: fake_launcher.py TITLE...  Prints the children's pids (one JSON list) and reaps
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

    def stop(*_):
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(json.dumps([c.pid for c in children]), flush=True)
    while True:
        for child in children:
            child.poll()  # reap the dead, as multiprocessing does
        time.sleep(0.1)


if __name__ == "__main__":
    main()
