"""``gpuledger_agent_source_up`` says what the start report says: 0 for an adapter that cannot see.

Before, an adapter that answered its poll counted as up even when its answer was "no Docker
socket": the start report said ``--  docker`` while /metrics said 1.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env
from gpuledger.node.claims import Claims
from gpuledger.node.sources import SourcePoller
from gpuledger.node.startup import Seen, report

pytestmark = pytest.mark.slow
UP = re.compile(r'^gpuledger_agent_source_up\{source="(\w+)"\} (\S+)$', re.M)


def scrape_until(url: str, want: str, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(url, timeout=10) as resp:
            found = {m.group(1): float(m.group(2)) for m in UP.finditer(resp.read().decode())}
        if want in found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_an_adapter_without_its_socket_reads_0_on_metrics_as_in_the_start_report(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"format": "gpuledger-gpu-trace", "gpus": []}\n')
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        [*GPULEDGER, "agent", "--replay-gpus", str(trace), "--no-slurm", "--kubelet-socket", "none",
         "--docker-socket", str(tmp_path / "no-docker.sock"), "--metrics-port", "0", "--interval", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"/metrics on (http://\S+/metrics)", log.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        text = log.read_text(errors="replace")
        assert "--  docker: " in text
        assert scrape_until(m.group(1), "docker") == {"docker": 0.0}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


class Adapter:
    """An adapter answering its poll: a status line, and its own word on whether it sees."""

    name = "docker"

    def __init__(self, status: str | None, blind: bool | None) -> None:
        self._status, self._blind = status, blind

    def claims(self, now: float) -> Claims:
        return Claims()

    def status(self) -> str | None:
        return self._status

    def blind(self) -> bool:
        return bool(self._blind)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("status", "blind", "sees", "line"), [
    ("docker: cannot see containers yet: connection refused", True, False, "--  docker: cannot see containers yet"),
    ("docker: log of trainer-7 unreadable: 403 Forbidden", False, True, "ok  docker (but: log of trainer-7"),
    (None, False, True, "ok  docker"),
])  # fmt: skip
def test_the_report_and_source_up_agree(status: str | None, blind: bool, sees: bool, line: str) -> None:
    poller = SourcePoller("docker", lambda: Adapter(status, blind))  # type: ignore[arg-type,return-value]
    poller.poll_once()
    state = poller.state()
    assert state.up and state.sees is sees
    seen = Seen(gpus=[], gpu_note="none", host_pids=True, environ_others=True, uid=0, cgroup_root="/sys/fs/cgroup",
                cgroup_version=None, sources=[state], disabled=[], ledger="x", server=None, metrics=None)  # fmt: skip
    assert any(ln.startswith(line) for ln in report(seen))
