"""The readiness quicklist: one row per checkpoint, in the SPEC's ``checkpoints --json`` shape.

A checkpoint is ready when it exists and is complete, its digest matches its manifest, its
config snapshot matches the job's current config (allow-listed keys aside), its load test
passes, (optionally) a validation metric is recorded, and it is not marked bad. Every "no"
carries a reason a human can act on.
"""
from __future__ import annotations

import fnmatch
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .loadtest import LoadTestResult
from .. import strictjson
from ..textescape import escaped

MetricsSeen = Mapping[str, Sequence[tuple[int, float]]]  # name -> [(step, value), ...]


@dataclass(frozen=True)
class ValMetric:
    name: str
    value: float
    step: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "step": self.step}


@dataclass(frozen=True)
class Readiness:
    """One quicklist row. ``to_json()`` gives exactly the SPEC fields (plus layout/notes)."""

    path: Path
    step: int | None
    layout: str
    exists: bool
    complete: bool
    sha256_ok: bool | None
    config_matches: bool | None
    config_diff: Mapping[str, tuple[Any, Any]]
    val_metric: ValMetric | None
    load_test: LoadTestResult | None
    ready: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    bad: bool = False
    mtime: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "step": self.step,
            "exists": self.exists,
            "complete": self.complete,
            "sha256_ok": self.sha256_ok,
            "config_matches": self.config_matches,
            "config_diff": {k: [_jsonable(a), _jsonable(b)] for k, (a, b) in self.config_diff.items()},
            "val_metric": self.val_metric.to_json() if self.val_metric else None,
            "load_test": self.load_test.to_json() if self.load_test else None,
            "ready": self.ready,
            "reasons": list(self.reasons),
            "layout": self.layout,
            "notes": list(self.notes),
        }


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return json.loads(strictjson.dumps(v, default=str))


# ---------------------------------------------------------------- config snapshot and diff

def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``); lists stay values."""
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    elif prefix:
        out[prefix] = obj
    return out


def load_config_file(path: Path) -> dict[str, Any]:
    """Parse a JSON, TOML or YAML config file (YAML needs PyYAML). Raises ValueError with a reason."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"job config file {path} unreadable: {exc.strerror or exc}") from exc
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:
                raise ValueError(f"job config file {path.name} is YAML but PyYAML is not installed") from exc
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        if isinstance(exc, ValueError) and "PyYAML" in str(exc):
            raise
        raise ValueError(f"job config file {path.name} does not parse: {exc}") from exc
    except Exception as exc:  # yaml.YAMLError without importing yaml at module level
        raise ValueError(f"job config file {path.name} does not parse: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"job config file {path.name} is not a mapping at the top level")
    return data


def parse_launch_args(argv: Sequence[str]) -> dict[str, Any]:
    """``--key=value``, ``--key value`` and bare ``--flag`` (True) pairs; dashes become underscores.

    nanoGPT-style ``--batch_size=12`` and ``key=value`` overrides (Hydra) are both understood.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        if a.startswith("--") and len(a) > 2:
            body = a[2:]
            if "=" in body:
                k, v = body.split("=", 1)
                out[k.replace("-", "_")] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
                out[body.replace("-", "_")] = argv[i + 1]
                i += 1
            else:
                out[body.replace("-", "_")] = True
        elif "=" in a and not a.startswith("-") and a.split("=", 1)[0].replace(".", "").replace("_", "").isalnum():
            k, v = a.split("=", 1)
            out[k.lstrip("+")] = v
        i += 1
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal, allowing for launch args being strings ("0.001" == 1e-3, "true" == True)."""
    if a == b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)
    return fa == fb or (math.isnan(fa) and math.isnan(fb))


