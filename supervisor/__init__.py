"""transformer-supervisor: a supervisor daemon for long transformer training runs.

The daemon side never imports torch; ``supervisor.client`` is the small library training
scripts may use (heartbeats, metrics, stop/checkpoint flags, atomic checkpoint saves).
"""

__version__ = "0.1.0"
#: marks this package as transformer-supervisor's: supervisord's ``supervisor`` package has the
#: same import name (see :mod:`supervisor.installcheck`)
__distribution__ = "transformer-supervisor"
