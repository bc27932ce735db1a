"""A private Docker engine for the Docker adapter's tests, and a read-only socket proxy.

``private_engine()`` (the body of a session fixture) starts its own ``dockerd`` on a private socket, data and exec
root (no iptables, no bridge, the vfs storage driver: it runs in a plain VM or container as root),
builds a local busybox image with no registry, and at the end removes every container it ran and
stops the daemon by the pid it started. The ``docker`` CLI drives it (creating containers is not
the adapter's business; the adapter only reads).

Without ``dockerd`` (or root) the tests skip — unless ``GPULEDGER_REQUIRE_DOCKER=1`` or ``CI`` is
set (.ci/run sets it and installs docker.io and busybox-static): then a missing engine fails.

``GetOnlyProxy`` stands in for a read-only socket proxy such as Tecnativa's docker-socket-proxy
with ``POST=0``: plain HTTP on a TCP port, ``403 Forbidden`` for any method but GET/HEAD and for
paths outside the allowed prefixes (its HAProxy rules match ``^(/v[\\d.]+)?/<section>``), one
request per connection.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

IMAGE = "local/busybox:test"
YOLO_DATA = Path(__file__).parent / "data" / "yolo"
_APPLETS = ("sh", "sleep", "echo", "cat", "printf", "head", "true", "false", "seq")


def require_docker() -> bool:
    return os.environ.get("GPULEDGER_REQUIRE_DOCKER") == "1" or bool(os.environ.get("CI"))


def _missing(why: str) -> None:
    if require_docker():
        pytest.fail(f"a Docker engine is required here (GPULEDGER_REQUIRE_DOCKER/CI) but {why}")
    pytest.skip(f"no Docker engine for these tests: {why} (apt-get install docker.io busybox-static, as root)")


def wait_for(predicate, timeout_s: float = 30.0, step_s: float = 0.05, what: str = "condition"):
    """Poll until ``predicate()`` is truthy; its value, or a failure naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(step_s)


def long_progress(data: bytes, redraws: int = 300) -> bytes:
    """A captured training log whose progress lines are redrawn many more times, as a long epoch's
    are: every line holding ``\\r`` gets its first redraw repeated, so it passes the log driver's
    16 KiB message size; what a terminal finally shows is unchanged."""
    out = []
    for line in data.split(b"\n"):
        if b"\r" in line:
            first = line.split(b"\r")[0] or line.split(b"\r")[1]
            line = (first + b"\r") * redraws + line
        out.append(line)
    return b"\n".join(out)


class Engine:
    """One private dockerd; ``docker()`` runs the CLI against it."""

    def __init__(self, root: Path, dockerd: str, cli: str) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.env = {"DOCKER_HOST": f"unix://{self.sock}"}
        self._dockerd, self._cli = dockerd, cli
        self.proc: subprocess.Popen[bytes] | None = None
        self.containers: set[str] = set()

    # -- the daemon ------------------------------------------------------------------------------
    def start(self) -> None:
        args = [
            self._dockerd,
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            "--storage-driver=vfs",
            "--shutdown-timeout=2",  # containers get SIGKILL 2 s after SIGTERM when the daemon stops
            f"--host=unix://{self.sock}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
        ]
        runc = shutil.which("runc")
        if runc:  # a runtime named "nvidia" (plain runc here): HostConfig.Runtime as a GPU node has it
            args.append(f"--add-runtime=nvidia={runc}")
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - lives as long as the daemon
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-2000:]
                self.proc = None
                _missing(f"dockerd did not start:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the daemon we started (by its pid), as `systemctl restart docker` would."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    # -- the CLI -----------------------------------------------------------------------------------
    def docker(self, *args: str, check: bool = True, input: bytes | None = None, text: bool = True):
        """The CLI's result: str output, or bytes with ``text=False`` or an ``input``."""
        env = {**os.environ, **self.env, "DOCKER_CLI_HINTS": "false"}
        text = text and input is None
        done = subprocess.run([self._cli, *args], env=env, input=input, capture_output=True, timeout=120, text=text)
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {done.stderr}")
        return done

    def run(self, *args: str) -> str:
        """``docker run -d --network none ARGS``: the container's id (removed at the end)."""
        cid = self.docker("run", "-d", "--network", "none", *args).stdout.strip()
        self.containers.add(cid)
        return cid

    def inspect(self, cid: str, fmt: str) -> str:
        return self.docker("inspect", "-f", fmt, cid).stdout.strip()

    def remove_all(self) -> None:
        ids = self.docker("ps", "-aq", "--no-trunc", check=False).stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, check=False)
        self.containers.clear()

    def build_image(self) -> None:
        busybox = shutil.which("busybox")
        if busybox is None:
            _missing("busybox is not installed (apt-get install busybox-static)")
        tree = Path(tempfile.mkdtemp(prefix="gl-img-", dir=self.root))
        (tree / "bin").mkdir()
        shutil.copy2(busybox, tree / "bin" / "busybox")
        for applet in _APPLETS:
            (tree / "bin" / applet).symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(tree), "-c", "."], capture_output=True, check=True).stdout
        self.docker("import", "-", IMAGE, input=tar)


