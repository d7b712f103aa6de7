"""A write that timed out can be retried safely from the command line: the error names the
command id it used (for a person and under ``--json``), ``--command-id`` takes it back, and the
retry answers the first outcome without writing twice. A read that timed out says nothing was
changed."""

from __future__ import annotations

import asyncio
import json

import pytest

from engram_ledger.services import cli
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings
from tests.support import eventually


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_timed_out_save_is_retried_once_with_its_command_id(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENGRAM_REDIS_URL", redis_url)
    settings = service_settings(redis_url, index_enabled=False)
    # A service ran here and stopped: its groups exist, and what is sent meanwhile waits for it.
    await (await RunningService(settings).start()).stop()
    user = "retrier"

    def cli_run(*argv: str) -> tuple[int, str, str]:
        return _run(capsys, *argv)

    code, out, _ = await asyncio.to_thread(
        cli_run, "save", "--json", "--user", user, "--timeout", "1", "Alec retired in May"
    )
    assert code == 1
    error = json.loads(out)["error"]
    assert error["code"] == "TIMEOUT"
    command_id = error["command_id"]
    assert command_id in error["message"]

    code, _, err = await asyncio.to_thread(
        cli_run, "save", "--user", user, "--timeout", "1", "--command-id", "a-second-try", "Alec retired"
    )
    assert code == 1
    assert "--command-id a-second-try" in err, err

    code, out, _ = await asyncio.to_thread(cli_run, "get", "--json", "--user", user, "abcdefgh", "--timeout", "1")
    message = json.loads(out)["error"]
    assert message["code"] == "TIMEOUT" and "command_id" not in message
    assert "nothing was changed" in message["message"] and "may still be applied" not in message["message"]

    running = await RunningService(settings).start()  # the saves waited in the stream
    try:
        # The service takes the saves that waited before the retry is sent: the retry then
        # meets the first outcome of its command id.
        async with EngramClient(redis_url) as client:

            async def both_taken() -> bool:
                return (await client.list_notes(user)).total == 2

            await eventually(both_taken, what="the two saves that waited taken")
        code, out, _ = await asyncio.to_thread(
            cli_run, "save", "--json", "--user", user, "--command-id", command_id, "Alec retired in May"
        )
        assert code == 0, out
        retried = json.loads(out)
        assert retried["replayed"] is True
        code, out, _ = await asyncio.to_thread(cli_run, "list", "--json", "--user", user, "--after", retried["token"])
        contents = sorted(n["content"] for n in json.loads(out)["notes"])
        assert contents == ["Alec retired", "Alec retired in May"]  # each once, the retry wrote nothing
    finally:
        await running.stop()
