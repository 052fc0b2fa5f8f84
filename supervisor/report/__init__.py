"""The run report: the ledger collected into a :class:`~.data.ReportData` (:mod:`.collect`), the
restart markers worked out from it (:mod:`.data`), the loss curve drawn as a PNG (:mod:`.plot`)
and the self-contained HTML page written with it (:mod:`.page`).
"""
