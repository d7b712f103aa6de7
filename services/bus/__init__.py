"""The bus: the request/reply transport, the Python client, the reclaimer of stuck requests."""
