"""The ledger: the run's SQLite store (runs, attempts, events, metrics, checkpoints) and every SQL
statement of the project (:mod:`.store`).
"""
