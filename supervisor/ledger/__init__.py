"""The ledger: the run's SQLite store (runs, attempts, events, metrics) and every SQL statement of
the project: the tables and their migrations (:mod:`.schema`), the store's reads and writes
(:mod:`.store`), the connection the daemon's threads share (:mod:`.connection`).
"""
