"""Detectors over synthetic streams, through the LogWatcher (the path real lines take)."""
from __future__ import annotations

import math
import random
import threading
from dataclasses import replace

import pytest

from supervisor.events import Action, Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig, LossSpikeConfig, NanDetectorConfig, ParsersConfig, TextDetectorConfig
from supervisor.watch.logwatch import LogWatcher


class Collect:
    def __init__(self) -> None:
        self.detections: list[Detection] = []
        self.metrics: list[MetricRecord] = []


def watcher(cfg: DetectorsConfig | None = None) -> tuple[LogWatcher, Collect]:
    c = Collect()
    w = LogWatcher(cfg or DetectorsConfig(), c.detections.append, c.metrics.append)
    return w, c


def healthy_curve(seed: int, steps: int, noise: float = 0.04, outliers: float = 0.0) -> list[float]:
    """A decaying loss with multiplicative noise (and optional single-step outliers)."""
    rng = random.Random(seed)
    out = []
    for t in range(steps):
        base = 2.0 + 8.0 * math.exp(-t / 300) + 0.3 * math.exp(-t / 3000)
        v = base * (1 + rng.gauss(0, noise))
        if outliers and rng.random() < outliers:
            v *= rng.uniform(1.5, 3.0)  # one bad batch
        out.append(v)
    return out


def nanogpt_lines(losses: list[float], start: int = 0) -> list[str]:
    return [f"iter {start + i}: loss {v:.4f}, time 12.34ms, mfu 1.20%" for i, v in enumerate(losses)]


def feed_in_batches(w: LogWatcher, lines: list[str], source: str = "stdout", batch: int = 37) -> None:
    for i in range(0, len(lines), batch):
        w.feed(source, lines[i:i + batch])


@pytest.mark.parametrize("noise,outliers", [(0.02, 0.0), (0.05, 0.0), (0.08, 0.01)])
def test_healthy_noisy_curves_never_trigger(noise: float, outliers: float) -> None:
    for seed in range(40):
        w, c = watcher()
        feed_in_batches(w, nanogpt_lines(healthy_curve(seed, 1500, noise, outliers)))
        assert c.detections == [], (seed, c.detections[0].summary)
        assert len(c.metrics) == 1500


def test_real_spike_triggers_with_onset() -> None:
    losses = healthy_curve(1, 1200)
    onset = 900
    for i in range(onset, 1200):
        losses[i] *= 1.8 * math.exp(-(i - onset) / 400) + 1.0  # jumps, decays slowly
    w, c = watcher()
    feed_in_batches(w, nanogpt_lines(losses))
    assert [d.cause for d in c.detections] == [Cause.LOSS_SPIKE]
    d = c.detections[0]
    assert d.onset_step == onset
    assert d.step == onset + LossSpikeConfig().patience - 1
    assert d.evidence is not None and d.evidence.startswith(f"iter {d.step}: loss")
    assert d.value == pytest.approx(round(losses[d.step], 4))


def test_single_outlier_and_short_burst_are_not_spikes() -> None:
    losses = healthy_curve(2, 800, noise=0.02)
    losses[500] *= 5  # one outlier
    for i in range(600, 603):  # a burst shorter than patience
        losses[i] *= 2
    w, c = watcher()
    feed_in_batches(w, nanogpt_lines(losses))
    assert c.detections == []


def test_warmup_is_ignored_and_restarts_each_attempt() -> None:
    # Wild values in the first warmup_steps: no detection.
    rng = random.Random(3)
    wild = [10 * rng.random() + (50 if 40 < i < 60 else 0) for i in range(100)]
    w, c = watcher()
    feed_in_batches(w, nanogpt_lines(wild))
    assert c.detections == []
    # After a restart resuming at step 5000, warm-up counts from there again.
    w.reset(1, 5000)
    steady = [2.0 + 0.01 * (i % 3) for i in range(60)]
    burst = [9.0] * 30
    feed_in_batches(w, nanogpt_lines(steady + burst, start=5001))
    assert c.detections == []  # all within 100 steps of the resume step
    feed_in_batches(w, nanogpt_lines([2.0 + 0.01 * (i % 3) for i in range(40)] + [9.0] * 10, start=5091))
    assert [d.cause for d in c.detections] == [Cause.LOSS_SPIKE]
    assert c.detections[0].onset_step == 5131


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf"])
def test_nan_and_inf_fire_at_once(bad: str) -> None:
    w, c = watcher()
    lines = nanogpt_lines([2.5] * 10)
    lines.append(f"iter 10: loss {bad}, time 12.34ms, mfu 1.20%")
    lines.append("iter 11: loss nan, time 12.34ms, mfu 1.20%")
    feed_in_batches(w, lines)
    assert len(c.detections) == 1
    d = c.detections[0]
    assert d.cause is Cause.NAN and d.step == 10 and d.onset_step == 10
    assert d.value is not None and not math.isfinite(d.value)
    assert "step 10" in d.summary


