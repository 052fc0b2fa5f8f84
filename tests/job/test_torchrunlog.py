"""torchrun's root cause from the output (job/torchrunlog.py): the summary's rank and exit code,
that rank's exception and last frame; nothing without the summary; other ranks' tracebacks never
taken for it; bounded and masked whatever the job prints. The lines are torch 2.13's as captured
from a real 2-rank run (tests/e2e/test_torchrun_rootcause.py runs one through the daemon)."""
from __future__ import annotations

import time

from supervisor.job.torchrunlog import MAX_TRACES, TorchrunOutput

RANK1 = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/srv/job.py", line 20, in <module>
[rank1]:     main()
[rank1]:   File "/srv/job.py", line 14, in main
[rank1]:     raise ValueError("boom at step 3")
[rank1]: ValueError: boom at step 3""".splitlines()

AGENT = """\
W1207 15:23:56.197000 419 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 437 closing signal SIGTERM
E1207 15:23:56.213000 419 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 438) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/lib/python3/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
job.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-07_15:23:56
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 437)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 437
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_15:23:56
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 438) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def agent(rank: int = 1, code: int = 1) -> list[str]:
    return AGENT.format(rank=rank, code=code).splitlines()


def fed(*batches: tuple[str, list[str]]) -> TorchrunOutput:
    out = TorchrunOutput("/state/job.log")
    for source, lines in batches:
        out.feed(source, lines)
    return out


def test_the_summary_names_the_rank_and_its_traceback_the_exception_and_frame() -> None:
    rank0 = [line.replace("rank1", "rank0").replace("ValueError: boom at step 3", "RuntimeError: peer gone")
             .replace("line 14", "line 99") for line in RANK1]
    rc = fed(("stdout", ["step 1 loss 2.9000", "step 3 loss 2.7000"]), ("stderr", rank0 + RANK1 + agent())).root_cause()
    assert rc is not None
    assert (rc.rank, rc.error_code, rc.exc_type, rc.message) == (1, 1, "ValueError", "boom at step 3")
    assert rc.last_frame == "/srv/job.py:14 in main" and rc.source == "output" and rc.file == "/state/job.log"
    assert rc.line() == "rank 1 raised ValueError: boom at step 3 (at /srv/job.py:14 in main)"
    assert rc.to_json()["source"] == "output"


def test_without_the_summary_there_is_no_root_cause_and_a_signal_is_said() -> None:
    assert fed(("stderr", RANK1)).root_cause() is None  # a traceback alone: torchrun did not say who failed
    killed = fed(("stderr", agent(rank=3, code=-9))).root_cause()
    assert killed is not None and (killed.rank, killed.error_code, killed.exc_type) == (3, -9, "")
    assert killed.line() == "rank 3 was killed by SIGKILL (no Python traceback of it in the output)"


def test_tee_prefixes_chained_exceptions_and_one_unprefixed_traceback() -> None:
    tee = [f"[default1]:{line.removeprefix('[rank1]: ')}" for line in RANK1]
    rc = fed(("stderr", tee + agent())).root_cause()
    assert rc is not None and rc.exc_type == "ValueError" and rc.last_frame == "/srv/job.py:14 in main"
    chained = [*RANK1[:-1], "[rank1]: KeyError: 'x'", "[rank1]: ",
               "[rank1]: During handling of the above exception, another exception occurred:", "[rank1]: ",
               "[rank1]: Traceback (most recent call last):", '[rank1]:   File "/srv/job.py", line 30, in save',
               "[rank1]: OSError: [Errno 28] No space left on device"]
    rc = fed(("stderr", chained + agent())).root_cause()
    assert rc is not None and (rc.exc_type, rc.last_frame) == ("OSError", "/srv/job.py:30 in save"), rc
    plain = [line.removeprefix("[rank1]: ") for line in RANK1]
    rc = fed(("stderr", plain + agent())).root_cause()  # the agent's own ChildFailedError is not a worker's
    assert rc is not None and rc.exc_type == "ValueError", rc
    two = fed(("stderr", plain + plain + agent())).root_cause()  # which rank printed which: unknown
    assert two is not None and two.rank == 1 and two.exc_type == "" and "exited with code 1" in two.line()


def test_a_secret_in_the_message_is_masked_and_hostile_output_is_bounded() -> None:
    leak = [*RANK1[:-1], "[rank1]: ValueError: cannot reach postgres://u:hunter2pass@db/x " + "y" * 100_000]
    rc = fed(("stderr", leak + agent())).root_cause()
    assert rc is not None
    assert "hunter2pass" not in rc.message and len(rc.message) < 2_000, rc.message[:200]
    # Many ranks' tracebacks: at most MAX_TRACES followed; the summary's rank still found if it was.
    many = [f"[rank{r}]: Traceback (most recent call last):" for r in range(MAX_TRACES + 500)]
    out = fed(("stderr", many))
    assert len(out._traces) == MAX_TRACES
    # Linear in what it reads: 4x the hostile bytes costs about 4x (never the square).
    hostile = ["[rank1]: Traceback (most recent call last):", "[rank1]: " + "A" * 500_000 + " " + ":" * 10,
               "[rank1]:   File \"" + "x" * 500_000, "[" + "a" * 400_000 + "1" * 10, "Root Cause" + "=" * 300_000]

    def cost(times: int) -> float:
        out = TorchrunOutput()
        t0 = time.process_time()
        for _ in range(times):
            out.feed("stderr", hostile * 10)
        return time.process_time() - t0

    small, big = cost(4), cost(16)
    assert big < 0.5 or big < 8 * max(small, 0.01), (small, big)
