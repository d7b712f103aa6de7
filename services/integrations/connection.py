"""The client an async adapter (``EngramSession``, ``EngramMemory``) works through."""

from __future__ import annotations

import asyncio

from engram_ledger.services.bus.client import EngramClient


class AdapterClient:
    """An ``EngramClient`` given by the caller (theirs to connect and close) or opened here
    from a URL (connected on first use, by one caller at a time; closed by ``close``)."""

    def __init__(self, url_or_client: str | EngramClient) -> None:
        self._owned = isinstance(url_or_client, str)
        # The developer's own code, as trusted as the command line: its deletes are one call.
        self._client = EngramClient(url_or_client, operator=True) if isinstance(url_or_client, str) else url_or_client
        self._connecting = asyncio.Lock()

    @property
    def url(self) -> str:
        return self._client.url

    async def ready(self) -> EngramClient:
        if self._owned and not self._client.connected:
            async with self._connecting:
                if not self._client.connected:
                    await self._client.connect()
        return self._client

    async def close(self) -> None:
        if self._owned and self._client.connected:
            await self._client.close()
