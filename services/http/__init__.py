"""The HTTP API over the bus (``engram http``): the contracts as JSON resources under ``/v1``,
each route an edge that decodes, calls ``EngramClient`` and maps the reply; MCP on the same port."""
