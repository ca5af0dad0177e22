"""Stands in for `python3 -m sglang.launch_server` where SGLang cannot serve (no GPU): the entrypoint
under test starts it exactly as it starts SGLang (DSAOPS_SERVER_MODULE=standin_server).

It prints its arguments, then, like SGLang's tokenizer manager, a `SIGTERM received` line on
SIGTERM before exiting 0. STANDIN_EXIT=N makes it exit N on its own after printing.
STANDIN_CHILD_LAST_WORDS=1: on SIGTERM it also leaves a child that writes a line to the same output
half a second after the stand-in has exited (SGLang's subprocesses log their own shutdown).
"""
import os
import signal
import subprocess
import sys
import time


def _stop(signum, frame):
    if os.environ.get("STANDIN_CHILD_LAST_WORDS") == "1":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); print('child last words', flush=True)"])
    print(f"SIGTERM received. signum={signum}", flush=True)
    sys.exit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    print(f"standin pid={os.getpid()} args={' '.join(sys.argv[1:])}", flush=True)
    print("standin on stderr", file=sys.stderr, flush=True)
    if "STANDIN_EXIT" in os.environ:
        sys.exit(int(os.environ["STANDIN_EXIT"]))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
