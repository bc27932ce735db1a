"""The run report says one thing about how busy a GPU was.

Its finding said the GPUs were busy 37 % and 36 % while its own table said 35 % and 33 %: the
finding divided busy time by the recorded intervals, the table (and `show`, the summary) by the
time the run held the GPU. A real run holds its GPUs before the first sample (start-up) and after
the last; here 40 s and 30 s of a 10-minute run, so the two ways differ by a few points.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from diag_support import T0, device, gpu_intervals, host_intervals
from gpuledger.cli.main import cli
from gpuledger.core.model import RunRecord
from gpuledger.store import Ledger

RUN = "0190abcd-0000-7000-8000-00000000e0e0"


def _model(tmp_path: Path) -> dict:
    db = f"sqlite:///{tmp_path}/ledger.db"
    n, step, lead, tail = 106, 5.0, 40.0, 30.0
    with Ledger(db) as ledger:
        ledger.create_run(
            RunRecord(id=RUN, command=["python", "train.py"], user="ana", host="h", cwd="/w", started_at=T0,
                      status="succeeded", ended_at=T0 + lead + n * step + tail, exit_code=0)
        )  # fmt: skip
        devs = [device(0), device(1)]
        ledger.add_devices(RUN, devs)
        gpu = []
        for d, util in zip(devs, (0.40, 0.38), strict=True):
            gpu += gpu_intervals(d.uuid, n, step, start=T0 + lead, util=lambda i, u=util: u, mem_gib=lambda i: 4.0)
        ledger.append(RUN, gpu=gpu, host=host_intervals(n, step, start=T0 + lead))
    result = CliRunner().invoke(cli, ["report", "run", RUN, "--format", "json", "--db", db])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_finding_and_the_table_give_the_same_busy_share(tmp_path: Path) -> None:
    model = _model(tmp_path)
    finding = next(f for f in model["findings"] if f["rule"] == "underused")
    said = re.findall(r"was busy (\S+ ?%)", finding["detail"])
    table = [g["busy"] for g in model["gpus"]]
    assert said and len(said) == len(table)
    assert [s.replace(" ", "") for s in said] == [t.replace(" ", "") for t in table], (said, table)
    # GPU 0: 212 busy seconds (40 % of the 530 s recorded) in the 600 s the run held it.
    assert table[0].replace(" ", "") == "35%"
