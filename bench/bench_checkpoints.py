"""Checkpoint verification speed: our streaming hash vs ``sha256sum`` on the same file, same run,
and the load test (subprocess with the job's python) vs a bare ``python -c "torch.load(...)"``.

``python bench/bench_checkpoints.py [SIZE_MB]`` prints the rows (default 1024 MB; e.g. 64 for a
quick run; env BENCH_CKPT_MB works too); ``run(size_mb)`` returns them for scripts/bench.
Both hashers read a warm page cache (the file is read once before timing), so the ratio compares
the hashing loops, not the disk.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.checkpoints.hashing import blake3_available, file_digest  # noqa: E402
from supervisor.checkpoints.loadtest import LoadTestRequest, run_load_test  # noqa: E402


def _best_of(n: int, fn: object) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def _write_random(path: Path, size_mb: int) -> None:
    chunk = os.urandom(8 * 1024 * 1024)
    with open(path, "wb") as f:
        for _ in range(max(1, size_mb // 8)):
            f.write(chunk)


def run(size_mb: int | None = None) -> list[dict[str, object]]:
    size_mb = size_mb or int(os.environ.get("BENCH_CKPT_MB", "1024"))
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as d:
        f = Path(d) / "blob.bin"
        _write_random(f, size_mb)
        mb = f.stat().st_size / 1e6
        file_digest(f)  # warm the page cache for both contenders
        ours = _best_of(3, lambda: file_digest(f, "sha256"))
        rows.append({"name": "checkpoint sha256 throughput", "value": round(mb / ours, 1), "unit": "MB/s",
                     "target": None})
        if shutil.which("sha256sum"):
            theirs = _best_of(3, lambda: subprocess.run(["sha256sum", str(f)], check=True, capture_output=True))
            rows.append({"name": "checkpoint sha256 vs sha256sum", "value": round(theirs / ours, 3), "unit": "x",
                         "target": ">= 0.9", "peer": f"sha256sum {mb / theirs:.1f} MB/s"})
            if blake3_available():
                b3 = _best_of(3, lambda: file_digest(f, "blake3"))
                rows.append({"name": "checkpoint blake3 vs sha256sum", "value": round(theirs / b3, 3), "unit": "x",
                             "target": ">= 2", "peer": f"sha256sum {mb / theirs:.1f} MB/s"})
        f.unlink()
        # Load test: a torch checkpoint of the same size, our subprocess vs a bare torch.load.
        ck = Path(d) / "step_1.pt"
        py = sys.executable
        subprocess.run([py, "-c", "import torch,sys; n=int(sys.argv[2])*1024*1024//4; "
                        "torch.save({'model': {'w': torch.randn(n)}, 'optimizer': {}, 'step': 1}, sys.argv[1])",
                        str(ck), str(size_mb)], check=True)
        bare = _best_of(2, lambda: subprocess.run(
            [py, "-c", f"import torch; torch.load({str(ck)!r}, map_location='cpu', weights_only=True)"],
            check=True, capture_output=True))
        results = []

        def ours_lt() -> None:
            results.append(run_load_test(LoadTestRequest(ck, expected_keys=("model",)), python=py, timeout_s=600))

        ours_t = _best_of(2, ours_lt)
        assert results and results[-1].passed, results[-1].error if results else "no result"
        rows.append({"name": "checkpoint load test wall time", "value": round(ours_t, 3), "unit": "s",
                     "target": "<= bare torch.load", "peer": f"bare python -c torch.load {bare:.3f} s"})
        rows.append({"name": "checkpoint load test vs bare torch.load", "value": round(ours_t / bare, 3), "unit": "x",
                     "target": "<= 1.1", "peer": f"{bare:.3f} s"})
    return rows


if __name__ == "__main__":
    for row in run(int(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(row)
