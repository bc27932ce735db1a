"""Docker adapter, the Engine API's version and log framing, against a scripted daemon.

The daemon here answers as the Engine API reference says one does: ``/_ping`` with its newest
version in the ``API-Version`` header, ``/version`` with ``ApiVersion`` and ``MinAPIVersion``, a
``400`` for a path asked at a version outside its range (Engine 29: "client version 1.24 is too
old. Minimum supported API version is 1.44"; an unversioned path is not accepted here either, so a
client that forgets the version is caught), and from API 1.42 a log's framing in its
``Content-Type``. The real engine's side of the same is in test_node_docker.py.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from docker_support import wait_for
from gpuledger.node.docker import DockerSource
from gpuledger.node.docker_api import DockerApiError, DockerClient, negotiate_version, parse_api_version
from gpuledger.node.docker_logs import FrameDecoder, RawDecoder, decoder_for

CID = "c0ffee" + "0" * 58
T = "2026-12-04T10:00:00.000000001Z "
LINES = [b"epoch 1 done\n", b"epoch 2 done\n"]


def multiplexed(lines: list[bytes]) -> bytes:
    out = b""
    for line in lines:
        payload = T.encode() + line
        out += b"\x01\0\0\0" + len(payload).to_bytes(4, "big") + payload
    return out


def inspect_doc(tty: bool) -> dict:
    return {
        "Id": CID,
        "Name": "/trainer",
        "Config": {"Image": "yolo", "Tty": tty, "Env": [], "Labels": {"team": "vision"}},
        "State": {
            "Running": False,
            "Pid": 0,
            "ExitCode": 0,
            "StartedAt": "2026-12-04T10:00:00Z",
            "FinishedAt": "2026-12-04T10:05:00Z",
        },
        "HostConfig": {"DeviceRequests": None},
    }


class Daemon:
    """A Docker daemon speaking API ``lowest``..``newest``; ``log`` is what its logs endpoint sends."""

    def __init__(self, newest: str | None, lowest: str, *, tty: bool = False) -> None:
        self.newest, self.lowest, self.tty = newest, lowest, tty
        self.log_body, self.log_type = multiplexed(LINES), "application/vnd.docker.multiplexed-stream"
        self.paths: list[str] = []
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                daemon.paths.append(self.path.split("?", 1)[0])
                daemon.answer(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"tcp://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        headers = {"API-Version": self.newest} if self.newest else {}
        if path == "/_ping":
            return self._send(h, 200, b"OK", "text/plain", headers)
        if path == "/version":
            doc = {"ApiVersion": self.newest, "MinAPIVersion": self.lowest}
            return self._send(h, 200, json.dumps(doc).encode(), "application/json", headers)
        m = re.match(r"/v(\d+\.\d+)(/.*)", path)
        asked = parse_api_version(m.group(1)) if m else None
        if asked is None or asked < parse_api_version(self.lowest) or asked > parse_api_version(self.newest or "1.24"):
            why = f"client version {m.group(1) if m else 'unversioned'} is not supported: {self.lowest}..{self.newest}"
            return self._send(h, 400, json.dumps({"message": why}).encode(), "application/json", headers)
        rest = m.group(2)  # type: ignore[union-attr]
        if rest == "/containers/json":
            return self._send(h, 200, json.dumps([{"Id": CID, "State": "exited"}]).encode(), "application/json")
        if rest == f"/containers/{CID}/json":
            return self._send(h, 200, json.dumps(inspect_doc(self.tty)).encode(), "application/json")
        if rest == f"/containers/{CID}/logs":
            return self._send(h, 200, self.log_body, self.log_type)
        if rest == "/events":
            return self._send(h, 200, b"", "application/json")  # ends at once: the adapter reconnects
        self._send(h, 404, b'{"message": "no such thing"}', "application/json")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)


@pytest.fixture
def engine29() -> Iterator[Daemon]:
    daemon = Daemon("1.52", "1.44")
    yield daemon
    daemon.close()


# -- negotiation -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("daemon", "lowest", "spoken"),
    [
        ((1, 41), (1, 12), (1, 41)),  # Engine 20.10: its own version
        ((1, 52), (1, 44), (1, 52)),  # Engine 29
        ((1, 60), (1, 44), (1, 52)),  # newer than this client: the client's newest
        ((1, 70), (1, 60), (1, 60)),  # newer still: never below the daemon's minimum
        ((1, 9), None, None),  # compared as numbers, not text: 1.9 < 1.25
        (None, None, None),  # no API-Version header: 1.24 or older
    ],
)
def test_negotiation_picks_the_lower_newest_never_below_the_daemons_oldest(daemon, lowest, spoken) -> None:
    if spoken is None:
        with pytest.raises(DockerApiError, match=r"gpuledger needs 1\.25 or newer"):
            negotiate_version(daemon, lowest)
    else:
        assert negotiate_version(daemon, lowest) == spoken


def test_every_path_carries_the_negotiated_version(engine29: Daemon) -> None:
    client = DockerClient({"DOCKER_HOST": engine29.url})
    try:
        assert [c["Id"] for c in client.containers(all=True)] == [CID]  # refused if unversioned
        assert client.inspect(CID)["Name"] == "/trainer"  # type: ignore[index]
        assert client.api_version == (1, 52)
        asked = [p for p in engine29.paths if p not in ("/_ping", "/version")]
        assert asked and all(p.startswith("/v1.52/") for p in asked)
    finally:
        client.close()


def test_a_daemon_too_old_is_a_clear_error() -> None:
    daemon = Daemon(None, "1.12")  # no API-Version header: Engine 1.12 or older
    client = DockerClient({"DOCKER_HOST": daemon.url})
    try:
        with pytest.raises(DockerApiError, match=r"speaks API 1\.24 or older .*gpuledger needs 1\.25"):
            client.containers()
        src = DockerSource({"DOCKER_HOST": daemon.url}, max_backoff_s=0.2)
        try:
            wait_for(lambda: "gpuledger needs 1.25" in (src.status() or ""), what="the status to say why")
        finally:
            src.close()
    finally:
        client.close()
        daemon.close()


def test_a_proxy_refusing_ping_still_learns_the_version_from_version() -> None:
    daemon = Daemon("1.47", "1.24")
    original = daemon.answer

    def no_ping(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/_ping"):
            return Daemon._send(h, 403, b"<html>403 Forbidden</html>", "text/html")
        original(h)

    daemon.answer = no_ping  # type: ignore[method-assign]
    client = DockerClient({"DOCKER_HOST": daemon.url})
    try:
        assert client.negotiate() == (1, 47)
    finally:
        client.close()
        daemon.close()


def test_a_daemon_upgraded_under_a_running_client_is_renegotiated() -> None:
    daemon = Daemon("1.41", "1.12")
    client = DockerClient({"DOCKER_HOST": daemon.url})
    try:
        assert client.containers(all=True) and client.api_version == (1, 41)
        daemon.newest, daemon.lowest = "1.52", "1.44"  # now Engine 29: "client version 1.41 is too old"
        assert [c["Id"] for c in client.containers(all=True)] == [CID]
        assert client.api_version == (1, 52) and daemon.paths[-1] == "/v1.52/containers/json"
    finally:
        client.close()
        daemon.close()


# -- log framing -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ctype", "version", "tty", "kind"),
    [
        ("application/vnd.docker.multiplexed-stream", (1, 42), True, FrameDecoder),  # the header wins
        ("application/vnd.docker.raw-stream", (1, 52), False, RawDecoder),
        # Below 1.42 the daemon calls every log raw: the TTY flag decides.
        ("application/vnd.docker.raw-stream", (1, 41), False, FrameDecoder),
        ("application/vnd.docker.raw-stream", (1, 41), True, RawDecoder),
        (None, (1, 52), False, FrameDecoder),  # no header (a proxy dropped it): the TTY flag
        (None, (1, 52), True, RawDecoder),
    ],
)
def test_the_decoder_follows_the_content_type_where_it_is_true(ctype, version, tty, kind) -> None:
    assert type(decoder_for(ctype, version, tty)) is kind


@pytest.mark.parametrize(
    ("tty", "body", "ctype"),
    [
        (True, multiplexed(LINES), "application/vnd.docker.multiplexed-stream"),
        (False, b"".join(T.encode() + line for line in LINES), "application/vnd.docker.raw-stream"),
    ],
)
def test_a_followed_log_is_framed_as_the_daemon_says(tmp_path: Path, tty: bool, body: bytes, ctype: str) -> None:
    """The TTY flag read in the inspect disagrees with the stream (it is read in another request):
    the Content-Type the daemon sent with the stream is what frames it."""
    daemon = Daemon("1.52", "1.44", tty=tty)
    daemon.log_body, daemon.log_type = body, ctype
    src = DockerSource({"DOCKER_HOST": daemon.url}, log_dir=tmp_path, max_backoff_s=0.2)
    try:
        assert src.wait_synced(30), src.status()
        log = src.follow(CID)
        assert log is not None
        wait_for(lambda: log.view().done, what="the log read to the end")
        assert log.view().path.read_bytes() == b"".join(LINES)  # type: ignore[union-attr]
        assert log.view().lines == 2 and log.view().error is None
    finally:
        src.close()
        daemon.close()
