"""What a training script with auto-resume does, for the peer supervisors of bench_reboot:
resume from the newest checkpoint file in DIR (no verification), then run the demo job.

    peer_resume.py DIR -- TRAIN_ARGS...
"""
import os
import sys
from pathlib import Path

ckdir = Path(sys.argv[1])
args = sys.argv[sys.argv.index("--") + 1:]
ckpts = sorted(ckdir.glob("step_*.pt"), key=lambda p: p.stat().st_mtime) if ckdir.is_dir() else []
if ckpts:
    args += ["--resume", str(ckpts[-1])]
os.execv(sys.executable, [sys.executable, "-m", "supervisor.demo.train", *args])
