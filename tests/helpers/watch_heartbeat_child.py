"""A training-like child for the watch tests: heartbeats and reports through supervisor.client.

Usage: watch_heartbeat_child.py STEPS [hang|exit]
Runs STEPS steps (heartbeat + report each), prints "ready", then either hangs (stops calling the
client, blocked in a function named ``stuck_in_collective`` so a stack dump shows it) or exits.
"""
from __future__ import annotations

import sys
import time

from supervisor import client


def stuck_in_collective() -> None:
    while True:
        time.sleep(3600)  # a hung all-reduce, as far as the supervisor can tell


def main() -> None:
    steps = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "hang"
    client.install()
    for step in range(steps):
        client.heartbeat(step)
        client.report(step, loss=2.5 - step * 0.001, grad_norm=1.0)
        time.sleep(0.02)  # one "training step"
    print("ready", flush=True)
    if mode == "hang":
        stuck_in_collective()


if __name__ == "__main__":
    main()
