"""transformer-supervisor: a supervisor daemon for long transformer training runs.

The daemon side never imports torch; ``supervisor.client`` is the small library training
scripts may use (heartbeats, metrics, stop/checkpoint flags, atomic checkpoint saves).
"""

__version__ = "0.1.0"