def test_nan_consecutive_and_grad_norm() -> None:
    cfg = DetectorsConfig(nan=NanDetectorConfig(consecutive=3))
    w, c = watcher(cfg)
    lines = ['{"step": %d, "loss": 2.0, "grad_norm": %s}' % (i, "NaN" if i in (3, 6, 7, 8, 9) else "1.0")
             for i in range(12)]
    feed_in_batches(w, lines, batch=5)
    assert len(c.detections) == 1
    d = c.detections[0]
    assert (d.step, d.onset_step, d.details["field"]) == (8, 6, "grad_norm")


def test_megatron_nan_iterations_above_zero_is_a_value_and_a_detection() -> None:
    line = (" iteration      500/  500000 | lm loss: 7.1E+00 | grad norm: 2.0 | number of skipped iterations:   0 | "
            "number of nan iterations:   3 |")
    w, c = watcher()
    w.feed("stderr", ["some noise", line, "more noise"])
    [d] = c.detections
    assert d.cause is Cause.NAN and d.step == 500 and d.evidence == line.rstrip()
    assert d.summary.startswith("Megatron counted 3 nan iterations at step 500"), d.summary
    assert w.take_notices() == []  # a value, not a mention


@pytest.mark.parametrize("line", [
    "RuntimeError: Loss is NaN, stopping training",
    "ValueError: loss is nan at step 12",
    "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be clipped.",
])
def test_textual_nan_signs_are_a_warning_once_per_run_never_a_detection(line: str) -> None:
    # A word is not a value: the job's own exit (a crash) or its metrics decide, the line is said once.
    w, c = watcher()
    w.reset(0, None)
    w.feed("stderr", ["step 11 | loss 2.0", line, "more noise"])
    assert c.detections == []
    [n] = w.take_notices()
    assert n.event == "nan_mentioned" and n.level == "warning" and n.data["line"] == line and n.data["step"] == 11
    assert "not stopped" in n.message and "[detectors.nan] patterns" in n.message
    w.reset(1, 11)  # the next attempt prints it again at the same step: nothing more is said
    w.feed("stderr", ["step 11 | loss 2.0", line])
    assert c.detections == [] and w.take_notices() == []


def test_megatron_zero_nan_iterations_is_healthy() -> None:
    w, c = watcher()
    w.feed("stdout", [" iteration      500/  500000 | lm loss: 7.1E+00 | number of skipped iterations:   1 | "
                      "number of nan iterations:   0 |"])
    assert c.detections == [] and c.metrics[0].step == 500


