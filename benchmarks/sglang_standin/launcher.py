"""A stand-in for SGLang's launcher: spawns real processes titled like its schedulers.

Usage: launcher.py [options] [TITLE...]   (other arguments, e.g. SGLang's own, are ignored)

Prints the children's pids (one JSON list, in its own PID namespace: what SGLang's lines say)
and, with --log, writes SGLang's lines: each rank's KV allocation at start, then as the launcher
of the chosen node kind does:
- head node (--watchdog): every child is polled; the first one found dead with a non-zero code
  gets the watchdog's `Subprocess … crashed with exit code N` line, the rest are killed and the
  launcher exits 1 (the container ends with it).
- worker node (--join-in-order): children are joined one after another, each with its
  `Scheduler or DataParallelController PID terminated with N` line, so a later rank that dies
  first stays a zombie until the earlier ones are joined.
- otherwise children are reaped as they die, like multiprocessing's polling.
SIGTERM stops every child (--stop-gap seconds apart) and exits 0: a whole-server stop, with
the `SIGTERM received` line when --sigterm-line is given.
"""
import argparse
import json
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # benchmarks.sglang_standin

from benchmarks.sglang_standin import log_lines as L

CHILD = ("import setproctitle, signal, sys, time; setproctitle.setproctitle(sys.argv[1]); "
         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); print('ready', flush=True); time.sleep(3600)")


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("titles", nargs="*")
    ap.add_argument("--ranks", type=int, default=0, help="add sglang::scheduler_TP0..N-1 to the titles")
    ap.add_argument("--log", help="append SGLang's lines to this file ('-': standard output)")
    ap.add_argument("--watchdog", action="store_true")
    ap.add_argument("--join-in-order", action="store_true")
    ap.add_argument("--sigterm-line", action="store_true")
    ap.add_argument("--stop-gap", type=float, default=0.0)
    args, _ = ap.parse_known_args()
    args.titles += [f"sglang::scheduler_TP{i}" for i in range(args.ranks)]
    return args


def main() -> None:
    args = parse()
    out = None if not args.log else sys.stdout if args.log == "-" else open(args.log, "a")  # noqa: SIM115

    def say(message, parts=()):
        if out is not None:
            out.write(L.line(message, parts))
            out.flush()

    children = [subprocess.Popen([sys.executable, "-c", CHILD, title], stdout=subprocess.PIPE, text=True)
                for title in args.titles]
    for child in children:
        child.stdout.readline()  # titled before the test looks
    for title in args.titles:
        say(L.kv_allocated(4922240, 32.48), tuple(title.partition("sglang::scheduler_")[2].split("_")) if "_" in title
            else ())

    # The handler only notes the stop: Python runs it on the main thread between bytecodes, and one
    # that waited for the children there could land inside Popen.poll(), which holds the child's
    # (non-reentrant) wait lock: the launcher then hung for good (a CI trial saw it; in a loop of
    # starts and stops, 1 stop of 150 hung).
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(json.dumps([c.pid for c in children]), flush=True)
    joined = 0
    while not stopping:
        if args.join_in_order:
            if joined < len(children) and children[joined].poll() is not None:
                say(L.terminated(children[joined].pid, children[joined].returncode))
                joined += 1
        else:
            for i, child in enumerate(children):
                if child.poll() not in (None, 0) and args.watchdog:  # poll() reaps, as multiprocessing does
                    say(L.crashed(f"scheduler_{i}", child.pid, child.returncode))
                    for other in children:
                        if other.poll() is None:
                            other.kill()
                    sys.exit(1)
        time.sleep(0.1)
    if args.sigterm_line:
        say(L.sigterm())
    for child in children:
        if child.poll() is None:
            child.terminate()
            child.wait()
            time.sleep(args.stop_gap)
    for child in children:
        child.wait()


if __name__ == "__main__":
    main()
