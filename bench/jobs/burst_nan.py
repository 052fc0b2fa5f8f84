"""A burst of nanoGPT-format metric lines (argv[1] of them), then one NaN line whose wall time is
written into argv[2]; then it waits to be stopped (on.nan.action = give_up ends the run at the
detection). Used by bench/bench_core.py's burst_nan row and tests/e2e/test_burst_nan_e2e.py."""
import sys
import time

w = sys.stdout.write
n = int(sys.argv[1])
for i in range(n):
    w(f"iter {i}: loss {2.0 + (i % 97) * 0.001:.4f}, time 12.34ms, mfu 1.20%\n")
sys.stdout.flush()
t = time.time()
w(f"iter {n}: loss nan, time 12.34ms, mfu 1.20%\n")
sys.stdout.flush()
open(sys.argv[2], "w").write(repr(t))
time.sleep(600)
