"""The daemon around the pure core: the ports every effect goes through (:mod:`.ports`), their
real implementations (:mod:`.adapters`, :mod:`.concerns`), the launch spec (:mod:`.launch`),
the recovery after a daemon restart (:mod:`.recovery`) and the one place that builds it all
from a config (:mod:`.wiring`). The loop itself is :mod:`supervisor.daemon.runner`.
"""
