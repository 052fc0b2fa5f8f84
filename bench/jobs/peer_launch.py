"""What a careful user puts in front of an unmodified nanoGPT-style train.py when the restarts come
from torchrun or a shell loop (bench/bench_recovery.py): resume if ``out_dir/ckpt.pt`` loads,
else start from scratch, then run the script in this same process (one torch import).

    peer_launch.py TRAIN_PY --out_dir=DIR ARGS...

The load test is ``torch.load(weights_only=True)``: a truncated file fails it and the run starts
from scratch with a line on stderr (resuming into it would fail at every restart). No other
check (no NaN check): that is what a supervisor adds.
"""
import os
import runpy
import sys


def main() -> None:
    script, args = sys.argv[1], sys.argv[2:]
    out = next((a.split("=", 1)[1] for a in args if a.startswith("--out_dir=")), "out")
    ckpt = os.path.join(out, "ckpt.pt")
    if os.path.exists(ckpt):
        import torch

        try:
            torch.load(ckpt, map_location="cpu", weights_only=True)
            args.append("--init_from=resume")
        except Exception as exc:  # any failure: from scratch
            print(f"peer_launch: {ckpt} does not load ({str(exc).splitlines()[0][:100]}); starting from scratch",
                  file=sys.stderr, flush=True)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
