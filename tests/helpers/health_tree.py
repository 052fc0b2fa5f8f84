"""A small process tree for health tests: the parent and each child hold N MiB and print their pids.

Usage: python health_tree.py CHILDREN MIB. Prints one line "pids P C1 C2 ..." once every process
has touched its memory, then waits until stdin closes (the test controls its lifetime).
"""
from __future__ import annotations

import subprocess
import sys


def hold(mib: int) -> bytearray:
    buf = bytearray(mib * 1024 * 1024)
    for i in range(0, len(buf), 4096):  # touch every page so it counts as resident
        buf[i] = 1
    return buf


def main() -> None:
    children, mib = int(sys.argv[1]), int(sys.argv[2])
    held = hold(mib)
    procs = [subprocess.Popen([sys.executable, __file__, "0", str(mib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(children)]
    pids = [p.stdout.readline().split()[1] for p in procs]  # type: ignore[union-attr]
    print("pids", *([str(__import__("os").getpid())] + pids), flush=True)
    sys.stdin.read()
    for p in procs:
        p.stdin.close()  # type: ignore[union-attr]
        p.wait()
    del held


if __name__ == "__main__":
    main()
