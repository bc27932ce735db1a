"""Constrained field types of the ingest wire format (shared by models.py and rows.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from gpuledger.core.model import RUN_STATUSES

MIN_T = 946_684_800.0  # 2000-01-01: earlier timestamps are a unit mistake
MAX_INTERVAL_S = 7 * 86400.0  # rollups are an hour; a raw interval is seconds
MAX_WATTS = 100_000.0
MAX_INT = 2**62
FUTURE_SKEW_S = 3600.0  # clocks of agents may run ahead of the server's by this much

T = Annotated[float, Field(ge=MIN_T, allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Pct = Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]
Bytes = Annotated[int, Field(ge=0, le=MAX_INT)]
Seq = Annotated[int, Field(ge=0, le=2**31 - 1)]
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]
Watts = Annotated[float, Field(ge=0, le=MAX_WATTS, allow_inf_nan=False)]
Celsius = Annotated[float, Field(ge=-100, le=300, allow_inf_nan=False)]
Short = Annotated[str, Field(max_length=256)]
Text = Annotated[str, Field(max_length=65536)]
Status = Literal["running", "succeeded", "failed", "killed", "lost", "imported", "discovered"]
assert set(RUN_STATUSES) == {"running", "succeeded", "failed", "killed", "lost", "imported", "discovered"}
# A run id is a UUID in its canonical lower-case form (as gpuledger makes them): one that differs
# only in case is the same run, never a second one.
RunId = Annotated[
    str,
    Field(pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"),
    AfterValidator(str.lower),
]
