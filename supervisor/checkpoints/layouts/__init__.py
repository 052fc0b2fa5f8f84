"""Checkpoint layouts: one module per on-disk format, each exporting one frozen ``SPEC``.

``registry.SPECS`` lists them in the order they are tried; discovery, the quicklist, the load
test and quarantine ask the registry, never a format by name. Adding a layout is one module here
plus its line in ``registry.py`` (see docs/DEVELOPING.md, "Adding a checkpoint layout").
"""
