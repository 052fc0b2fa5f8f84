"""The job as processes: its launch spec (argv, env, working dir: :mod:`.launch`), the process
tree and what it left behind (:mod:`.process`), its pipes into the console and job.log
(:mod:`.output`), stopping it in timed phases (:mod:`.shutdown`), what it runs on
(:mod:`.envsnapshot`) and the OS boundary all of these go through (:mod:`.osapi`).
"""
