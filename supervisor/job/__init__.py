"""The job as processes: its launch spec (argv, env, working dir: :mod:`.launch`), the process
tree and what it left behind (:mod:`.process`, in a cgroup of its own where one can be made:
:mod:`.cgroup`), its pipes held by the output keeper process, which writes job.log
(:mod:`.keeper`), and the keeper's frames into the console and the line sinks (:mod:`.output`; :mod:`.console`, :mod:`.linesplit`), what it runs on
(:mod:`.envsnapshot`) and the OS boundary all of these go through (:mod:`.osapi`).
"""
