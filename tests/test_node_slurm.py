"""The Slurm adapter against a fake ``scontrol`` on PATH (tests/slurm_support.py) and real files.

Rounds are driven by hand with a clock the test moves (``SlurmSource.refresh``), so cadence and
back-off are checked by what was called, never by how long anything took; the adapter's own
thread is exercised where that is the point (a hung scontrol, ``open_source``).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuledger.core.metering.owners import attribute
from gpuledger.node.claims import Allocation, SourceOptions
from gpuledger.node.procfacts import ProcReader
from gpuledger.node.slurm import (
    BACKOFF_FIRST_S,
    JOB_TTL_S,
    LISTPIDS_EVERY_S,
    MAX_JOB_QUERIES,
    SlurmSource,
    open_source,
)
from gpuledger.node.sources import load_sources
from slurm_support import DATA, FakeSlurm, listpids

UUIDS = {0: "GPU-00000000-a100", 1: "GPU-11111111-a100", 2: "GPU-22222222-a100", 3: "GPU-33333333-a100"}
PROLOG = Path(__file__).parent.parent / "deploy" / "slurm" / "gpuledger-prolog.sh"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def slurm(tmp_path: Path) -> FakeSlurm:
    return FakeSlurm(tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def source(slurm: FakeSlurm, tmp_path: Path, clock: Clock, **kw: object) -> SlurmSource:
    options: dict[str, object] = dict(
        gpu_uuids=UUIDS,
        node="gpu07",
        gpustat_dir=str(tmp_path / "gpustat"),
        job_dir=str(tmp_path / "jobs"),
        call_timeout_s=10.0,
        clock=clock,
    )
    options.update(kw)
    env = options.pop("env", slurm.env())
    return SlurmSource(env, **options)  # type: ignore[arg-type]


def busy_node(slurm: FakeSlurm) -> None:
    """gpu07 running 4242 (GPUs 0, 1, 3) and 4250 (no GPU), as in tests/data/slurm."""
    slurm.answer("listpids.out", data="listpids.out")
    slurm.answer("job-4242.out", data="job-4242.out")
    slurm.answer("job-4250.out", data="job-4250.out")
    slurm.answer("node-gpu07.out", data="node-gpu07.out")


def run_prolog(tmp_path: Path, **env: str) -> None:
    base = {"GPULEDGER_GPUSTAT_DIR": str(tmp_path / "gpustat"), "GPULEDGER_SLURM_JOB_DIR": str(tmp_path / "jobs")}
    done = subprocess.run(["bash", str(PROLOG)], env={**base, **env}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# -- from scontrol alone --------------------------------------------------------------------------------
def test_jobs_gpus_and_processes_from_scontrol(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    src = source(slurm, tmp_path, clock)
    src.refresh()
    claims = src.claims(0.0)
    job = claims.jobs["4242"]
    assert (job.user, job.account, job.partition, job.step) == ("alice", "vision", "gpu", None)
    assert job.gpus == ("0", "1", "3")
    assert job.pids == {51230, 51244, 51260, 51288, 51301, 51302}
    assert job.labels == {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}
    assert claims.jobs["4242.0"].pids == {51301, 51302} and claims.jobs["4242.0"].step == "0"
    assert claims.jobs["4242.0"].account == "vision"
    assert claims.jobs["4242.batch"].pids == {51260, 51288}
    assert claims.jobs["4242.extern"].pids == {51230, 51244}
    assert claims.jobs["4250"].gpus == () and claims.jobs["4250"].pids == {52007}
    assert claims.allocations == [Allocation(UUIDS[i], "job", "4242") for i in (0, 1, 3)]
    assert src.status() is None  # GresUsed's 0-1,3 are all explained
    assert slurm.calls() == ["listpids", "show job -d 4242", "show job -d 4250", "show node -d gpu07"]


def test_a_node_with_no_gpu_in_use_claims_nothing(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    slurm.answer("node-gpu07.out", data="node-idle.out")  # and no listpids.out: no step on the node
    src = source(slurm, tmp_path, clock)
    src.refresh()
    assert src.claims(0.0).jobs == {} and src.claims(0.0).allocations == []
    assert src.status() is None
    assert slurm.calls() == ["listpids", "show node -d gpu07"]


def test_unexpected_fields_are_ignored(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    slurm.answer("listpids.out", listpids([(61000, "4260", "batch")]))
    slurm.answer("job-4260.out", data="job-4260.out")
    src = source(slurm, tmp_path, clock)
    src.refresh()
    job = src.claims(0.0).jobs["4260"]
    assert (job.user, job.account, job.gpus, job.labels) == ("carol", "nlp", ("2",), {"team": "nlp"})
    assert src.claims(0.0).allocations == [Allocation(UUIDS[2], "job", "4260")]


def shard_node(slurm: FakeSlurm, job_gres: str | None = None) -> None:
    """gpu07 as tests/data/slurm's gpu09: job 4270 holds shares of GPUs 0 and 1 (Slurm 23.11.2+ form)."""
    job = (DATA / "job-4270.out").read_text().replace("gpu09", "gpu07")
    if job_gres is not None:
        job = job.replace("GRES=shard:2(1/4,1/4,0/4,0/4)", f"GRES={job_gres}")
    slurm.answer("listpids.out", listpids([(61500, "4270", "batch")]))
    slurm.answer("job-4270.out", job)
    slurm.answer("node-gpu07.out", (DATA / "node-gpu09-shards.out").read_text().replace("gpu09", "gpu07"))


