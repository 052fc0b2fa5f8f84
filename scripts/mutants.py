"""Break the code on purpose and check that a fast test notices.

Each mutation below replaces one exact snippet of the committed tree (``git archive HEAD``) in a
temporary copy; the fast suite (``-m "not slow and not systemd"``) then runs there with ``-x``,
the tests most likely to notice first. It runs as CI runs it (``scripts/test``): no PYTHONPATH, in
a virtual environment where the copy is the editable install of the package (the project venv's
own editable finder, pointed at the copy) and its console scripts are first on PATH, the
dependencies those of the project venv (a path entry), so every process a test starts (``python
-m supervisor``, ``transformer-supervisor``, a job importing the client) runs the mutated code,
and nothing passes or fails only because the harness set the environment up differently. A
mutation is *caught* when a test fails, *missed* when the fast suite passes: a missed mutation is
a hole in the tests. A snippet that no longer matches
exactly once is *stale*: the code moved; update the mutation (the script exits 1 for missed and
stale ones).

    ./scripts/mutants              # every mutation (about 1-3 min each on 2 cores)
    ./scripts/mutants onset nan    # the ones whose name contains a word

When you add a feature that a silent regression could break, add a mutation here: the smallest
edit that disables it, and the test files that should catch it first (``hint``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    hint: tuple[str, ...]  # test files run first (the whole fast suite follows if they pass)


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("nan detector off", "supervisor/watch/detectors.py",
             "        if self.fired or rec is None:\n            return None\n        bad = None",
             "        if True:\n            return None\n        bad = None",
             ("tests/watch/test_detectors.py",)),
    Mutation("hang never reported (output liveness)", "supervisor/watch/heartbeat.py",
             "        if silence is None:\n            return None\n        self._silence = silence",
             "        if True:\n            return None\n        self._silence = silence",
             ("tests/watch/test_liveness.py",)),
    Mutation("hang cause changed to a warning", "supervisor/core/causes.py",
             "CauseSpec(Cause.HANG, Action.RESTART,", "CauseSpec(Cause.HANG, Action.WARN,",
             ("tests/core/test_causes.py", "tests/daemon/test_runner_wiring.py", "tests/core/test_machine.py")),
    Mutation("onset dropped: rollback before the detection step", "supervisor/core/attempts.py",
             "return d.onset_step if d.onset_step is not None else d.step", "return d.step",
             ("tests/daemon/test_runner_wiring.py", "tests/core/test_machine.py")),
    Mutation("onset replaced by nothing", "supervisor/core/attempts.py",
             "return d.onset_step if d.onset_step is not None else d.step", "return None",
             ("tests/daemon/test_runner_wiring.py", "tests/core/test_machine.py")),
    Mutation("nan onset: first non-finite record, not after the last finite", "supervisor/watch/detectors.py",
             "if ok is not None and onset is not None and ok + 1 < onset:",
             "if False:", ("tests/watch/test_detectors.py",)),
    Mutation("quarantine is a no-op", "supervisor/checkpoints/quarantine.py",
             "        os.rename(path, held / name)  # same filesystem",
             "        pass  # os.rename(path, held / name)  # same filesystem",
             ("tests/checkpoints/test_checkpoint_quicklist.py", "tests/checkpoints/test_checkpoint_service.py")),
    Mutation("load test always passes", "supervisor/checkpoints/loadtest.py",
             "passed=bool(data.get(\"passed\"))", "passed=True",
             ("tests/checkpoints/test_checkpoint_quicklist.py", "tests/checkpoints/test_checkpoint_service.py")),
    Mutation("pickles trusted (weights_only=False)", "supervisor/checkpoints/_loadtest_script.py",
             "return torch.load(path, map_location=\"cpu\", weights_only=True, mmap=mmap)",
             "return torch.load(path, map_location=\"cpu\", weights_only=False, mmap=mmap)",
             ("tests/checkpoints/test_checkpoint_quicklist.py",)),
    Mutation("validation never fails", "supervisor/core/validation.py",
             "        return Verdict(not failed, tuple(checks)", "        return Verdict(True, tuple(checks)",
             ("tests/core/test_validation.py", "tests/daemon/test_runner_wiring.py")),
    Mutation("restart budget never spent", "supervisor/core/policy.py",
             "    if in_window + 1 > p.max_restarts:", "    if False:",
             ("tests/core/test_policy.py",)),
    Mutation("an action not counted spends the restart budget (a held wait gives up)", "supervisor/core/policy.py",
             "    if not ACTIONS[action].counted:  # neither the ladder nor the budget: the backoff alone",
             "    if False:", ("tests/core/test_action_recipe.py",)),
    Mutation("a held relaunch is not held (relaunched after the backoff)", "supervisor/core/attempts.py",
             "    return handler.hold(decision.cause) if handler is not None and decision.relaunch else None",
             "    return None", ("tests/core/test_action_recipe.py",)),
    Mutation("gave-up exit code changed", "supervisor/core/messages.py",
             "EXIT_GAVE_UP = 3", "EXIT_GAVE_UP = 1", ("tests/core/test_machine.py", "tests/watch/test_watch_e2e.py")),
    Mutation("SIGTERM stop exits 0 (schedulers see success)", "supervisor/core/attempts.py",
             "    return 128 + int(signal_number(stop_signal))", "    return EXIT_OK",
             ("tests/core/test_machine.py",)),
    Mutation("no SIGKILL escalation", "supervisor/daemon/jobstop.py",
             "        self.group.signal_group(signal.SIGKILL)", "        pass",
             ("tests/job/test_output_and_shutdown.py", "tests/daemon/test_runner_wiring.py")),
    Mutation("control socket mode 0666", "supervisor/ops/control.py",
             "os.chmod(self.path, 0o600)", "os.chmod(self.path, 0o666)", ("tests/ops/test_ops_control.py",)),
    Mutation("peer-uid check removed", "supervisor/ops/control.py",
             "return peer_uid == daemon_uid or peer_uid == 0", "return True", ("tests/ops/test_ops_control.py",)),
    Mutation("PYTHONUNBUFFERED not given to the job", "supervisor/job/launch.py",
             'added["PYTHONUNBUFFERED"] = "1"', "pass", ("tests/e2e/test_unmodified_delivery.py",)),
    Mutation("\\r no longer ends a line (tqdm bars)", "supervisor/job/linesplit.py",
             '.replace("\\r\\n", "\\n").replace("\\r", "\\n")', '.replace("\\r\\n", "\\n")',
             ("tests/job/test_output_and_shutdown.py", "tests/watch/test_logwatch_trainers.py")),
    Mutation("HF 5.x quoted values not parsed", "supervisor/watch/formats.py",
             "def parse_hf(", "def _unused_parse_hf(", ("tests/watch/test_parsers.py",)),
    Mutation("ordinary log lines not parsed (generic)", "supervisor/watch/parsers.py",
             "            return parse_generic(line, source, rank)", "            return None",
             ("tests/watch/test_generic.py", "tests/watch/test_generic_corpus.py")),
    Mutation("a loop's tqdm bar gives no step (NaN onset from elsewhere)", "supervisor/watch/formats.py",
             '            values["step"] = n', "            pass",
             ("tests/watch/test_generic.py", "tests/watch/test_generic_corpus.py")),
    Mutation("NaN named in prose fires a rollback", "supervisor/watch/detectors.py",
             "if m and (rule.unless is None or not rule.unless(line, m)):", "if m:",
             ("tests/watch/test_generic.py",)),
    Mutation("validation window counts records, not steps", "supervisor/core/validation.py",
             "if self.seen and self.steps_covered() >= self.cfg.steps:", "if len(self.seen) >= self.cfg.steps:",
             ("tests/core/test_validation.py",)),
    Mutation("the console blocks the job", "supervisor/job/console.py",
             "                if stalled_for >= self.stall_s:", "                if False:",
             ("tests/job/test_console.py",)),
    Mutation("metrics_blind never said (a job nothing parses watched in silence)", "supervisor/watch/blind.py",
             "            if not (by_lines or by_time):", "            if True:",
             ("tests/watch/test_blind.py",)),
    Mutation("a blind attempt's work ignored (a crash after unparsed steps backs off)", "supervisor/core/attempts.py",
             "        return showed_work(activity, after_s, active_s)", "        return False",
             ("tests/core/test_blind_progress.py",)),
    Mutation("resume_ignored never judged (a job that starts over after a resume passes unnoticed)",
             "supervisor/core/resumecheck.py",
             "    if first_step < resume_step / 2 and resume_step - first_step >= MIN_GAP:", "    if False:",
             ("tests/core/test_resumecheck.py", "tests/daemon/test_resume_discovery_wiring.py")),
    Mutation("the checkpoint dir named in the command ignored (relaunched fresh, no warning)",
             "supervisor/checkpoints/finddir.py",
             "        if v is not None:\n            return FoundDir(", "        if False:\n            return FoundDir(",
             ("tests/checkpoints/test_finddir.py", "tests/daemon/test_resume_discovery_wiring.py")),
    Mutation("a found checkpoint dir not applied to the running config", "supervisor/daemon/ckptdiscovery.py",
             "        return [UseConfig(new), *self.adopt(new, replace=moved)]", "        return ()",
             ("tests/daemon/test_resume_discovery_wiring.py",)),
    Mutation("the HF resume flag not inferred", "supervisor/job/resumeinfer.py",
             "    if has_flag(argv, \"--output_dir\") and _HF_MARKERS.search(src):", "    if False:",
             ("tests/job/test_resumeinfer.py", "tests/daemon/test_resume_discovery_wiring.py")),
    Mutation("metric files not followed by default", "supervisor/watch/config.py",
             "metric_files: bool = field(default=True,", "metric_files: bool = field(default=False,",
             ("tests/watch/test_metricfiles.py",)),
    Mutation("metric files: history replayed (an old NaN judged again)", "supervisor/watch/metricfiles.py",
             "history = first or (", "history = False and (", ("tests/watch/test_metricfiles.py",)),
    Mutation("metric file records skip the detectors", "supervisor/watch/logwatch.py",
             "            for det in metric_detectors:\n", "            for det in ():\n",
             ("tests/watch/test_metricfiles.py",)),
    Mutation("metric file steps noted at read time (liveness sees one burst per poll)", "supervisor/watch/logwatch.py",
             "at = max(at, min(now, now - (wall - w)))", "at = now", ("tests/watch/test_metricfiles.py",)),
    Mutation("an epoch-local counter read as the global step (epoch 1 iter 50 = step 50)", "supervisor/watch/logwatch.py",
             'rec = self._epochs.globalize(source, rec)  # "epoch 1 | iter 50"', 'rec = rec  # "epoch 1 | iter 50"',
             ("tests/watch/test_epochsteps.py",)),
    Mutation("a sparse step rhythm waits for 20 intervals (15 min for Lightning's defaults)", "supervisor/watch/liveness.py",
             "Cadence(cfg, learn_after=cfg.step_learn_after, provisional=True)", "Cadence(cfg)",
             ("tests/watch/test_step_cadence.py",)),
    Mutation("the first logged step does not time the rhythm (initial timeout until an interval)",
             "supervisor/watch/liveness.py", "self.first = (now - max(since, self._started), step, origin)", "pass",
             ("tests/watch/test_step_cadence.py",)),
    Mutation("CSVLogger rewrite delivers its rows again", "supervisor/watch/fileread.py",
             "f.skip_rows = f.rows", "f.skip_rows = 0", ("tests/watch/test_metricfiles.py",)),
    Mutation("TensorBoard record CRC not checked", "supervisor/watch/tbevents.py",
             "if data_crc != masked_crc(payload):", "if False:", ("tests/watch/test_tbevents.py",)),
    Mutation("the look reads no locals (an eval loop on one line is a spin: a false hang)", "supervisor/watch/look.py",
             '"--nonblocking", "--locals",', '"--nonblocking",', ("tests/watch/test_busy.py",)),
    Mutation("NaN weights at the end called finished (exit 0 over a NaN checkpoint)", "supervisor/core/runend.py",
             "    if facts.weights.finite is False:", "    if False:",
             ("tests/core/test_machine.py", "tests/e2e/test_quiet_end_e2e.py")),
    Mutation("a quiet job never called blind (run time not counted)", "supervisor/watch/blind.py",
             "by_time = self.after_s > 0 and start is not None and span >= self.after_s", "by_time = False",
             ("tests/watch/test_blind.py", "tests/e2e/test_quiet_end_e2e.py")),
    Mutation("the supervisor's own output suggested as the job's log", "supervisor/watch/candidates.py",
             "if st.st_mtime < since or file_id(st) in own:", "if st.st_mtime < since:",
             ("tests/watch/test_blind.py",)),
    Mutation("[notify] never hears of an event (nobody is told of a give-up)", "supervisor/daemon/recorder.py",
             'self.concerns.on_event(Noted(event, level, message, data, run_id, attempt, self.clock.time(),\n'
             '                                     self.clock.monotonic()))', "pass",
             ("tests/ops/test_notify_e2e.py",)),
    Mutation("[notify] secrets not masked by key", "supervisor/ops/alertmsg.py",
             "REDACTED if masks_key(str(k), v2) else", "REDACTED if False else",
             ("tests/ops/test_ops_alerts.py",)),
    # The ledger and the verbs both convert (a NaN in history passes two of them): break the helper.
    Mutation("strict JSON keeps a bare NaN (JSON.parse rejects history --json)", "supervisor/strictjson.py",
             "return value if math.isfinite(value) else _spell(value)", "return value",
             ("tests/cli/test_strict_json.py",)),
    Mutation("no TORCHELASTIC_ERROR_FILE for the job (torchrun's root cause lost)", "supervisor/job/launch.py",
             "if torchelastic.ENV not in env:", "if False:", ("tests/job/test_torchelastic.py",)),
    Mutation("torchrun's failing rank never matched", "supervisor/job/torchelastic.py",
             "if parts and parts[0] == text and parts[2] == stamp:", "if False:", ("tests/job/test_torchelastic.py",)),
    # Issue 34 part 5: the scan once passed any non-zip file not starting with \x80 (protocol 0/1).
    Mutation("pickle scan skips files without a PROTO opcode (protocol 0/1 handed over unread)",
             "supervisor/checkpoints/picklescan.py", "            else:\n                f.seek(0)\n",
             "            elif head.startswith(b\"\\x80\"):\n                f.seek(0)\n",
             ("tests/checkpoints/test_picklescan_formats.py", "tests/e2e/test_unsafe_pickle_e2e.py")),
    Mutation("pickle scan passes what it cannot read", "supervisor/checkpoints/picklescan.py",
             "        return (f\"{name}: cannot be read as a pickle",
             "        return None and (f\"{name}: cannot be read as a pickle",
             ("tests/checkpoints/test_picklescan_formats.py",)),
    Mutation("pickle scan never looks inside a checkpoint's sub-folders", "supervisor/checkpoints/picklescan.py",
             "                todo.append(Path(e.path))", "                pass",
             ("tests/checkpoints/test_picklescan_formats.py",)),
    Mutation("pickle scan finds a folder's pickles by name only (model.pth.tar, state.pickle handed over unread)",
             "supervisor/checkpoints/picklescan.py", "                if not sniffed(e.path):\n",
             "                if True:\n", ("tests/checkpoints/test_picklescan_formats.py",)),
    Mutation("the load test loads a DCP .metadata with a plain pickle.load (its payload runs)",
             "supervisor/checkpoints/_loadtest_script.py", "return Allowlisted(f).load()", "return pickle.load(f)",
             ("tests/checkpoints/test_dcp_metadata_loadtest.py",)),
    Mutation("a node's texts go to etcd unmasked (an end request's summary, a plan's reason)",
             "supervisor/cluster/etcdtypes.py", "    return redact_line(text, WIRE_TEXT_CHARS)", "    return text",
             ("tests/cluster/test_secrets_to_etcd.py",)),
    # Issue 38 part 6: each of these escaped every fast test.
    Mutation("max_busy_s never ends a busy silence (a look's busy verdict past it)", "supervisor/watch/hanggate.py",
             "            if busy_for >= self.cfg.max_busy_s:\n                return self._bounded(det, busy_for)\n",
             "            if False:\n                return self._bounded(det, busy_for)\n", ("tests/watch/test_hanggate.py",)),
    Mutation("max_busy_s never ends a busy silence (a poll between looks)", "supervisor/watch/hanggate.py",
             "        if busy_for >= self.cfg.max_busy_s:\n            return self._bounded(det, busy_for)\n        if now",
             "        if False:\n            return self._bounded(det, busy_for)\n        if now",
             ("tests/watch/test_hanggate.py",)),
    Mutation("a divergence precursor asks the job for no checkpoint", "supervisor/daemon/precursors.py",
             '"reason": found.reason}), RequestCheckpoint()]', '"reason": found.reason})]',
             ("tests/daemon/test_precursor_request.py", "tests/daemon/test_plugins.py")),
    Mutation("a job in the standby shows the runner's command line (ps, pgrep -f, py-spy)", "supervisor/job/standby.py",
             'shown = load_sibling("argvarea").show(req["argv"]) if req.get("argv") else',
             'shown = None if req.get("argv") else', ("tests/job/test_prewarm_cmdline.py",)),
    Mutation("a standby runs stale code (imports never compared at the hand-over)", "supervisor/job/standby.py",
             "changed = seen.changed() if seen is not None else None", "changed = None",
             ("tests/e2e/test_prewarm_e2e.py",)),
    Mutation("a ledger write under another process's lock waits the full busy timeout", "supervisor/ledger/store.py",
             'self.db.execute(f"PRAGMA busy_timeout={int(WRITE_WAIT_S * 1000)}")', "pass",
             ("tests/ledger/test_deferred.py", "tests/daemon/test_ledger_locked.py")),
    Mutation("a CUDA error filed as nccl_timeout again", "supervisor/watch/detectors.py",
             "if Cause.CRASH not in self.fired and any(a in line for a in CUDA_ANCHORS):", "if False:",
             ("tests/watch/test_gpu_error_corpus.py", "tests/watch/test_detectors.py")),
    Mutation("a checkpoint whose recorded validation metric is NaN is ready", "supervisor/checkpoints/quicklist.py",
             "if vm is None or math.isfinite(vm.value):", "if True:",
             ("tests/checkpoints/test_checkpoints_relative_nan.py",)),
    Mutation("torchrun's summary in the output ignored (no root cause without @record)",
             "supervisor/job/torchrunlog.py", "            self._found = s\n", "            pass\n",
             ("tests/job/test_torchrunlog.py",)),
    Mutation("the live page's document skips the redaction gate", "supervisor/ops/livedata.py",
             "doc = redact_data(doc)", "doc = dict(doc)", ("tests/ops/test_livepage_budget.py",)),
    Mutation("the live page answers any method", "supervisor/ops/livepage.py",
             'if method not in ("GET", "HEAD"):', "if False:", ("tests/ops/test_livepage_budget.py",)),
    # issue 39: GPU health on a real node
    Mutation("stale GPU events delivered to the next attempt", "supervisor/health/gpumonitor.py",
             'self._safely(lambda: drain_stale(self._backend), "events")', "pass",
             ("tests/health/test_gpu_devices.py",)),
    Mutation("an Xid of another GPU, slice or process is acted on", "supervisor/health/gpumonitor.py",
             "why = foreign(ev, info, self._sel, self._readings, self._job_pids)", "why = None",
             ("tests/health/test_gpu_devices.py", "tests/health/test_gpu_e2e.py")),
    Mutation("one GPU NVML refuses to read crashes the gate", "supervisor/health/gate.py",
             "        except GpuDeviceError as exc:  # this device alone", "        except GpuLostError as exc:",
             ("tests/health/test_nvml_simulated.py",)),
    Mutation("Xid 63 (catalog: ignore) gives up a healthy run", "supervisor/health/xid.py",
             "    _info(63,", "    _node(63,", ("tests/health/test_health_gpu.py",)),
)


def _copy_tree(dest: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def ci_env(tree: Path, where: Path) -> tuple[Path, dict[str, str]]:
    """A venv at ``where`` in which ``tree`` is the editable install (see the module docstring);
    its python and the environment to run the suite with."""
    own_site = Path(sysconfig.get_paths()["purelib"])
    finders = sorted(own_site.glob("__editable___transformer_supervisor_*_finder.py"))
    if not finders:
        raise SystemExit(f"no editable install of the package in {sys.prefix}: run ./scripts/test once "
                         "(scripts/_venv.sh makes one)")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    py, bindir = where / "bin" / "python", where / "bin"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    finder = finders[-1].read_text().replace(repr(str(ROOT / "supervisor"))[:-1], repr(str(tree / "supervisor"))[:-1])
    (site / "__editable___tsup_mutant_finder.py").write_text(finder)
    (site / "__editable__.tsup_mutant.pth").write_text(
        "import __editable___tsup_mutant_finder; __editable___tsup_mutant_finder.install()\n")
    (site / "zz_deps.pth").write_text(f"{own_site}\n")  # after the venv's own: the dependencies
    own_bin = Path(sys.executable).parent
    for tool in own_bin.iterdir():  # the console scripts, on the mutant's python
        dest = bindir / tool.name
        if dest.exists() or tool.name.startswith(("python", "activate", "Activate")):
            continue
        head = tool.read_bytes()[:256] if tool.is_file() else b""
        if head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]:
            dest.write_bytes(b"#!" + bytes(py) + b"\n" + tool.read_bytes().split(b"\n", 1)[1])
            dest.chmod(0o755)
        else:
            dest.symlink_to(tool)  # a binary (py-spy)
    path = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if Path(p) != own_bin]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # scripts/test's: its venv first on PATH, bytecode written (the tests' rewritten asserts cached).
    env.update(PATH=os.pathsep.join([str(bindir), *path]), VIRTUAL_ENV=str(where), PYTHONDONTWRITEBYTECODE="")
    return py, env


def _pytest(tree: Path, py: Path, env: dict[str, str], args: list[str], timeout: float) -> tuple[int, str]:
    try:
        cp = subprocess.run([str(py), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                             "-m", "not slow and not systemd", *args], cwd=tree, env=env,
                            capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return cp.returncode, cp.stdout + cp.stderr


def _first_failure(out: str) -> str:
    m = re.search(r"^FAILED (\S+)", out, re.M) or re.search(r"^ERROR (\S+)", out, re.M)
    return m.group(1) if m else "(the run failed without naming a test)"


def run(mutation: Mutation, base: Path, suite: tuple[str, ...] = ()) -> tuple[str, str, float]:
    """caught, missed or stale, with the failing test or why, and the seconds taken. ``suite``:
    the test files run after the hints (default: the whole fast suite); none past the hints when
    it is the hints themselves."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutant-", dir=base) as d:
        tree = Path(d) / "tree"
        tree.mkdir()
        _copy_tree(tree)
        target = tree / mutation.path
        if not target.exists():
            return "stale", f"{mutation.path} does not exist", 0.0
        text = target.read_text()
        if text.count(mutation.old) != 1:
            return "stale", f"the snippet occurs {text.count(mutation.old)} times in {mutation.path}", 0.0
        target.write_text(text.replace(mutation.old, mutation.new))
        py, env = ci_env(tree, Path(d) / "venv")
        hint = [h for h in mutation.hint if (tree / h.partition("::")[0]).exists()]
        if hint:
            rc, out = _pytest(tree, py, env, hint, 600)
            if rc not in (0, 5):
                return "caught", _first_failure(out), time.monotonic() - t0
        if not suite or list(suite) != hint:
            rc, out = _pytest(tree, py, env, list(suite), 1200)
            if rc not in (0, 5):
                return "caught", _first_failure(out), time.monotonic() - t0
        return "missed", f"{'the fast suite' if not suite else ' '.join(suite)} passed", time.monotonic() - t0


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not argv or any(w.lower() in m.name.lower() for w in argv)]
    base = Path(tempfile.mkdtemp(prefix="tsup-mutants-"))
    bad = 0
    print(f"{len(chosen)} mutations of {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}\n")
    print("| mutation | result | caught by | s |\n|---|---|---|---:|")
    for m in chosen:
        result, detail, secs = run(m, base)
        bad += result != "caught"
        print(f"| {m.name} | {result} | {detail} | {secs:.0f} |", flush=True)
    print(f"\n{len(chosen) - bad} of {len(chosen)} caught by a fast test")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
