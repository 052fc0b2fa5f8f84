"""The ledger: the run's SQLite store (runs, attempts, events, metrics) and every SQL statement of
the project: the tables and their migrations (:mod:`.schema`), the store's reads and writes
(:mod:`.store`), a run as ``history`` shows it (:mod:`.history`), writes that never take the
daemon down (:mod:`.writeguard`), the run states it keeps (:mod:`.runstates`, derived from the
machine's), the connection the daemon's threads share (:mod:`.connection`).
"""