TEXT_CASES = [
    (Cause.OOM, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                "of 79.11 GiB of which 1.06 GiB is free."),
    (Cause.OOM, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    (Cause.OOM, "MemoryError"),
    (Cause.OOM, "terminate called after throwing an instance of 'std::bad_alloc'"),
    (Cause.NCCL_TIMEOUT, "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
                         "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                         "600043 milliseconds before timing out."),
    (Cause.NCCL_TIMEOUT, "[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL watchdog thread terminated with exception"),
    (Cause.NCCL_TIMEOUT, "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                         "ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.20.5"),
    (Cause.NCCL_TIMEOUT, "NCCL communicator was aborted on rank 3."),
    (Cause.CRASH, "RuntimeError: CUDA error: an illegal memory access was encountered"),  # a crash, not NCCL's
    (Cause.CRASH, "RuntimeError: CUDA error: unspecified launch failure"),
    (Cause.GPU_FAULT, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."),
    (Cause.GPU_FAULT, "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    (Cause.CHECKPOINT_LOAD_ERROR, 'RuntimeError: Error(s) in loading state_dict for GPT: Missing key(s) in '
                                  'state_dict: "lm_head.weight".'),
    (Cause.CHECKPOINT_LOAD_ERROR, '\tUnexpected key(s) in state_dict: "transformer.h.12.attn.bias".'),
    (Cause.CHECKPOINT_LOAD_ERROR, "\tsize mismatch for wte.weight: copying a param with shape torch.Size([50304, 768]) "
                                  "from checkpoint, the shape in current model is torch.Size([50257, 768])."),
    (Cause.CHECKPOINT_LOAD_ERROR, "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
                                  "central directory"),
    (Cause.CHECKPOINT_LOAD_ERROR, "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded"),
    (Cause.CHECKPOINT_LOAD_ERROR, "EOFError: Ran out of input"),
    (Cause.CHECKPOINT_LOAD_ERROR, "RuntimeError: unexpected EOF, expected 1234 more bytes. The file might be corrupted."),
]


@pytest.mark.parametrize("cause,line", TEXT_CASES, ids=[f"{c.value}-{i}" for i, (c, _) in enumerate(TEXT_CASES)])
def test_text_detectors(cause: Cause, line: str) -> None:
    w, c = watcher()
    w.feed("stdout", nanogpt_lines([2.5] * 3, start=40))
    w.feed("stderr", ["Traceback (most recent call last):", line])
    assert [d.cause for d in c.detections] == [cause]
    d = c.detections[0]
    assert d.source == "stderr"
    assert d.step == 42 and d.onset_step == 42  # the last step seen before the error
    assert d.evidence == line.strip() or d.evidence == line.rstrip()


def test_fatal_xid_suggests_give_up() -> None:
    w, c = watcher()
    w.feed("stderr", ["NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE"])
    w.feed("stderr", ["NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception"])
    assert len(c.detections) == 1
    assert c.detections[0].suggested_action is Action.GIVE_UP and c.detections[0].value == 48


@pytest.mark.parametrize("line", [
    "INFO: memory usage 31.2 GiB of 80 GiB",
    "Setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation",
    "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "NCCL INFO comm 0x55d5 rank 0 nranks 8 cudaDev 0 - Init COMPLETE",
    "Loading checkpoint shards: 100%|##########| 4/4",
    "loaded state_dict from /ckpt/step_1000.pt (all keys matched)",
    "finance dataset: 1000 rows; nanogpt config loaded",
    "Watchdog timer set to 600s",
    "using the inference backend",
])
def test_benign_lines_do_not_trigger(line: str) -> None:
    w, c = watcher()
    w.feed("stdout", [line])
    assert c.detections == []


def test_fires_once_per_attempt_per_cause_and_rearms_on_reset() -> None:
    w, c = watcher()
    oom = "torch.OutOfMemoryError: CUDA out of memory."
    w.feed("stderr", [oom, oom])
    w.feed("file:/logs/rank1.log", [oom])
    w.feed("stdout", ["iter 3: loss nan, time 1ms"])
    assert [d.cause for d in c.detections] == [Cause.OOM, Cause.NAN]
    w.reset(1, None)
    w.feed("stderr", [oom])
    assert [d.cause for d in c.detections] == [Cause.OOM, Cause.NAN, Cause.OOM]


def test_disabled_detectors_and_user_patterns() -> None:
    cfg = DetectorsConfig(oom=TextDetectorConfig(enabled=False),
                          nccl_timeout=TextDetectorConfig(patterns=(r"heartbeat lost from peer \d+",)),
                          parsers=ParsersConfig(regexes=(r"^>> (?P<step>\d+) L=(?P<loss>\S+)",)))
    w, c = watcher(cfg)
    w.feed("stderr", ["torch.OutOfMemoryError: CUDA out of memory."])
    assert c.detections == []
    w.feed("stdout", [">> 7 L=2.5", ">> 8 L=nan"])
    assert [m.step for m in c.metrics] == [7, 8]
    assert [d.cause for d in c.detections] == [Cause.NAN]
    w.feed("stderr", ["heartbeat lost from peer 3"])
    assert c.detections[-1].cause is Cause.NCCL_TIMEOUT


def test_evidence_is_truncated() -> None:
    w, c = watcher(DetectorsConfig(evidence_chars=80))
    w.feed("stderr", ["CUDA out of memory. " + "x" * 5000])
    assert c.detections and len(c.detections[0].evidence or "") <= 80


def test_rank_streams_are_judged_separately() -> None:
    # Two ranks interleaved in one stream with different loss levels: no spike from interleaving.
    w, c = watcher()
    lines = []
    for i in range(600):
        lines.append(f"[rank0]: iter {i}: loss {2.0 + 0.01 * (i % 5):.4f}, time 1ms")
        lines.append(f"[rank1]: iter {i}: loss {3.0 + 0.01 * (i % 5):.4f}, time 1ms")
    feed_in_batches(w, lines)
    assert c.detections == []
    assert {m.rank for m in c.metrics} == {0, 1}


def test_client_metrics_source_marks_fmt() -> None:
    w, c = watcher()
    w.feed("file:/run/hb/metrics-rank0.jsonl", ['{"step":5,"loss":NaN,"rank":0,"attempt":0,"t":1.0}'])
    assert c.metrics[0].fmt == "client" and c.metrics[0].rank == 0
    assert c.detections[0].cause is Cause.NAN


def test_status_and_last_metric() -> None:
    w, c = watcher()
    assert w.last_metric() is None and w.status()["last_metric"] is None
    w.feed("stdout", ["iter 1: loss 2.5, time 1ms", "CUDA out of memory."])
    st = w.status()
    assert st["last_metric"]["step"] == 1 and st["last_metric"]["loss"] == 2.5  # type: ignore[index]
    assert st["last_anomaly"]["cause"] == "oom"  # type: ignore[index]
    assert st["lines"] == 2 and st["formats"] == {"nanogpt": 1}
    assert w.last_metric() == replace(c.metrics[0])


def test_feed_is_thread_safe() -> None:
    w, c = watcher()
    def reader(k: int) -> None:
        for i in range(200):
            w.feed(f"file:/r{k}", [f"iter {i}: loss 2.5, time 1ms", "noise line", "more noise"])
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(c.metrics) == 800 and w.status()["lines"] == 2400 and c.detections == []


def test_a_failing_sink_does_not_raise() -> None:
    def boom(_: MetricRecord) -> None:
        raise RuntimeError("sink broke")
    w = LogWatcher(DetectorsConfig(), lambda d: None, boom)
    w.feed("stdout", ["iter 1: loss 2.5, time 1ms"])  # must not raise
    w.feed("stdout", ["iter 2: loss 2.5, time 1ms"])
    assert w.status()["metric_records"] == 2


def test_every_rule_anchor_is_reachable_through_the_scan_keywords() -> None:
    # The LogWatcher only shows a detector lines containing one of its keywords, and a rule only
    # runs its regex when one of its anchors is on the line: every anchor must contain a keyword.
    from supervisor.watch import textrules as d

    for rules, kws in [(d.OOM_RULES, d.OOM_KEYWORDS), (d.NCCL_RULES + d.GPU_RULES, d.NCCL_KEYWORDS),
                       (d.CKPT_RULES, d.CKPT_KEYWORDS), (d.NAN_TEXT_RULES, d.NAN_TEXT_KEYWORDS)]:
        for rule in rules:
            assert rule.anchors, rule.pattern.pattern
            for anchor in rule.anchors:
                assert any(k in anchor for k in kws), (anchor, kws)


def test_user_nan_pattern_scans_every_line() -> None:
    w, c = watcher(DetectorsConfig(nan=NanDetectorConfig(patterns=(r"divergence detected",))))
    w.feed("stdout", ["step 5 ok", "divergence detected in layer 3"])
    assert [d.cause for d in c.detections] == [Cause.NAN]


@pytest.mark.parametrize("fmt", ["json", "hf", "nanogpt", "torchtitan", "megatron"])
def test_real_child_printing_nan_at_step_500(fmt: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    helper = Path(__file__).resolve().parents[1] / "helpers" / "watch_nan_child.py"
    w, c = watcher()
    p = subprocess.Popen([sys.executable, str(helper), fmt, "500"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    with p.stdout:
        for ln in p.stdout:  # the way the core's pipe readers deliver lines, in batches of one here
            w.feed("stdout", [ln.rstrip("\n")])
    assert p.wait(timeout=30) == 1
    assert [d.cause for d in c.detections] == [Cause.NAN]
    d = c.detections[0]
    if fmt == "hf":
        assert d.step is None  # HF Trainer lines carry no step (epoch only); client heartbeats do
    else:
        # Logged every 10 steps: the last finite record was step 490, so the poison may have
        # begun at 491, and that (not 500) is what a rollback must go back before.
        assert (d.step, d.onset_step) == (500, 491)
    assert d.evidence and ("nan" in d.evidence.lower())
    assert c.metrics[-1].fmt == fmt


def test_a_failing_metric_sink_does_not_swallow_detections() -> None:
    dets: list[Detection] = []

    def boom(_: MetricRecord) -> None:
        raise RuntimeError("sink broke")
    w = LogWatcher(DetectorsConfig(), dets.append, boom)
    w.feed("stdout", ["iter 1: loss 2.5, time 1ms", "iter 2: loss nan, time 1ms"])
    assert [d.cause for d in dets] == [Cause.NAN]


def test_nan_consecutive_counts_steps_not_duplicate_prints() -> None:
    w, c = watcher(DetectorsConfig(nan=NanDetectorConfig(consecutive=2)))
    w.feed("stdout", ["iter 10: loss nan, time 1ms"] * 4)  # four ranks, one step
    assert c.detections == []
    w.feed("stdout", ["iter 11: loss nan, time 1ms"])
    assert [(d.step, d.onset_step) for d in c.detections] == [(11, 10)]


def test_evidence_masks_credentials_even_where_it_is_cut() -> None:
    # A job's line becomes evidence (ledger, log, alerts): a URL password and a token in it are
    # masked, also when the bound falls inside the password (no "@" left to recognise it by).
    w, c = watcher(DetectorsConfig(evidence_chars=80))
    w.feed("stderr", ["CUDA out of memory. HF_TOKEN=hf_s3cr3t_1 db postgres://u:" + "S3CRET" * 50 + "@h/db"])
    ev = c.detections[0].evidence or ""
    assert c.detections[0].cause is Cause.OOM and len(ev) <= 80
    assert "hf_s3cr3t_1" not in ev and "S3CRET" not in ev and "HF_TOKEN=<redacted>" in ev
