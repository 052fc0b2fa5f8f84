"""build_detectors is derived from DETECTORS: a detector that no spec lists never sees a line, so
this test fails on one (DEVELOPING.md "Adding a cause", step 2)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import get_type_hints

from supervisor.watch.config import DetectorsConfig, NanDetectorConfig
from supervisor.watch.detectors import DETECTORS, build_detectors

ROOT = Path(__file__).resolve().parents[2]
# The Detector protocol's observe(self, source, line, rec, step).
OBSERVE_ARGS = ["self", "source", "line", "rec", "step"]
# [detectors.<name>] tables with an `enabled` switch that are not Detectors, and why.
NOT_DETECTORS = {"precursor": "a checkpoint-now watch on the metrics (daemon/precursors.py), not a Detection"}


def detector_classes() -> set[str]:
    """module.Class of every class in supervisor/ that defines the protocol's observe, or derives
    from one that does; the Protocol itself left out."""
    classes: dict[str, tuple[str, list[str], bool]] = {}
    for path in sorted((ROOT / "supervisor").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                     for b in node.bases]
            if "Protocol" in bases:
                continue
            observes = any(isinstance(f, ast.FunctionDef) and f.name == "observe"
                           and [a.arg for a in f.args.args] == OBSERVE_ARGS for f in node.body)
            classes[f"{module}.{node.name}"] = (node.name, bases, observes)
    found = {q for q, (_, _, observes) in classes.items() if observes}
    while True:  # subclasses of a detector are detectors (by class name: the tree has no two alike)
        names = {classes[q][0] for q in found}
        more = {q for q, (_, bases, _) in classes.items() if q not in found and names & set(bases)}
        if not more:
            return found
        found |= more


def registered() -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for spec in DETECTORS for c in spec.classes}


def test_every_detector_class_is_registered() -> None:
    found = detector_classes()
    assert "supervisor.watch.detectors.NcclDetector" in found  # the scan sees subclasses too
    missing = found - registered()
    assert not missing, (f"detector classes no DetectorSpec lists, so build_detectors never makes them: "
                         f"{sorted(missing)}; add them to DETECTORS in supervisor/watch/detectors.py")


def test_every_detector_table_is_registered() -> None:
    tables = {name for name, t in get_type_hints(DetectorsConfig).items()
              if dataclasses.is_dataclass(t) and "enabled" in {f.name for f in dataclasses.fields(t)}}
    names = [spec.name for spec in DETECTORS]
    assert len(names) == len(set(names))
    assert tables - set(NOT_DETECTORS) == set(names), "a [detectors.<name>] table with no DetectorSpec (or the reverse)"


def test_the_specs_list_what_they_build() -> None:
    on = DetectorsConfig(nan=NanDetectorConfig(patterns=("loss is nan",)))
    built = {f"{type(d).__module__}.{type(d).__qualname__}" for d in build_detectors(on)}
    assert built == registered()
    for spec in DETECTORS:
        made = {type(d) for d in spec.build(on, on.evidence_chars)}
        assert made <= set(spec.classes), (spec.name, made)


def test_a_disabled_table_builds_nothing() -> None:
    for spec in DETECTORS:
        off = DetectorsConfig(**{spec.name: dataclasses.replace(getattr(DetectorsConfig(), spec.name), enabled=False)})
        assert len(build_detectors(off)) == len(build_detectors(DetectorsConfig())) - len(spec.build(off, off.evidence_chars))
