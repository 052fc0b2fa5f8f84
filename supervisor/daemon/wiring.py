"""The one place that builds the daemon from a config: the ports, the concerns, the runner."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO, Sequence

from ..config.model import Config, ConfigSource
from ..ledger.store import Ledger
from ..ops.control import ControlSocket
from ..ops.notify import Notifier
from ..job.osapi import Clock, OsApi
from ..job.output import SinkFanout
from .runner import Runner
from .adapters import ProcessLauncher
from .checkpointstore import CheckpointStorePort
from .checkpointwatch import CheckpointWatch
from .healthconcern import Backend, HealthMonitors, LaunchGatePort
from .ckptdiscovery import CheckpointDiscoveryPlugin, JobTakesCheckpoint
from .alerting import NotifyPlugin
from .knownsecrets import teach_gate
from .precursors import PrecursorPlugin
from .progress import GoodputPlugin, ValidationPlugin
from .resumewatch import ResumeWatchPlugin
from .concerns import OpsPlugin
from .watchconcern import WatchPlugin
from ..job.launch import Environment
from .plugin import Plugin
from .ports import CheckpointStore, Ports
from .statelock import StateLock, StateLockPlugin
from ..ownpaths import refuse_unsafe_as_root


def build_daemon(cfg: Config, *, config: ConfigSource | None = None, passthrough: BinaryIO | None = None,
                 extra: Sequence[Plugin] = ()) -> Runner:
    """The daemon for ``cfg``: the job's stdout goes to our stdout and its stderr to our stderr
    (or both to ``passthrough`` when one is given: the demo's console or /dev/null) besides its
    log file; ``extra`` concerns plug in after the standard ones (the demo's narration)."""
    teach_gate(cfg)  # before the first event: every sink masks the job's and our env's secrets
    state_dir = cfg.state_dir().resolve()
    # Before anything opens the ledger or the socket: a refused second daemon touches nothing.
    lock = StateLock.acquire(state_dir)
    if cfg.checkpoints.dir:
        try:
            refuse_unsafe_as_root(Path(cfg.checkpoints.dir), "checkpoint dir")
        except BaseException:
            lock.release()
            raise
    osapi = OsApi()
    fanout = SinkFanout()
    notifier = Notifier(enabled=cfg.systemd.notify, watchdog_enabled=cfg.systemd.watchdog,
                        extend_min_s=cfg.systemd.stop_extend_s)
    ledger = Ledger(state_dir)
    ledger.checkpoint_in_background()  # the WAL's fsyncs off the main loop (ledger/walcheckpoint.py)
    local = CheckpointStorePort(state_dir)  # the port: checkpoint I/O, on the preparation thread
    checkpoints = CheckpointWatch(local)  # the plug-in: the checkpoints while the job runs
    clock = Clock()
    watch = WatchPlugin(clock)
    gpus = Backend(cfg.gpu.backend)  # one backend: the gate's (a port) and the monitors' (a plug-in)
    health = HealthMonitors(gpus, newest_checkpoint_bytes=local.newest_bytes)
    goodput = GoodputPlugin()
    # [notify] first: it sees the events the others record while they start. Then discovery:
    # the health and checkpoint concerns read the checkpoint dir it may find.
    control = ControlSocket()  # bound by ops at start, bound again by the state lock in a re-created dir
    ops = OpsPlugin(notifier, lambda: local.svc, status_interval_s=cfg.systemd.status_interval_s, control=control)
    takes = JobTakesCheckpoint()  # what discovery learns of the job's resuming; each choice says it (the store)
    discovery = CheckpointDiscoveryPlugin(lambda found, replace=False: local.adopt(found, replace=replace).notes(),
                                          local.newest, takes)
    local.takes_checkpoint = takes
    concerns: list[Plugin] = [
        NotifyPlugin(), discovery, ops, watch, health, checkpoints, goodput,
        ValidationPlugin(goodput.tracks), ResumeWatchPlugin(), PrecursorPlugin(),
                               StateLockPlugin(lock, ledger, rebind=[control.rebind]), *extra]
    if cfg.web.listen:  # the live page: its own listener, imported only when configured
        from .webconcern import LivePagePlugin

        concerns.insert(len(concerns) - len(extra), LivePagePlugin())
    store: CheckpointStore = local
    if cfg.cluster.enabled:  # multi-node: imported only then, so a single node carries none of it
        from .clusterconcern import ClusterCheckpoints, ClusterLink, ClusterPlugin

        link = ClusterLink()  # the agent the plug-in starts, the plan the store's barrier sets
        concerns.insert(len(concerns) - len(extra), ClusterPlugin(cfg.cluster, cfg.job.name, link))
        store = ClusterCheckpoints(local, link)
    launcher = (ProcessLauncher(fanout, passthrough, osapi, passthrough) if passthrough is not None
                else ProcessLauncher(fanout, sys.stdout.buffer, osapi, sys.stderr.buffer))
    environment = Environment()
    launcher.note = environment.note  # [job] prewarm's outcome goes into the attempt's record
    ports = Ports(clock=clock, launcher=launcher,
                  ledger=ledger, checkpoints=store, gate=LaunchGatePort(gpus), notifier=notifier, osapi=osapi,
                  environment=environment)
    runner = Runner(cfg, ports, concerns, fanout=fanout, config=config)
    fanout.add(watch.lines)  # the job's lines to the log watcher (held until it is built), after the runner's sinks
    return runner