def test_a_shard_job_claims_the_gpus_it_holds_shares_of(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    shard_node(slurm)
    src = source(slurm, tmp_path, clock)
    src.refresh()
    assert src.claims(0.0).jobs["4270"].gpus == ("0", "1")
    assert src.claims(0.0).allocations == [Allocation(UUIDS[i], "job", "4270") for i in (0, 1)]
    # GresUsed names GPUs 0, 1 (shares) and 3 (whole): only 3 is not explained by a job seen here
    assert "GPU indices 3 are allocated by Slurm to jobs not seen here" in (src.status() or "")


def test_a_malformed_shard_item_loses_only_itself_and_is_said(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    shard_node(slurm, job_gres="gpu:1(IDX:2),shard:2(1/4,one/4)")
    src = source(slurm, tmp_path, clock)
    src.refresh()
    assert src.claims(0.0).jobs["4270"].gpus == ("2",)  # the whole GPU of the same line stays
    status = src.status() or ""
    assert "job 4270's GRES not read in part: 'shard:2(1/4,one/4)'" in status
    assert "printed what it should not" not in status  # slurmctld is not backed off for it


def test_gpus_slurm_gave_to_jobs_not_seen_here_are_said(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    slurm.answer("listpids.out", listpids([(52007, "4250", "0")]))  # 4242's steps are not listed
    slurm.answer("job-4250.out", data="job-4250.out")
    slurm.answer("node-gpu07.out", data="node-gpu07.out")
    src = source(slurm, tmp_path, clock)
    src.refresh()
    status = src.status() or ""
    assert "GPU indices 0,1,3 are allocated by Slurm to jobs not seen here" in status


def test_a_node_name_slurm_does_not_know_is_said(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    src = source(slurm, tmp_path, clock, node="gpu99")
    src.refresh()
    assert "node gpu99 (from GPULEDGER_SLURM_NODE) unknown to Slurm" in (src.status() or "")


def test_a_gpu_index_the_node_does_not_have_is_said(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    src = source(slurm, tmp_path, clock, gpu_uuids={0: UUIDS[0], 1: UUIDS[1]})  # NVML sees two GPUs
    src.refresh()
    assert src.claims(0.0).allocations == [Allocation(UUIDS[0], "job", "4242"), Allocation(UUIDS[1], "job", "4242")]
    assert "GPU ids 3 of job 4242 not resolved to UUIDs" in (src.status() or "")


def test_a_job_that_ended_is_no_longer_claimed(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    src = source(slurm, tmp_path, clock)
    src.refresh()
    slurm.answer("listpids.out", listpids([(52007, "4250", "0")]))
    slurm.answer("node-gpu07.out", data="node-idle.out")
    clock.t += LISTPIDS_EVERY_S
    src.refresh()
    assert set(src.claims(0.0).jobs) == {"4250", "4250.0"}
    assert src.claims(0.0).allocations == []


# -- the prolog's files first ---------------------------------------------------------------------------
def test_the_prologs_files_take_precedence_and_cost_no_rpc(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)  # scontrol would say GPUs 0,1,3 for 4242; the prolog was told 0 and 2
    run_prolog(tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", SLURM_JOB_USER="alice",
               SLURM_JOB_ACCOUNT="vision", SLURM_JOB_PARTITION="gpu", CUDA_VISIBLE_DEVICES="0,2",
               SLURM_JOB_COMMENT="team=vision,project=defect-detection")  # fmt: skip
    run_prolog(tmp_path, SLURM_JOB_ID="4250", SLURM_JOB_UID="1002", SLURM_JOB_USER="bob",
               SLURM_JOB_ACCOUNT="lidar", SLURM_JOB_PARTITION="cpu")  # fmt: skip
    src = source(slurm, tmp_path, clock)
    src.refresh()
    claims = src.claims(0.0)
    job = claims.jobs["4242"]
    assert (job.user, job.account, job.partition, job.gpus) == ("alice", "vision", "gpu", ("0", "2"))
    assert job.labels == {"team": "vision", "project": "defect-detection"}
    assert job.pids == {51230, 51244, 51260, 51288, 51301, 51302}  # still confirmed by listpids
    assert claims.allocations == [Allocation(UUIDS[0], "job", "4242"), Allocation(UUIDS[2], "job", "4242")]
    # 4250's prolog had no GPU variable: its GPUs are asked of slurmctld (none), nothing else is
    assert claims.jobs["4250"].gpus == () and claims.jobs["4250"].account == "lidar"
    assert slurm.calls() == ["listpids", "show job -d 4250"]
    assert src.status() is None


def test_files_written_by_jobstats_own_helper_allocate_the_gpus(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)  # scontrol would say GPUs 0, 1 and 3 for 4242
    gpustat = tmp_path / "gpustat"
    gpustat.mkdir()
    (gpustat / "2").write_text("4242 1001\n")  # jobstats writes the index's file and the UUID's
    (gpustat / UUIDS[2]).write_text("4242 1001\n")
    src = source(slurm, tmp_path, clock)
    src.refresh()
    job = src.claims(0.0).jobs["4242"]
    assert job.gpus == ("2", UUIDS[2]) and job.account == "vision"  # who it is: from slurmctld, once
    assert src.claims(0.0).allocations == [Allocation(UUIDS[2], "job", "4242")]
    assert "show job -d 4242" in slurm.calls() and not any(c.startswith("show node") for c in slurm.calls())


def test_without_scontrol_the_files_still_claim_jobs(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    run_prolog(tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", SLURM_JOB_USER="alice",
               SLURM_JOB_ACCOUNT="vision", CUDA_VISIBLE_DEVICES="1")  # fmt: skip
    src = source(slurm, tmp_path, clock, env={"PATH": "/usr/bin:/bin"})
    src.refresh()
    job = src.claims(0.0).jobs["4242"]
    assert job.gpus == ("1",) and job.user == "alice" and job.pids is None  # processes unconfirmed
    assert src.claims(0.0).allocations == [Allocation(UUIDS[1], "job", "4242")]
    assert src.status() == (
        "slurm: scontrol not found on PATH: jobs from the prolog's files only, their processes unconfirmed"
    )


def test_a_jobstats_line_names_the_jobs_user_by_uid(tmp_path: Path, clock: Clock) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "0").write_text(f"4242\n4243 {os.getuid()}\n")
    src = SlurmSource({"PATH": "/usr/bin:/bin"}, gpu_uuids=UUIDS, gpustat_dir=str(tmp_path / "g"),
                      job_dir=str(tmp_path / "j"), clock=clock)  # fmt: skip
    src.refresh()
    assert src.claims(0.0).jobs["4243"].user == pwd.getpwuid(os.getuid()).pw_name
    assert src.claims(0.0).jobs["4242"].user is None  # a dcgm-exporter line names no one
    assert [a.owner for a in src.claims(0.0).allocations] == ["4242", "4243"]  # sharing GPU 0


def test_without_scontrol_or_files_nothing_is_seen_and_it_says_so(tmp_path: Path, clock: Clock) -> None:
    src = SlurmSource({"PATH": "/usr/bin:/bin"}, gpustat_dir=str(tmp_path / "g"), job_dir=str(tmp_path / "j"),
                      clock=clock)  # fmt: skip
    src.refresh()
    assert src.claims(0.0).jobs == {}
    said = f"slurm: scontrol not found on PATH and no prolog files in {tmp_path / 'g'}: no Slurm job is seen"
    assert src.status() == said


def test_mig_slices_are_claimed_by_uuid_from_the_files_only(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    src = source(slurm, tmp_path, clock, mig=True)
    src.refresh()
    assert src.claims(0.0).jobs["4242"].gpus is None  # GRES indices name no NVML GPU on a MIG node
    assert src.claims(0.0).allocations == []
    assert "job 4242's GPUs are known by GRES index only" in (src.status() or "")
    run_prolog(tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa")
    src.refresh()
    assert src.claims(0.0).allocations == [Allocation("MIG-5f2d8e21-aaaa", "job", "4242")]


# -- cadence, failures, hangs ---------------------------------------------------------------------------
def test_scontrol_is_asked_on_its_cadence_not_every_tick(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    src = source(slurm, tmp_path, clock)
    src.refresh()
    asked = len(slurm.calls())
    clock.t += 2.0
    src.refresh()
    assert len(slurm.calls()) == asked  # nothing due: the files were read, Slurm was not asked
    clock.t += LISTPIDS_EVERY_S
    src.refresh()
    assert slurm.calls()[asked:] == ["listpids"]  # job details are cached for the job's life
    clock.t += JOB_TTL_S
    src.refresh()
    assert slurm.calls()[asked + 1 :] == ["listpids", "show job -d 4242", "show job -d 4250", "show node -d gpu07"]


def test_a_new_job_in_the_files_is_listed_at_once(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    src = source(slurm, tmp_path, clock)
    src.refresh()
    slurm.answer("listpids.out", data="listpids.out")
    run_prolog(tmp_path, SLURM_JOB_ID="4300", SLURM_JOB_UID="1001", SLURM_JOB_ACCOUNT="vision",
               SLURM_JOB_USER="alice", CUDA_VISIBLE_DEVICES="2")  # fmt: skip
    clock.t += 2.0
    src.refresh()
    assert slurm.calls()[-1] == "listpids"  # before the 10 s cadence: a new job was written
    assert src.claims(0.0).jobs["4300"].pids == frozenset()  # listed, and none of its processes yet
    clock.t += 2.0
    src.refresh()
    assert slurm.calls()[-1] == "listpids" and len(slurm.calls()) == 5  # not again for the same job


def test_a_failing_slurmctld_backs_off_and_says_so(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    slurm.answer("job.fail", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    src = source(slurm, tmp_path, clock)
    src.refresh()
    assert slurm.calls() == ["listpids", "show job -d 4242"]  # the first failure stops the round's RPCs
    status = src.status() or ""
    assert "`scontrol show job -d 4242` exit 1: slurm_load_jobs error: Unable to contact slurm controller" in status
    assert f"asking slurmctld again in {BACKOFF_FIRST_S:.0f} s" in status
    assert src.claims(0.0).jobs["4242"].pids == {51230, 51244, 51260, 51288, 51301, 51302}  # listpids is local
    clock.t += LISTPIDS_EVERY_S
    src.refresh()
    assert slurm.calls()[2:] == ["listpids"]  # backing off: slurmctld is left alone
    slurm.forget("job.fail")
    clock.t += BACKOFF_FIRST_S
    src.refresh()
    assert "show job -d 4242" in slurm.calls()[3:] and src.status() is None
    assert src.claims(0.0).jobs["4242"].account == "vision"


def test_a_node_full_of_new_jobs_asks_slurmctld_a_few_at_a_time(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    slurm.answer("listpids.out", listpids([(70000 + n, str(5000 + n), "batch") for n in range(MAX_JOB_QUERIES + 3)]))
    src = source(slurm, tmp_path, clock)
    src.refresh()
    asked = [c for c in slurm.calls() if c.startswith("show job")]
    assert asked == [f"show job -d {5000 + n}" for n in range(MAX_JOB_QUERIES)]
    clock.t += 2.0
    src.refresh()
    asked = [c for c in slurm.calls() if c.startswith("show job")]
    assert asked[MAX_JOB_QUERIES:] == [f"show job -d {5000 + n}" for n in range(MAX_JOB_QUERIES, MAX_JOB_QUERIES + 3)]


def test_a_hung_scontrol_is_killed_at_its_time_limit(slurm: FakeSlurm, tmp_path: Path, clock: Clock) -> None:
    busy_node(slurm)
    run_prolog(tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", SLURM_JOB_USER="alice",
               SLURM_JOB_ACCOUNT="vision", CUDA_VISIBLE_DEVICES="0")  # fmt: skip
    slurm.answer("listpids.sleep", "600")
    src = source(slurm, tmp_path, clock, call_timeout_s=0.5)
    src.refresh()  # returns: the call was cut off
    assert "`scontrol listpids` timed out after 0.5 s; job processes unconfirmed" in (src.status() or "")
    hung = slurm.pids()[0]
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)  # killed and reaped, not left behind
    job = src.claims(0.0).jobs["4242"]  # what the files say stands; its processes are unconfirmed
    assert job.pids is None and job.account == "vision" and job.gpus == ("0",)


def test_claims_are_answered_while_scontrol_hangs(slurm: FakeSlurm, tmp_path: Path) -> None:
    run_prolog(tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", SLURM_JOB_USER="alice",
               SLURM_JOB_ACCOUNT="vision", CUDA_VISIBLE_DEVICES="3")  # fmt: skip
    slurm.answer("all.sleep", "600")
    src = source(slurm, tmp_path, Clock(), call_timeout_s=60.0)
    src.start()
    try:
        deadline = time.monotonic() + 30
        while not slurm.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slurm.pids(), "the adapter never called scontrol"
        # scontrol is hanging in the adapter's thread; the agent's side reads the files' claims
        assert src.claims(0.0).allocations == [Allocation(UUIDS[3], "job", "4242")]
    finally:
        slurm.forget("all.sleep")
        for pid in slurm.pids():
            os.kill(pid, 9)
        src.close()


# -- attribution ----------------------------------------------------------------------------------------
def test_a_process_whose_cgroup_hides_its_job_is_attributed_by_listpids(
    slurm: FakeSlurm, tmp_path: Path, clock: Clock
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        slurm.answer("listpids.out", listpids([(child.pid, "4242", "0")]))
        slurm.answer("job-4242.out", data="job-4242.out")
        src = source(slurm, tmp_path, clock)
        src.refresh()
        facts = ProcReader("/proc").facts(child.pid)
        assert facts is not None and not any("job_4242" in line for line in facts.cgroup)
        owner = attribute(facts, src.claims(0.0))
        assert (owner.slurm_job, owner.slurm_step, owner.slurm_from) == ("4242", "0", "claim")
        assert (owner.slurm_user, owner.slurm_account) == ("alice", "vision")
        assert owner.key == "slurm:4242.0"
        assert owner.labels == {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}
    finally:
        child.kill()
        child.wait()


# -- how the agent opens it -----------------------------------------------------------------------------
def test_open_source_takes_the_agents_gpus_and_environment(slurm: FakeSlurm, tmp_path: Path) -> None:
    busy_node(slurm)
    slurm.answer("aliases.out", "gpu07\n")
    env = slurm.env(GPULEDGER_GPUSTAT_DIR=str(tmp_path / "none"), GPULEDGER_SLURM_JOB_DIR=str(tmp_path / "none2"))
    options = SourceOptions(gpus=((0, UUIDS[0]), (1, UUIDS[1]), (3, UUIDS[3]), (3, "MIG-5f2d8e21-bbbb")))
    src = open_source(options, env)
    try:
        assert src.name == "slurm"
        assert slurm.calls()[0] == "show aliases"  # the node's NodeName, from slurm.conf
        assert "show node -d gpu07" in slurm.calls()
        assert src.claims(0.0).jobs["4242"].gpus is None  # a MIG node: GRES indices are not used
    finally:
        src.close()


def test_the_agent_loads_the_slurm_adapter(slurm: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    busy_node(slurm)
    for key, value in slurm.env(GPULEDGER_SLURM_NODE="gpu07", GPULEDGER_GPUSTAT_DIR=str(tmp_path / "g"),
                                GPULEDGER_SLURM_JOB_DIR=str(tmp_path / "j")).items():  # fmt: skip
        monkeypatch.setenv(key, value)
    sources = load_sources(["slurm"], SourceOptions(gpus=tuple(UUIDS.items())), period_s=60.0)
    assert sources.missing == {}
    poller = sources.pollers[0]
    poller.poll_once()
    try:
        claims, _ = poller.snapshot()
        assert [a.gpu for a in claims.allocations] == [UUIDS[0], UUIDS[1], UUIDS[3]]
        assert poller.state().status is None
    finally:
        poller._source.close()  # type: ignore[union-attr]
