"""Watching the job from inside: log lines -> metrics -> detectors, file tailing, heartbeats.

Entry points (see each module's docstring):

- :class:`LogWatcher` (``logwatch``): the :class:`~supervisor.events.LineSink` for stdout, stderr
  and tailed files; parses metric lines (``parsers``) and runs the detectors (``detectors``):
  ``nan``, ``loss_spike``, ``oom``, ``nccl_timeout`` (+ ``gpu_fault`` for Xid lines),
  ``checkpoint_load_error``.
- :class:`FileTailer` (``tail``): a Monitor following ``job.watch_files`` globs into a LineSink.
- :class:`HeartbeatMonitor` (``heartbeat``): a Monitor emitting ``hang`` from per-rank heartbeats
  (``supervisor.client``), startup / checkpointing allowances, learned timeouts, output and
  progress stalls; it also tails the client's metric reports into the LogWatcher.
- :func:`dump_stacks` (``stacks``): py-spy dumps of a hung job's processes.
"""
from .heartbeat import HeartbeatMonitor, client_env
from .logwatch import LogWatcher, metric_dict
from .parsers import MetricParser
from .stacks import dump_stacks, group_pids
from .tail import FileTailer

__all__ = ["FileTailer", "HeartbeatMonitor", "LogWatcher", "MetricParser", "client_env", "dump_stacks",
           "group_pids", "metric_dict"]