def config_diff(snapshot: Any, current: Mapping[str, Any], *, allow: Iterable[str], union: bool) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between a manifest's config snapshot and the current config.

    ``union=False`` (a client snapshot, usually a subset such as the hyperparameters) compares
    the keys both sides have; ``union=True`` (a supervisor snapshot of the same shape) also
    reports keys that appeared or disappeared.
    """
    old = flatten(snapshot) if isinstance(snapshot, Mapping) else {}
    allow = tuple(allow)
    keys = (set(old) | set(current)) if union else (set(old) & set(current))
    out: dict[str, tuple[Any, Any]] = {}
    for k in sorted(keys):
        if any(fnmatch.fnmatchcase(k, pat) or fnmatch.fnmatchcase(k.rsplit(".", 1)[-1], pat) for pat in allow):
            continue
        a, b = old.get(k), current.get(k)
        if not _same(a, b):
            out[k] = (a, b)
    return out


def current_config(job_config_file: Path | None, job_argv: Sequence[str]) -> tuple[dict[str, Any], str | None]:
    """The job's current config flattened (file, then launch args over it) and a problem, if any."""
    cfg: dict[str, Any] = {}
    problem = None
    if job_config_file is None and not job_argv:
        # Outside the daemon with no config and no ledger: nothing to compare against, which is
        # not the same as every key differing from None (that marked resumable checkpoints No).
        return cfg, "no command known (pass --config, or a --state-dir whose ledger recorded the run)"
    if job_config_file is not None:
        try:
            cfg.update(flatten(load_config_file(job_config_file)))
        except ValueError as exc:
            problem = str(exc)
    cfg.update(parse_launch_args(list(job_argv)[1:]))
    return cfg, problem


# ---------------------------------------------------------------- validation metric

def val_metric_for(step: int | None, name: str, manifest_metrics: Mapping[str, Mapping[str, Any]] | None,
                   seen: MetricsSeen | None) -> ValMetric | None:
    """The manifest's metric, else the last one seen in the log at or before the checkpoint's step."""
    if manifest_metrics and name in manifest_metrics:
        m = manifest_metrics[name]
        s = m.get("step")
        return ValMetric(name, float(m["value"]), int(s) if isinstance(s, int) else (step if step is not None else -1))
    if seen and step is not None and name in seen:
        best = [(s, v) for s, v in seen[name] if s <= step]
        if best:
            s, v = max(best, key=lambda sv: sv[0])
            return ValMetric(name, float(v), int(s))
    return None


#: the training loss's name in MetricsSeen and manifests (beside the validation metric)
TRAIN_LOSS = "loss"


def nonfinite_metric(vm: ValMetric | None, train: ValMetric | None = None) -> str:
    """Why a checkpoint whose recorded validation metric is NaN or inf is not ready ("" when it is
    finite or there is none). One rule for the verb, the report and the daemon's choice: a state
    whose evaluation gave NaN is no state to go back to, unless the training loss recorded at the
    same step or after it is finite: then the evaluation is broken (an empty validation loader
    gives NaN at every eval), not the weights, and refusing every checkpoint would send a crash
    back to step 0 (the watcher says such a run's eval_nonfinite)."""
    if vm is None or math.isfinite(vm.value):
        return ""
    if train is not None and math.isfinite(train.value) and train.step >= vm.step:
        return ""
    return (f"its recorded {vm.name} is {vm.value} (step {vm.step}): not resumed from "
            "(restart --from PATH --force takes it anyway)")


