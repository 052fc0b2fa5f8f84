"""What a careful training script with auto-resume does, for the peer supervisors of bench_reboot
(torchrun, a shell loop): resume from the newest checkpoint in DIR that loads, then train.

    peer_resume.py DIR -- TRAIN_ARGS...

Candidates newest first (by the step in the name, then mtime); each is tried with
``torch.load(weights_only=True)``; one that fails to load (a truncated file) is skipped with a
line on stderr, as a script that catches the error and tries the previous one would. No other
verification (no NaN check): that is what the supervisor adds. The demo job then runs in this
same process (one torch import, as in a real script).
"""
import re
import runpy
import sys
from pathlib import Path


def _key(p: Path) -> tuple[int, float]:
    m = re.search(r"(\d+)", p.stem)
    return (int(m.group(1)) if m else -1, p.stat().st_mtime)


def newest_loadable(ckdir: Path) -> Path | None:
    if not ckdir.is_dir():
        return None
    import torch

    for p in sorted(ckdir.glob("step_*.pt"), key=_key, reverse=True):
        try:
            torch.load(p, map_location="cpu", weights_only=True)
            return p
        except Exception as exc:  # any failure: try the previous one
            print(f"peer_resume: {p.name} does not load ({str(exc).splitlines()[0][:100]}); trying the previous one",
                  file=sys.stderr, flush=True)
    return None


def main() -> None:
    ckdir = Path(sys.argv[1])
    args = sys.argv[sys.argv.index("--") + 1:]
    ck = newest_loadable(ckdir)
    if ck is not None:
        args += ["--resume", str(ck)]
    sys.argv = ["supervisor.demo.train", *args]
    runpy.run_module("supervisor.demo.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
