"""Multi-node runs: one supervisor per node, coordinated through etcd (``[cluster]``).

:mod:`.etcd` is the client (etcd's v3 JSON gateway over HTTP), :mod:`.coord` the pure
coordination rules (membership, leadership, generations, the checkpoint choice), :mod:`.agent`
the thread that talks to etcd for one node, :mod:`.concern` what plugs into the daemon.
"""