def metrics_from_records(records: Iterable[Any]) -> dict[str, list[tuple[int, float]]]:
    """``events.MetricRecord``s -> ``MetricsSeen`` (val_loss and ``extra`` values with a step)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.step is None:
            continue
        if r.val_loss is not None:
            out.setdefault("val_loss", []).append((r.step, r.val_loss))
        if r.loss is not None:
            out.setdefault(TRAIN_LOSS, []).append((r.step, r.loss))
        for k, v in (r.extra or {}).items():
            out.setdefault(k, []).append((r.step, v))
    return out


# ---------------------------------------------------------------- the human table

def _yn(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "No")


def render_table(rows: Sequence[Readiness]) -> str:
    """The quicklist for humans: one line per checkpoint, then each "No" with its reason. Every
    cell and reason is one line: a control byte in a name the job chose (``step_9\x1b[2J\nready``)
    is written as an escape (:func:`~supervisor.textescape.escaped`), never forging a row."""
    if not rows:
        return "no checkpoints found"
    head = ("step", "ready", "complete", "sha256", "config", "val metric", "load test", "path")
    table: list[tuple[str, ...]] = [head]
    for r in rows:
        vm = f"{r.val_metric.name}={r.val_metric.value:.4g}@{r.val_metric.step}" if r.val_metric else "-"
        lt = "-" if r.load_test is None else ("refused" if r.load_test.refused else "not tested"
                                              if r.load_test.untested else f"ok {r.load_test.seconds:.2f}s"
                                              if r.load_test.passed else "No")
        table.append((str(r.step) if r.step is not None else "?", "yes" if r.ready else "No", _yn(r.complete),
                      _yn(r.sha256_ok), _yn(r.config_matches), escaped(vm), lt, escaped(r.path)))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    for r in rows:
        for reason in r.reasons:
            lines.append(f"  {escaped(r.path.name)}: No: {escaped(reason)}")
        for k, (a, b) in r.config_diff.items():
            lines.append(escaped(f"  {r.path.name}: config {k}: {a!r} -> {b!r}"))
    return "\n".join(lines)


def compare_config(row: "RowBuilder", snapshot: Any, union: bool, current: tuple[dict[str, Any], str | None],
                   allow: Iterable[str]) -> None:
    """A manifest's config snapshot against the job's current config, into ``row``."""
    cur_cfg, problem = current
    if problem and not cur_cfg:
        row.notes.append(f"config not compared: {problem}")
        return
    diff = config_diff(snapshot, cur_cfg, allow=allow, union=union)
    row.config_diff = diff
    row.config_matches = not diff
    if diff:
        row.no("config differs from the snapshot in: " + ", ".join(diff) + " (allow with checkpoints.config_allow_diff)")


@dataclass
class RowBuilder:
    """Collects one row's findings; ``build()`` decides ``ready`` from them."""

    path: Path
    step: int | None
    layout: str
    mtime: float = 0.0
    exists: bool = True
    complete: bool = True
    sha256_ok: bool | None = None
    config_matches: bool | None = None
    config_diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    val_metric: ValMetric | None = None
    load_test: LoadTestResult | None = None
    bad: bool = False
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def no(self, reason: str) -> None:
        self.reasons.append(reason)

    def build(self) -> Readiness:
        ready = (self.exists and self.complete and self.sha256_ok is not False and self.config_matches is not False
                 and (self.load_test is None or self.load_test.passed or bool(self.load_test.untested))
                 and not self.bad and not self.reasons)
        return Readiness(path=self.path, step=self.step, layout=self.layout, exists=self.exists,
                         complete=self.complete, sha256_ok=self.sha256_ok, config_matches=self.config_matches,
                         config_diff=dict(self.config_diff), val_metric=self.val_metric, load_test=self.load_test,
                         ready=ready, reasons=tuple(self.reasons), notes=tuple(self.notes), bad=self.bad,
                         mtime=self.mtime)


def is_corrupt(row: Readiness) -> bool:
    """Unusable as stored (not a matter of config, trust or time): quarantine it. A load test
    that could not run (``untested``: no torch, no interpreter, died before a verdict) says
    nothing about the checkpoint, nor does the pickle scan's refusal of a load that passed."""
    if row.bad or not row.complete or row.sha256_ok is False:
        return True
    lt = row.load_test
    return lt is not None and not lt.passed and not lt.needs_pickle and not lt.untested \
        and "timed out" not in (lt.error or "") \
        and "missing top-level keys" not in (lt.error or "") and "cannot start" not in (lt.error or "") \
        and "non-finite" not in (lt.error or "")
