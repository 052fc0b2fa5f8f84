"""The command line: parsing and the daemon's start (:mod:`.main`), the verbs that ask a running
daemon or read a state dir (:mod:`.verbs`), and the start-up refusal to run beside supervisord's
package of the same import name (:mod:`.installcheck`).
"""
