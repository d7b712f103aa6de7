"""The bus for other languages: a client with nothing but `redis-cli` (no Python on its side)
talks to a running `engram serve`. It RPUSHes the documented JSON envelope onto the stream's
inbox and reads the reply on
its own Pub/Sub channel through `redis-cli SUBSCRIBE`: every reply, error replies included, is
the same JSON envelope, readable without FastStream's binary framing. Runs on one Redis and on
a Redis Cluster (``bus``)."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_ledger.contracts import channels
from tests.e2e.test_cli import serving
from tests.support import wait_until

REDIS_CLI = shutil.which("redis-cli")
pytestmark = pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not installed")


def redis_cli(env: dict[str, str]) -> list[str]:
    """The command line of a `redis-cli` on the service's Redis (following cluster redirects)."""
    assert REDIS_CLI is not None
    args = [REDIS_CLI, "-u", env["ENGRAM_REDIS_URL"]]
    return [*args, "-c"] if env.get("ENGRAM_REDIS_CLUSTER") == "on" else args


class RedisCliSubscription:
    """`redis-cli SUBSCRIBE <channel>`, read line by line. Without a terminal redis-cli prints
    each Pub/Sub message raw as three lines: `message`, the channel, the payload."""

    def __init__(self, cli: list[str], channel: str) -> None:
        self.channel = channel.encode()
        self.process = subprocess.Popen(
            [*cli, "--raw", "SUBSCRIBE", channel], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        # A reply published before the subscription is lost (Pub/Sub keeps nothing): a request
        # goes out only once redis-cli has said it is subscribed.
        assert [self._line() for _ in range(3)] == [b"subscribe", self.channel, b"1"]

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.removesuffix(b"\n"))
        self._lines.put(None)

    def _line(self, timeout: float = 15.0) -> bytes:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"redis-cli printed nothing on {self.channel!r} within {timeout} s") from None
        if line is None:
            assert self.process.stderr is not None
            raise AssertionError(f"redis-cli SUBSCRIBE ended: {self.process.stderr.read()!r}")
        return line

    def next_payload(self) -> bytes:
        kind, channel, payload = self._line(), self._line(), self._line()
        assert (kind, channel) == (b"message", self.channel)
        return payload

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class JsonClient:
    """What a client in any language does: route by ``crc32(user_id) mod P`` (P read from
    ``engram:partitions``), RPUSH ``{"data": <body as JSON text>, "headers": {reply_to,
    correlation_id}}`` onto the stream's inbox, and read the JSON envelope that comes back."""

    def __init__(self, env: dict[str, str]) -> None:
        self.cli = redis_cli(env)
        self.reply_to = f"engram:replies:cli-{uuid.uuid4().hex}"
        self.replies = RedisCliSubscription(self.cli, self.reply_to)
        self.partitions = int(self.run("GET", "engram:partitions"))

    def run(self, *args: str) -> str:
        done = subprocess.run([*self.cli, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and not done.stdout.startswith("ERR"), done
        return done.stdout.strip()

    def stream(self, kind: str, user_id: str) -> str:
        return f"engram:{{{zlib.crc32(user_id.encode()) % self.partitions}}}:{kind}"

    def send(self, stream: str, envelope: dict[str, Any]) -> dict[str, Any]:
        """RPUSH the envelope as it is onto the stream's inbox; returns the reply envelope,
        checked to be plain JSON."""
        length = self.run("RPUSH", f"{stream}:inbox", json.dumps(envelope))
        assert int(length) >= 1, length
        payload = self.replies.next_payload()
        # The whole payload is the JSON envelope: no binary header before it.
        assert payload.startswith(b'{"data":'), payload[:40]
        reply: dict[str, Any] = json.loads(payload)
        assert set(reply) == {"data", "headers"} and isinstance(reply["data"], str)
        return reply

    def request(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request, its reply's body (the ``data`` string parsed), the correlation id checked."""
        correlation_id = uuid.uuid4().hex
        reply = self.send(
            self.stream(kind, body["user_id"]),
            {"data": json.dumps(body), "headers": {"reply_to": self.reply_to, "correlation_id": correlation_id}},
        )
        assert reply["headers"]["correlation_id"] == correlation_id
        answer: dict[str, Any] = json.loads(reply["data"])
        return answer

    def close(self) -> None:
        self.replies.close()


@pytest.fixture
def env(bus: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    yield from serving(bus, tmp_path / "data", ENGRAM_INDEX="off")


@pytest.fixture
def json_client(env: dict[str, str]) -> Iterator[JsonClient]:
    client = JsonClient(env)
    yield client
    client.close()


def test_a_redis_cli_client_saves_a_note_and_reads_it_back_in_json(json_client: JsonClient) -> None:
    saved = json_client.request(
        "commands", {"type": "save_note", "command_id": "cli-json-1", "user_id": "ada", "content": "Ada likes tea"}
    )
    assert saved["type"] == "note_written" and saved["version"] == 1 and saved["replayed"] is False
    note_id, token = saved["note_id"], saved["token"]
    assert len(note_id) == 8
    assert channels.parse_token(token)[0] == zlib.crc32(b"ada") % json_client.partitions

    # The token makes the read wait for the write: read-your-writes, in JSON too.
    read = json_client.request("queries", {"type": "get_note", "user_id": "ada", "note_id": note_id, "after": token})
    assert read["type"] == "note"
    assert (read["note"]["id"], read["note"]["content"], read["note"]["version"]) == (note_id, "Ada likes tea", 1)

    # A retry with the same command id is answered with the first outcome, as for any client.
    again = json_client.request(
        "commands", {"type": "save_note", "command_id": "cli-json-1", "user_id": "ada", "content": "Ada likes tea"}
    )
    assert (again["note_id"], again["replayed"]) == (note_id, True)


def test_bad_requests_from_redis_cli_get_typed_errors_in_json(json_client: JsonClient) -> None:
    blank = json_client.request(
        "commands", {"type": "save_note", "command_id": "cli-json-2", "user_id": "ada", "content": "   "}
    )
    assert blank["type"] == "error" and blank["code"] == "INVALID_PARAMETER"
    assert "content" in blank["message"]

    unknown = json_client.request("commands", {"type": "save_everything", "user_id": "ada"})
    assert unknown["type"] == "error" and unknown["code"] == "INVALID_PARAMETER"

    missing = json_client.request("queries", {"type": "get_note", "user_id": "ada", "note_id": "Zz9Zz9Zz"})
    assert missing["type"] == "error" and missing["code"] == "MEMORY_NOT_FOUND"

    # A malformed envelope that names its reply_to is answered too: the body as an object
    # instead of JSON text.
    stream = json_client.stream("commands", "ada")
    body = {"type": "save_note", "command_id": "cli-json-3", "user_id": "ada", "content": "never saved"}
    reply = json_client.send(
        stream, {"data": body, "headers": {"reply_to": json_client.reply_to, "correlation_id": "as-object"}}
    )
    assert reply["headers"]["correlation_id"] == "as-object"
    refused = json.loads(reply["data"])
    assert refused["type"] == "error" and refused["code"] == "INVALID_PARAMETER"
    assert "`data` must be a string holding the JSON body, not an object" in refused["message"]

    # Nothing of it was written; every request was acknowledged and deleted once answered.
    partition = zlib.crc32(b"ada") % json_client.partitions
    assert json_client.run("XLEN", channels.event_log(partition)) == "0"
    wait_until(lambda: json_client.run("XLEN", stream) == "0")
    pending = json_client.run("XPENDING", stream, channels.COMMAND_GROUP).splitlines()
    assert pending[0] == "0", pending