def private_engine() -> Iterator[Engine]:
    """Body of a session fixture: the engine, running, then stopped and removed with its data."""
    dockerd, cli = shutil.which("dockerd"), shutil.which("docker")
    if dockerd is None or cli is None:
        _missing("dockerd/docker are not installed")
    if os.geteuid() != 0:
        _missing("dockerd needs root here")
    root = Path(tempfile.mkdtemp(prefix="gl-dockerd-"))  # short: unix socket paths are limited to 108 bytes
    engine = Engine(root, dockerd, cli)  # type: ignore[arg-type]
    try:
        engine.start()
        engine.build_image()
        yield engine
    finally:
        with contextlib.suppress(Exception):
            engine.remove_all()
        engine.stop()
        subprocess.run(["umount", "-R", str(root / "exec")], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def engine_for_test(engine: Engine) -> Iterator[Engine]:
    """Body of a per-test fixture: the session's engine running, this test's containers removed after."""
    if engine.proc is None:
        engine.start()
    yield engine
    if engine.proc is None:
        engine.start()
    engine.remove_all()


class GetOnlyProxy:
    """A read-only Docker socket proxy on 127.0.0.1: GET/HEAD to allowed sections, else 403."""

    _REQUEST = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.[01]\r\n")

    # docker-socket-proxy allows /_ping and /version by default (PING=1, VERSION=1): the adapter
    # negotiates its API version there.
    def __init__(self, sock_path: Path, sections: tuple[str, ...] = ("_ping", "version", "containers", "events")):
        self._sock_path = str(sock_path)
        self._allowed = re.compile(r"^(/v[\d.]+)?/(" + "|".join(re.escape(s) for s in sections) + r")\b")
        self.deny_logs = False
        # Set: a followed log's response ends cleanly after this many body bytes, as a daemon
        # that closes a follow before it has sent a stopping container's last lines.
        self.cut_follow_b: int | None = None
        self.inspect_gate = threading.Event()  # cleared: inspect requests wait (a slow daemon or agent)
        self.inspect_gate.set()
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            m = self._REQUEST.match(head)
            if m is None:
                return
            method, target = m.group(1).decode(), m.group(2).decode()
            path = target.split("?", 1)[0]
            ok = method in ("GET", "HEAD") and self._allowed.match(path) is not None
            if ok and self.deny_logs and re.search(r"/containers/[^/]+/logs$", path):
                ok = False
            if ok and re.search(r"/containers/[^/]+/json$", path):
                self.inspect_gate.wait(60)
            self.seen.append((method, path, 200 if ok else 403))
            if not ok:
                body = b"<html><body><h1>403 Forbidden</h1>\nRequest forbidden by administrative rules.\n</body></html>"
                client.sendall(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/html\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + body
                )
                return
            # One request per connection, as HAProxy's "http-server-close" makes it to the daemon.
            head = re.sub(rb"(?im)^connection:[^\r\n]*\r\n", b"", head)
            head = head.replace(b"\r\n", b"\r\nConnection: close\r\n", 1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                upstream.connect(self._sock_path)
                upstream.sendall(head)
                if self.cut_follow_b is not None and re.search(r"/logs$", path) and "follow=1" in target:
                    self._cut_follow(upstream, client, self.cut_follow_b)
                    return
                while True:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    try:
                        client.sendall(data)
                    except OSError:
                        return

    @staticmethod
    def _cut_follow(upstream: socket.socket, client: socket.socket, limit: int) -> None:
        """Relay the daemon's answer, then end its chunked body cleanly after ``limit`` bytes."""
        response = http.client.HTTPResponse(upstream)
        response.begin()
        head = f"HTTP/1.1 {response.status} {response.reason}\r\n"
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                head += f"{name}: {value}\r\n"
        client.sendall((head + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode())
        sent = 0
        with contextlib.suppress(OSError):
            while sent < limit and (data := response.read1(limit - sent)):
                client.sendall(b"%x\r\n%s\r\n" % (len(data), data))
                sent += len(data)
            client.sendall(b"0\r\n\r\n")
