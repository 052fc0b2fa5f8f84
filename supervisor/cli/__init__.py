"""The command line: the verbs and their flags (:mod:`.parser`), each verb's command and the
daemon's start (:mod:`.main`), the verbs that ask a running daemon or read a state dir
(:mod:`.verbs`) and what they print for people (:mod:`.render`). The start-up refusal to run beside
supervisord's package of the same import name is the top-level :mod:`supervisor.installcheck`
(``python -m supervisor.ops.units`` runs it too).
"""
