"""docs/AGENT.md and the systemd unit are checked against the code, so they cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

from gpuledger.cli.agent_cmd import agent_cmd
from gpuledger.core.model import GpuIdentity, GpuTick
from gpuledger.node.metrics import NodeMetrics, OwnerLabels

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "AGENT.md").read_text()
UNIT = (ROOT / "deploy" / "systemd" / "gpuledger-agent.service").read_text()


def test_every_option_is_documented() -> None:
    table = DOC[DOC.index("## Options") : DOC.index("### The start report")]
    for param in agent_cmd.params:
        for opt in param.opts + param.secondary_opts:
            assert f"`{opt}" in table, f"{opt} is not in docs/AGENT.md's options table"


def test_every_metric_the_agent_exposes_is_documented() -> None:
    metrics = NodeMetrics("node-1", dcgm_names=True)
    ident = GpuIdentity(0, "GPU-a", "NVIDIA A100-SXM4-80GB", memory_total_b=80 * 2**30)
    tick = GpuTick("GPU-a", 0.0, 2.0, busy_s=1.0, energy_j=600.0, power_w=300.0, mem_used_b=2**30, temp_c=50.0,
                   energy_total_mj=9_000_000)  # fmt: skip
    owner = OwnerLabels(run_id="r1", team="vision")
    metrics.observe(ident, tick, [(owner, 2**30)])
    metrics.unallocated_use("GPU-a", owner)
    metrics.set_sources({"docker": True}, 1)
    exposed = {s.name for family in metrics.collect() for s in family.samples}
    documented = set(re.findall(r"`((?:gpuledger|DCGM)_[A-Za-z0-9_]+)`", DOC))
    assert exposed <= documented, exposed - documented
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"} <= exposed  # fmt: skip


def test_the_unit_grants_exactly_the_documented_capabilities_and_hides_nothing_the_agent_reads() -> None:
    settings = dict(line.split("=", 1) for line in UNIT.splitlines() if re.match(r"^[A-Z][A-Za-z]+=", line))
    caps = "CAP_DAC_READ_SEARCH CAP_SYS_PTRACE"
    assert settings["AmbientCapabilities"] == caps and settings["CapabilityBoundingSet"] == caps
    assert "`CAP_DAC_READ_SEARCH` and `CAP_SYS_PTRACE`" in DOC
    assert settings["User"] == "gpuledger" and settings["NoNewPrivileges"] == "yes"
    assert settings["KillSignal"] == "SIGTERM"  # closes the intervals; the runs are resumed
    for hiding in ("ProtectProc", "ProcSubset", "PrivateDevices", "PrivatePIDs", "PrivateUsers"):
        assert hiding not in settings, f"{hiding}= would hide what the agent reads"
    assert settings["ExecStart"].split()[1] == "agent"


def test_the_agent_page_is_linked() -> None:
    assert "docs/AGENT.md" in (ROOT / "README.md").read_text()
    assert "docs/AGENT.md" in (ROOT / "docs" / "ARCHITECTURE.md").read_text()
