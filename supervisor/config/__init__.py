"""The config: the typed, frozen model the daemon runs on (:mod:`.model`), the TOML schema and its
checks with messages that name the key (:mod:`.schema`), and the generated reference of every key
(:mod:`.doc`).
"""
