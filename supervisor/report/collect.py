"""``transformer-supervisor report``: the ledger of a run -> the HTML report and the loss curve.

Reads only the state dir (the ledger's attempts, events and metric series); the checkpoint table
is the quicklist without running load tests (the report must not take minutes on a folder of
large checkpoints; ``checkpoints`` runs the full list), with the verdicts of the load tests that
did run (the daemon's, kept in the state dir) read back, under the run's own settings.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..core.goodput import goodput_of, tracks_from_rows
from ..ledger.errors import LedgerError
from ..ledger.store import Ledger


def goodput_from_ledger(led: Ledger, run_id: str, now: float | None = None) -> dict[str, Any] | None:
    import time

    gp = goodput_of(tracks_from_rows(led.attempts(run_id), led.metrics(run_id), every_s=0.0),  # type: ignore[arg-type]
                    now if now is not None else time.time())
    return gp.to_json() if gp is not None else None


def _checkpoint_dir(led: Ledger, run_id: str) -> Path | None:
    """The run's checkpoint dir as its stored config names it (relative to its workdir)."""
    cfg = led.run_config(run_id)
    ck = (cfg.get("checkpoints") or {}).get("dir")
    if not ck:
        return None
    workdir = (cfg.get("job") or {}).get("workdir")
    return Path(ck) if Path(ck).is_absolute() else Path(workdir or ".") / ck


def interval_from_ledger(led: Ledger, run_id: str) -> dict[str, Any] | None:
    """The checkpoint interval advice (``status``'s ``checkpoint_interval``) as the run left it:
    the interval that maximises goodput for the failure rate measured across the state dir's runs,
    and the goodput the job's own interval gives. None until there is a failure, a save and a step
    rhythm, or when it cannot be worked out (the report renders without it)."""
    from ..checkpoints.cadence import interval_advice

    try:
        advice = interval_advice(led, run_id, _checkpoint_dir(led, run_id))
    except Exception:  # advice only: never in the way of the report
        return None
    return advice.to_json() if advice is not None else None


def _service(led: Ledger, run_id: str, d: Path, state_dir: Path) -> Any:
    """A CheckpointService as the run's daemon built it (its recorded config: the same job python,
    expected keys and settings, so the daemon's load-test verdicts are found), running no load
    test and writing nothing."""
    from ..config.model import config_from_table
    from ..checkpoints.service import CheckpointService

    try:
        c = config_from_table(led.run_config(run_id), need_command=False)
        python, argv, cwd = c.job.python, list(c.job.command), c.workdir()
    except Exception:  # a run recorded by another version: the defaults, and fewer verdicts found
        c = config_from_table({"job": {"command": ["python"]}, "checkpoints": {"dir": str(d)}}, need_command=False)
        python, argv, cwd = None, [], None
    cc = dataclasses.replace(c.checkpoints, load_test=False, write_manifests=False, warm_verifier=False)
    return CheckpointService(cc, d, state_dir, python, argv, cwd, write_manifests=False)


def _with_verdict(row: dict[str, Any], svc: Any) -> dict[str, Any]:
    """The row with the load test that ran on this version of the file, if one did."""
    lt = svc.load_tests.cached(Path(row["path"])) if row.get("load_test") is None else None
    if lt is None:
        return row
    from ..checkpoints.pickledeny import scan_verdict
    from ..checkpoints.scancache import cached_refusal

    # A load that passed on a checkpoint the pickle scan refused is shown refused, as the verb shows it.
    refused = None if svc.cfg.trust_pickles else scan_verdict(cached_refusal(Path(row["path"])), lt)
    if refused:
        lt = dataclasses.replace(lt, refused=refused)
    row = {**row, "load_test": lt.to_json()}
    if not lt.passed:
        row["ready"] = False
        row["reasons"] = [*row.get("reasons", []), f"load test failed: {lt.error}"]
    return row


def _checkpoint_rows(led: Ledger, run_id: str, state_dir: Path) -> list[dict[str, Any]]:
    try:
        d = _checkpoint_dir(led, run_id)
        if d is None or not d.is_dir():
            return []
        svc = _service(led, run_id, d, state_dir)
        svc.set_writer_active(False)
        try:
            return [_with_verdict(r.to_json(), svc) for r in svc.quicklist()]
        finally:
            svc.close()
    except Exception as e:  # the report still renders without the table
        return [{"path": f"(checkpoint table unavailable: {e})", "step": None, "ready": False, "reasons": [str(e)]}]


def write_run_report(state_dir: Path, out_dir: Path, run_id: str | None = None,
                     summary: dict[str, Any] | None = None,
                     unreadable: dict[str, str] | None = None) -> tuple[Path, Path | None]:
    """Write the report of run ``run_id`` (the newest when None). A part of the ledger that cannot
    be read (a garbled page of events, attempts or metrics) is left out of the report and named,
    with its error, in ``unreadable`` when given (the caller says so and exits non-zero: the report
    is not whole); a ledger where not even the run can be read raises LedgerError."""
    from .data import ReportData
    from .page import write_report

    left_out: dict[str, str] = {} if unreadable is None else unreadable
    led = Ledger(state_dir, readonly=True)
    try:
        hist = led.history(run_id)
        rid = hist["run_id"]
        if rid is None:
            raise SystemExit(f"no run recorded in {state_dir}")
        left_out.update(hist.get("unreadable") or {})
        try:
            metrics = [(m["at"], m["step"], m["loss"], m["attempt"]) for m in led.metrics(rid)
                       if m["step"] is not None and m["loss"] is not None]
        except LedgerError as e:  # a garbled metrics page: the report without its loss curve
            metrics, left_out["metrics"] = [], e.message
        try:
            gp = goodput_from_ledger(led, rid)
        except LedgerError as e:  # the same pages (attempts, metrics): already named above
            gp = None
            left_out.setdefault("goodput", e.message)
        interval = interval_from_ledger(led, rid)
        rows = _checkpoint_rows(led, rid, state_dir)
    finally:
        led.close()
    facts = {"state": hist.get("state"), "exit code": hist.get("exit_code"), **(summary or {})}
    if hist.get("reason"):
        facts["ended because"] = hist["reason"]
    for part, error in left_out.items():
        facts[f"left out: the {part}"] = f"the ledger could not give them ({error})"
    data = ReportData.from_history(hist, metrics, rows, goodput=gp, summary=facts, interval=interval)
    return write_report(data, out_dir)
