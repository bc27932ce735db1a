"""Slurm adapter, pure parts: what scontrol prints, what the prolog's files say, a job's labels.

The scontrol output is in Slurm's own format (tests/data/slurm/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.metering.owners import attribute
from gpuledger.node.claims import Claims, JobClaim, ProcFacts
from gpuledger.node.slurm_files import GpuHolder, gpu_uuid, read_job_facts, read_mapping
from gpuledger.node.slurm_parse import (
    SlurmFormatError,
    comment_labels,
    expand_hostlist,
    gpu_indices,
    gres_items,
    hostlist_has,
    index_list,
    parse_gres,
    parse_job,
    parse_listpids,
    parse_node,
)

DATA = Path(__file__).parent / "data" / "slurm"


def output(name: str) -> str:
    return (DATA / name).read_text()


# -- scontrol show job -d ------------------------------------------------------------------------------
def test_a_job_spanning_several_gpus_names_this_nodes_indices_only() -> None:
    job = parse_job(output("job-4242.out"), "gpu07")
    assert job.job_id == "4242" and job.state == "RUNNING"
    assert (job.user, job.uid, job.account, job.partition) == ("alice", 1001, "vision", "gpu")
    assert job.gpus_here == {0, 1, 3}
    assert parse_job(output("job-4242.out"), "gpu06").gpus_here == {0, 1, 2, 3}
    assert parse_job(output("job-4242.out"), "gpu99").gpus_here is None  # not on that node


def test_free_text_fields_keep_their_spaces_and_hide_no_key() -> None:
    job = parse_job(output("job-4242.out"), "gpu07")
    assert job.comment == "team=vision project=defect-detection model_version=yolov10s"
    assert comment_labels(job.comment) == {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}


def test_a_cpu_only_job_holds_no_gpu_here() -> None:
    job = parse_job(output("job-4250.out"), "gpu07")
    assert job.gpus_here == frozenset() and job.user == "bob" and job.account == "lidar"
    assert job.comment is None


def test_fields_no_slurm_prints_yet_are_ignored() -> None:
    job = parse_job(output("job-4260.out"), "gpu07")
    assert (job.job_id, job.user, job.account, job.partition) == ("4260", "carol", "nlp", "gpu")
    assert job.gpus_here == {2}
    assert comment_labels(job.comment) == {"team": "nlp"}


def test_the_node_name_matches_a_fully_qualified_one() -> None:
    text = "JobId=7 UserId=a(5)\n   Nodes=gpu07.cluster.example.org CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n"
    assert parse_job(text, "gpu07").gpus_here == {3}


def test_output_that_is_no_job_record_is_refused() -> None:
    with pytest.raises(SlurmFormatError):
        parse_job("slurm_load_jobs error: Unable to contact slurm controller\n", "gpu07")


@pytest.mark.parametrize(
    ("gres", "indices"),
    [
        ("gpu:a100:2(IDX:0-1)", {0, 1}),
        ("gpu:2(IDX:0,2)", {0, 2}),
        ("gpu(IDX:4-7)", {4, 5, 6, 7}),  # before Slurm 18.08 (GRES_IDX=)
        ("gpu:h100:1(IDX:0),gpu:6000pro_maxq:2(IDX:1-2)", {0, 1, 2}),
        ("gpu:a100:3(IDX:0-1,3),mps:0", {0, 1, 3}),
        ("shard:2(IDX:1)", {1}),  # before Slurm 23.11.2
        ("shard:2(1/4,1/4,0/4,0/4)", {0, 1}),  # per GPU: shares held / shares it has
        ("gpu:1(IDX:0),shard:8(-/5,5/5,3/5,0/5)", {0, 1, 2}),  # a node's GresUsed; "-": no count
        ("gpu:a100:1(IDX:3),mps:a100:50(0/100,50/100,0/100,-/100)", {1, 3}),
        ("shard:0(0/4,0/4)", set()),
        ("gpu:a100:0(IDX:N/A)", set()),
        ("", set()),
        ("(null)", set()),
        ("license:1", set()),
        ("gpu:2(CNT:2)", None),  # which two is not said
        ("gpu:a100:2", None),
    ],
)
def test_gres_forms(gres: str, indices: set[int] | None) -> None:
    assert gpu_indices(gres) == indices


def test_a_gres_item_keeps_its_type_and_count() -> None:
    item = gres_items("gpu:h100:1(IDX:0),gpu:6000pro_maxq:2(IDX:1-2)")[1]
    assert (item.name, item.type, item.count, item.indices) == ("gpu", "6000pro_maxq", 2, {1, 2})


@pytest.mark.parametrize("bad", ["gpu:1(IDX:a-b)", "gpu:1(IDX:3-1)", "gpu:1(IDX:0", "shard:2(1/4,x/4)", "shard:1(1/)"])
def test_a_malformed_gres_is_an_error_and_its_gpus_unknown_not_none(bad: str) -> None:
    with pytest.raises(SlurmFormatError):
        gres_items(bad)
    assert gpu_indices(bad) is None  # which GPUs it names is unknown: never "no GPU"
    value = parse_gres(bad)
    assert value.items == () and len(value.bad) == 1 and repr(bad) in value.bad[0]


@pytest.mark.parametrize(
    ("gres", "indices"),
    [
        ("gpu:1(IDX:2),shard:2(1/4,x/4)", {2}),
        ("shard:2(1/4,x/4),gpu:1(IDX:2)", {2}),
        ("gpu:1(IDX:3-1),gpu:1(IDX:2),shard:1(0/4,0/4,0/4,1/4)", {2, 3}),
        ("gpu:1(IDX:0),licence:2(what:ever:))", {0}),
    ],
)
def test_a_malformed_item_loses_only_itself(gres: str, indices: set[int]) -> None:
    value = parse_gres(gres)
    assert value.gpu_indices() == indices and len(value.bad) == 1


def test_a_shard_job_names_the_gpus_it_holds_shares_of() -> None:
    job = parse_job(output("job-4270.out"), "gpu09")
    assert (job.job_id, job.user, job.gpus_here, job.gres_problems) == ("4270", "carol", {0, 1}, ())


def test_a_jobs_malformed_shard_item_keeps_the_gpu_of_the_same_line() -> None:
    text = output("job-4270.out").replace("GRES=shard:2(1/4,1/4,0/4,0/4)", "GRES=gpu:1(IDX:2),shard:2(1/4,one/4)")
    job = parse_job(text, "gpu09")
    assert job.gpus_here == {2}
    assert len(job.gres_problems) == 1 and "shard:2(1/4,one/4)" in job.gres_problems[0]


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_index_lists_read_back_what_slurm_prints(indices: set[int]) -> None:
    # bit_fmt's shape: runs of consecutive indices as a-b, single ones alone, comma-separated
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    assert index_list(",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)) == indices


# -- host lists ---------------------------------------------------------------------------------------
def test_host_lists_expand_with_their_padding() -> None:
    assert list(expand_hostlist("gpu[01-03,07],login1")) == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert list(expand_hostlist("r[1-2]-n[1-2]")) == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    assert hostlist_has("gpu[06-07]", "gpu07") and not hostlist_has("gpu[06-07]", "gpu08")


@given(
    st.from_regex(r"[a-z]{1,6}", fullmatch=True),
    st.integers(min_value=0, max_value=500),
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=1, max_value=4),
)
def test_a_padded_range_names_each_host_once(prefix: str, first: int, length: int, width: int) -> None:
    last = first + length
    width = max(width, len(str(last)))
    expr = f"{prefix}[{first:0{width}d}-{last:0{width}d}]"
    names = list(expand_hostlist(expr))
    assert names == [f"{prefix}{n:0{width}d}" for n in range(first, last + 1)]


def test_a_host_list_too_long_to_be_a_job_is_refused() -> None:
    with pytest.raises(SlurmFormatError):
        list(expand_hostlist("n[0-9999999]"))


# -- scontrol show node -d ----------------------------------------------------------------------------
def test_a_node_names_the_gpus_in_use() -> None:
    node = parse_node(output("node-gpu07.out"))
    assert (node.name, node.gres, node.state) == ("gpu07", "gpu:a100:4(S:0-1)", "MIXED")
    assert node.gpus_in_use == {0, 1, 3}


def test_a_node_with_shards_names_every_gpu_in_use() -> None:
    node = parse_node(output("node-gpu09-shards.out"))
    assert (node.name, node.gpus_in_use, node.gres_problems) == ("gpu09", {0, 1, 3}, ())
    broken = output("node-gpu09-shards.out").replace("shard:a100:5(1/4,4/4,0/4,-/4)", "shard:a100:5(1/4,4/4,?)")
    node = parse_node(broken)
    assert node.gpus_in_use == {3} and len(node.gres_problems) == 1  # the whole GPU of the same line stays


def test_an_idle_node_has_no_gpu_in_use() -> None:
    assert parse_node(output("node-idle.out")).gpus_in_use == frozenset()


# -- scontrol listpids --------------------------------------------------------------------------------
def test_listpids_gives_each_step_its_processes() -> None:
    steps = parse_listpids(output("listpids.out"))
    assert steps.steps["4242"] == {"extern": {51230, 51244}, "batch": {51260, 51288}, "0": {51301, 51302}}
    assert steps.job_pids("4250") == {52007}
    assert steps.job_pids("9999") == frozenset()


def test_listpids_rows_with_more_columns_or_noise_are_read_for_what_they_say() -> None:
    text = (
        "scontrol: warning: something new\n"
        "PID      JOBID    STEPID   LOCALID GLOBALID NEWCOLUMN\n"
        "700      12       0+1      0       0        x\n"
        "-1       12       0        -       -\n"
        "701      12       ../x     -       -\n"
    )
    assert parse_listpids(text).steps == {"12": {"0+1": {700}}}


# -- the job's comment --------------------------------------------------------------------------------
def test_comment_labels_take_key_value_words_only() -> None:
    assert comment_labels("team=vision,project=defect-detection; urgent! =x y= run #3") == {
        "team": "vision",
        "project": "defect-detection",
    }
    assert comment_labels(None) == {} and comment_labels("") == {}


def test_a_jobs_labels_reach_its_processes_owner_below_a_containers() -> None:
    facts = ProcFacts(pid=10, start_ticks=1, ppid=1, pgid=10, sid=10, uid=1001,
                      cgroup=("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",))  # fmt: skip
    job = JobClaim("4242", user="alice", account="vision", labels={"team": "vision", "project": "p", "x": "y"})
    owner = attribute(facts, Claims(jobs={"4242": job}))
    assert owner.slurm_job == "4242" and owner.slurm_account == "vision"
    assert owner.labels == {"team": "vision", "project": "p"}  # the configured keys only


# -- the prolog's files -------------------------------------------------------------------------------
def test_jobstats_and_dcgm_mapping_files_are_both_read(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242 1001\n")  # jobstats: "<jobid> <uid>"
    (tmp_path / "1").write_text("4242\n4243\n")  # dcgm-exporter: a job id a line, two jobs sharing
    (tmp_path / "GPU-0b3a1c4e-5f06").write_text("4242 1001\n")
    (tmp_path / "MIG-5f2d8e21-aaaa").write_text("4270 1004\n")
    (tmp_path / "3.1").write_text("4271\n")
    (tmp_path / ".lock").write_text("")
    mapping = read_mapping(str(tmp_path))
    assert mapping.present and mapping.problems == ()
    assert mapping.holders["0"] == (GpuHolder("4242", 1001),)
    assert mapping.holders["1"] == (GpuHolder("4242"), GpuHolder("4243"))
    assert mapping.jobs()["4242"] == {"0", "1", "GPU-0b3a1c4e-5f06"}
    assert mapping.jobs()["4270"] == {"MIG-5f2d8e21-aaaa"}


def test_a_bad_mapping_file_is_a_problem_named_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("not-a-job\n4242 1001\n")
    (tmp_path / "gpu0").write_text("4242\n")
    (tmp_path / "2").write_text("")
    mapping = read_mapping(str(tmp_path))
    assert mapping.holders == {"0": (GpuHolder("4242", 1001),)}
    assert len(mapping.problems) == 2
    assert "not-a-job" in mapping.problems[0] and "gpu0" in mapping.problems[1]
    assert read_mapping(str(tmp_path / "absent")).present is False


def test_job_facts_files_say_who_the_job_is(tmp_path: Path) -> None:
    (tmp_path / "4242.job").write_text(
        "job=4242\nuid=1001\nuser=alice\naccount=vision\npartition=gpu\ngpus=0,1,3\ncomment=team=vision x\n"
    )
    (tmp_path / "4250.job").write_text("job=4250\nuid=1002\nuser=bob\naccount=lidar\npartition=cpu\ncomment=\n")
    (tmp_path / "4251.job").write_text("job=9\n")
    (tmp_path / "notes.txt").write_text("ignored")
    facts, problems = read_job_facts(str(tmp_path))
    assert facts["4242"].gpus == ("0", "1", "3") and facts["4242"].user == "alice" and facts["4242"].uid == 1001
    assert facts["4242"].comment == "team=vision x"
    assert facts["4250"].gpus is None and facts["4250"].comment is None  # no gpus line: not known
    assert "4251" not in facts and "names job '9'" in problems[0]


def test_gpu_names_resolve_to_nvml_uuids() -> None:
    by_index = {0: "GPU-aaaa", 3: "GPU-dddd"}
    assert gpu_uuid("3", by_index) == "GPU-dddd"
    assert gpu_uuid("GPU-zzzz", by_index) == "GPU-zzzz" and gpu_uuid("MIG-mmmm", by_index) == "MIG-mmmm"
    assert gpu_uuid("7", by_index) is None and gpu_uuid("3.1", by_index) is None
