"""Tiny job scripts for the core tests, chosen by the first argument.

    ignore_term OUT        write OUT/ready, ignore SIGTERM, sleep forever
    forker OUT N           spawn N children that each spawn a grandchild; record all pids in OUT/pids
    flush_on_term OUT      on SIGTERM write OUT/flushed then exit 0
    ckpt_on_usr1 DIR OUT   on SIGUSR1 write DIR/step_<n>.pt; on SIGTERM write OUT/terminated, exit 0
    spam N                 print N numbered lines as fast as possible, then exit 0
    exit CODE              exit with CODE
    sleep                  write ready file in $OUT_DIR and sleep forever
"""
import os
import signal
import sys
import time


def _ready(out: str) -> None:
    with open(os.path.join(out, "ready.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))


def main() -> None:
    mode = sys.argv[1]
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _ready(sys.argv[2])
        while True:
            time.sleep(3600)
    elif mode == "forker":
        out, n = sys.argv[2], int(sys.argv[3])
        pids = [os.getpid()]
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                gpid = os.fork()
                if gpid == 0:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stubborn grandchild
                    while True:
                        time.sleep(3600)
                # Written aside, then renamed: the test globs g* and reads each (an empty file
                # seen between the open and the write was a flaky ValueError under load).
                with open(os.path.join(out, f"tmp{os.getpid()}"), "w") as f:
                    f.write(str(gpid))
                os.replace(os.path.join(out, f"tmp{os.getpid()}"), os.path.join(out, f"g{os.getpid()}"))
                while True:
                    time.sleep(3600)
            pids.append(pid)
        with open(os.path.join(out, "pids"), "w") as f:
            f.write(" ".join(map(str, pids)))
        _ready(out)
        while True:
            time.sleep(3600)
    elif mode == "flush_on_term":
        out = sys.argv[2]

        def on_term(_s, _f):
            with open(os.path.join(out, "flushed"), "w") as f:
                f.write("ok")
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
        _ready(out)
        while True:
            time.sleep(3600)
    elif mode == "ckpt_on_usr1":
        ckdir, out = sys.argv[2], sys.argv[3]
        state = {"n": 0}

        def on_usr1(_s, _f):
            state["n"] += 1
            tmp = os.path.join(ckdir, f".step_{state['n']}.tmp")
            with open(tmp, "wb") as f:
                f.write(b"x" * 1000)
            os.replace(tmp, os.path.join(ckdir, f"step_{1000 + state['n']}.pt"))

        def on_term(_s, _f):
            with open(os.path.join(out, "terminated"), "w") as f:
                f.write(str(state["n"]))
            sys.exit(0)

        signal.signal(signal.SIGUSR1, on_usr1)
        signal.signal(signal.SIGTERM, on_term)
        _ready(out)
        while True:
            time.sleep(3600)
    elif mode == "spam":
        n = int(sys.argv[2])
        w = sys.stdout.write
        for i in range(n):
            w(f"line {i} the quick brown fox jumps over the lazy dog\n")
        sys.stdout.flush()
    elif mode == "exit":
        sys.exit(int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
