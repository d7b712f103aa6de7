"""The language of the bus: commands, events, queries, replies and errors.

Everything here is a frozen msgspec Struct with an explicit wire tag (the ``type`` field) and a
``schema_version``. Nothing in this package does I/O.
"""
