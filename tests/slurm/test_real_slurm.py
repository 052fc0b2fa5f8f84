"""The Slurm recipe of docs/operating.md run under a real single-node Slurm (slurmctld, slurmd,
munge; tests/slurm/slurmcluster.py): the batch script is the doc's, with a one-minute time limit
and this checkout's job. Slurm's warning signal (``--signal=B:TERM@20``) reaches the batch shell,
its trap stops the supervisor, the job writes an emergency checkpoint, the supervisor exits 143,
the script requeues the job, and the requeued run continues the same supervised run from that
checkpoint and finishes. Skipped, with the reason, where Slurm cannot be installed or started."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT, history
from tests.slurm.slurmcluster import SlurmCluster, Unavailable, install

# A ceiling, not the usual time (about 1.5 min here): a fresh machine's apt-get install of
# slurm-wlm, and a loaded one where Slurm's next warning comes before a requeued run finishes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DOC = ROOT / "docs" / "operating.md"
JOB = ROOT / "tests" / "slurm" / "client_job.py"
WARN_S = 20  # with --time=1: Slurm sends it 10-40 s into a run (its 30 s time-limit tick; docs/operating.md)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    try:
        install()
        cluster = SlurmCluster()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        cluster.start()
    except Unavailable as e:
        cluster.stop(keep_logs=tmp_path / "slurm-logs")
        pytest.skip(f"Slurm does not start here: {e}")
    yield cluster
    cluster.stop(keep_logs=tmp_path / "slurm-logs")
    assert not cluster.leftovers(), "processes of the test's Slurm survived its stop"


def doc_recipe() -> str:
    """The batch script under "### Slurm" in docs/operating.md."""
    text = DOC.read_text()
    section = text[text.index("### Slurm"):]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, "docs/operating.md: no ```sh block under ### Slurm"
    return m.group(1)


def recipe(state_dir: Path, ckpt_dir: Path) -> str:
    """The doc's script with a test's resources, warning time and command; every other line (the
    trap, the waits, the requeue on 143) is run as the doc has it."""
    lines = doc_recipe().splitlines()
    out: list[str] = []
    wrap: list[str] = []  # the doc's command, over its continuation lines
    for line in lines:
        if line.startswith("#SBATCH --job-name="):
            out.append("#SBATCH --job-name=tsup-slurm-test --time=1")
        elif line.startswith("#SBATCH --signal=B:TERM@"):
            assert "@120" in line, line
            out.append(line.replace("120", str(WARN_S)))
        elif line.startswith("transformer-supervisor wrap ") or (wrap and wrap[-1].endswith("\\")):
            wrap.append(line.rstrip())
            if not line.rstrip().endswith("\\"):
                command = " ".join(wrap)
                for flag in ("--state-dir", "--checkpoint-dir", "--grace", "--resume-arg=--resume={checkpoint}"):
                    assert flag in command, f"the doc's command lost {flag}: {command}"
                assert command.endswith(" &"), command
                out.append(f"transformer-supervisor wrap --state-dir {state_dir} --checkpoint-dir {ckpt_dir} "
                           f"--grace 10 --resume-arg=--resume={{checkpoint}} -- {sys.executable} {JOB} &")
        else:
            out.append(line)
    script = "\n".join(out) + "\n"
    for needed in ("--requeue", "trap ", 'scontrol requeue "$SLURM_JOB_ID"', 'exit "$code"'):
        assert needed in script, f"the doc's recipe lost {needed!r}"
    return script


def wait_job(slurm: SlurmCluster, job_id: str, done: set[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        info = slurm.job(job_id)
        if info.get("JobState") in done:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not in {sorted(done)} within {timeout:g} s: {info}")
        time.sleep(0.5)


def test_time_limit_signal_checkpoints_exits_143_requeues_and_resumes(slurm: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    sd, ck, log = tmp_path / "sd", tmp_path / "ck", tmp_path / "slurm-job.out"
    ck.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(recipe(sd, ck))
    venv_bin = str(Path(sys.executable).parent)  # transformer-supervisor, as the doc calls it
    job_id = slurm.sbatch(f"--output={log}", f"--chdir={ROOT}", str(script),
                          env={"PATH": f"{venv_bin}:{slurm.env.get('PATH', '')}", "OMP_NUM_THREADS": "1",
                               "PYTHONUNBUFFERED": "1"})

    # Slurm's warning signal, the emergency checkpoint, exit 143 and the script's requeue; then
    # the requeued run resumes and finishes (a second warning can come first: it is requeued again).
    info = wait_job(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 480)
    out = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{out[-4000:]}"
    assert int(info["Restarts"]) >= 1, info  # requeued by the script at least once
    runs = [r["JobState"] for r in slurm.jobcomp(job_id)]  # Slurm's record of each run's end
    assert runs[0] == "PENDING" and runs[-1] == "COMPLETED" and len(runs) == int(info["Restarts"]) + 1, runs

    saved = re.search(r"emergency checkpoint (\S+) at step (\d+)", out)
    assert saved, out[-4000:]
    path, step = saved.group(1), int(saved.group(2))
    assert Path(path).parent == ck and Path(path).exists()
    assert Path(path + ".manifest.json").exists()  # written by the client with the checkpoint
    first_exit = out.index("transformer-supervisor exited 143")  # the script's line, before its requeue
    assert out.index(saved.group(0)) < first_exit
    resumed = out.index(f"resumed from {path} at step {step}")  # the requeued run, from that checkpoint
    assert resumed > first_exit
    assert "transformer-supervisor exited 0" in out[resumed:] and "finished at step" in out[resumed:]

    # One supervised run across the requeues: the ledger's second attempt resumed from the checkpoint.
    h = history(sd)
    assert h["state"] == "finished" and h["exit_code"] == 0, h
    first, second = h["attempts"][0], h["attempts"][1]
    assert first["checkpoint"] is None and first["exit_code"] == 0  # the job stopped cleanly on the signal
    assert second["checkpoint"] == path and second["resume_step"] == step, second
