"""The run report: the ledger collected into a :class:`~.page.ReportData` (:mod:`.collect`), written
as one self-contained HTML page with the loss curve (:mod:`.page`).
"""
