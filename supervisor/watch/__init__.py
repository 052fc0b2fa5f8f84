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
from typing import TYPE_CHECKING

from ..lazyexports import lazy_exports

if TYPE_CHECKING:  # the names for the type checker; at run time each is imported on first use
    from .config import client_env
    from .heartbeat import HeartbeatMonitor
    from .logwatch import LogWatcher, metric_dict
    from .parsers import MetricParser
    from .stacks import dump_stacks, group_pids
    from .tail import FileTailer

_WHERE = {
    "HeartbeatMonitor": "heartbeat", "client_env": "config", "LogWatcher": "logwatch",
    "metric_dict": "logwatch", "MetricParser": "parsers", "dump_stacks": "stacks", "group_pids": "stacks",
    "FileTailer": "tail",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())

__all__ = ["FileTailer", "HeartbeatMonitor", "LogWatcher", "MetricParser", "client_env", "dump_stacks",
           "group_pids", "metric_dict"]
