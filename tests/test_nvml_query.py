"""Field values as pynvml returns them: each value read from the member its type names."""

from __future__ import annotations

import pynvml

from gpuledger.collect.nvml_query import DeviceQueries, Querier


def test_each_field_value_is_read_from_the_member_of_its_type() -> None:
    """nvmlFieldValue_t carries its value in the union member its valueType names (nvml.h); a
    driver may answer any type for a field, so every documented type must read right."""
    given = [  # (field id, value type, member, value)
        (1, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
        (2, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**63 + 5),
        (3, pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 61.5),
        (4, pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -7),
        (5, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 123_456),
    ]
    answer = (pynvml.c_nvmlFieldValue_t * len(given))()  # pynvml's own struct, as the driver fills it
    for slot, (fid, vtype, member, value) in zip(answer, given, strict=True):
        slot.fieldId, slot.valueType, slot.nvmlReturn = fid, vtype, pynvml.NVML_SUCCESS
        setattr(slot.value, member, value)
    q = Querier(pynvml, lambda event: None, lambda: 0.0)
    d = DeviceQueries("GPU-x", "0", q.absent)
    got = q.fields(d, lambda handle, ids: answer, None, tuple(fid for fid, *_ in given))
    assert got == {fid: value for fid, _, _, value in given}
