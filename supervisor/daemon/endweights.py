"""The finite check of the newest checkpoint when the job ends by itself with exit 0.

The same check a rollback target gets (the load test with ``check_finite``, in a child of the
job's Python: the daemon never imports torch), on the newest complete checkpoint the job left.
A job can exit 0 over NaN weights (a loop that logs nothing, or logs where no parser looks): its
exit code says it is done, not that its weights are sound. What the check could not judge (no
checkpoint, a load test that failed, a format whose tensors it cannot read alone) is said as not
checked, with why (supervisor.core.runend words the end from it).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from ..core.runend import WeightsCheck

if TYPE_CHECKING:
    from ..checkpoints.loadtest import LoadTestResult
    from ..checkpoints.service import CheckpointService

#: How often the waiting main loop feeds the watchdog while the check runs.
KEEPALIVE_S = 1.0
#: The load test's notes that say the finite check did not run for this format.
_NOT_JUDGED = ("finite check skipped", "finite check not done")


def check_newest_weights(svc: CheckpointService, keepalive: Callable[[], bool]) -> WeightsCheck:
    """Find the newest complete checkpoint and check that every tensor is finite; bounded by
    ``[checkpoints] load_timeout_s`` (the load test's own timeout), ``keepalive`` called meanwhile:
    when it says stop (SIGTERM came), the check is given up and said as not done (the load test
    itself is stopped with the others at the daemon's exit)."""
    from ..checkpoints.discovery import newest_complete
    from ..checkpoints.loadtest import LoadTestCancelled

    svc.set_writer_active(False)  # the job is gone: its last save is as settled as it will be
    newest = newest_complete(svc.discovery.scan())
    if newest is None:
        return WeightsCheck(None, None, note=f"no complete checkpoint in {svc.dir}")
    path = str(newest.path)
    if not svc.cfg.load_test:  # as a rollback's: no load test, no finite check
        return WeightsCheck(path, None, note=f"{path}: [checkpoints] load_test = false (no load test, no finite check)")
    if not svc.cfg.check_at_end:
        return WeightsCheck(path, None, note=f"{path}: [checkpoints] check_at_end = false")
    done: Future[LoadTestResult] = Future()

    def run() -> None:
        try:
            done.set_result(svc.load_tests.run(newest.path, str(newest.layout), finite=True))
        except BaseException as e:  # handed to the waiting loop
            done.set_exception(e)

    threading.Thread(target=run, name="checkpoint-verify-end", daemon=True).start()
    while True:
        if not keepalive():
            return WeightsCheck(path, None, note="the supervisor was asked to stop before the check ended")
        try:
            res = done.result(timeout=KEEPALIVE_S)
            break
        except TimeoutError:
            continue
        except LoadTestCancelled:
            return WeightsCheck(path, None, note="the supervisor was exiting: the check was stopped")
        except Exception as e:
            return WeightsCheck(path, None, note=f"the check failed: {e!r}")
    return weights_of(path, res)


def weights_of(path: str, res: LoadTestResult) -> WeightsCheck:
    """A load test's result with ``check_finite`` as the end's weights check."""
    if res.nonfinite:
        return WeightsCheck(path, False, tuple(res.nonfinite))
    if res.untested:  # no verdict: the job's python cannot load it (no torch), not a failed test
        return WeightsCheck(path, None, note=f"{path} was not load-tested: {res.untested}")
    if not res.passed:
        return WeightsCheck(path, None, note=f"the load test of {path} failed: {res.error}")
    skipped = next((n for n in res.notes if n.startswith(_NOT_JUDGED)), None)
    if skipped is not None:
        return WeightsCheck(path, None, note=f"{path}: {skipped}")
    return WeightsCheck(path, True)
