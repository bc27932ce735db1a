"""The one helper every NVML query of the collector goes through.

What an error means (NVML API reference, and what other GPU agents report from real cards):

* NotSupported / NoPermission / FunctionNotFound (or an old nvidia-ml-py without the function):
  the series is absent on this device for good — None, and it is not asked again.
* GpuIsLost, Uninitialized, DriverNotLoaded, LibRmVersionMismatch, ResetRequired, GpuNotFound:
  the whole GPU stopped answering — raised, the collector marks the GPU lost.
* Unknown: on real cards a single field can answer Unknown while the rest of the GPU works, so it
  is a failure of that field only. The GPU is taken as lost only when every query of a read
  failed (``DeviceQueries.all_failed``).
* anything else (Timeout, a passing driver error): absent for this read, one ``sampler_error``
  event per device, field and kind of error.

A field that fails ``MAX_FAILURES`` reads in a row is dropped alone, with one event, while the
rest of the GPU is still metered: no per-tick retries of a query that keeps failing.

Field values (``nvmlDeviceGetFieldValues``) answer per field: each field's own return code goes
through the same rules, so one unsupported or failing field never hides the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuledger.core.model import Event

MAX_FAILURES = 3
NOTHING_NEW: Any = object()  # a buffer query (with a timestamp cursor) that has nothing newer
# NVML_VALUE_TYPE_* -> the member of nvmlValue_t that holds the value (nvml.h, stable ABI)
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
MEMBER_OF = dict(enumerate(VALUE_MEMBERS))  # value type -> member
UINT_TYPE, ULL_TYPE = VALUE_MEMBERS.index("uiVal"), VALUE_MEMBERS.index("ullVal")  # NVML_VALUE_TYPE_*


def _member(value: Any, vtype: int) -> Any:
    """The member of an nvmlValue_t that holds a value of type ``vtype``; unknown types read ullVal."""
    return getattr(value, MEMBER_OF.get(vtype, "ullVal"))


LOST_ERRORS = (
    "NVMLError_GpuIsLost",
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibRmVersionMismatch",
    "NVMLError_ResetRequired",
    "NVMLError_GpuNotFound",
)
REINIT_ERRORS = ("NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch")
ABSENT_ERRORS = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")


_FIELD_KEYS: dict[int, str] = {}


def field_key(fid: int) -> str:
    """The memo key of one field id ("fi83"), made once."""
    key = _FIELD_KEYS.get(fid)
    if key is None:
        key = _FIELD_KEYS[fid] = f"fi{fid}"
    return key


class DeviceQueries:
    """Per-device memo: what is absent for good, what keeps failing, and how this read went."""

    __slots__ = ("absent", "answered", "failed", "failures", "label", "said", "unsupported", "uuid", "wanted")

    def __init__(self, uuid: str, label: str, absent: tuple[type[BaseException], ...]) -> None:
        self.uuid, self.label, self.absent = uuid, label, absent
        self.unsupported: set[str] = set()
        self.failures: dict[str, int] = {}
        self.answered = False  # a query answered in the current read
        self.failed = 0  # queries that failed (not "absent") in the current read
        self.said: list[str] = []  # event memo keys added in the current read
        # field ids -> (len(unsupported), the ids still asked); the set only grows, so its size dates it
        self.wanted: dict[tuple[int, ...], tuple[int, list[int]]] = {}

    def start_read(self) -> None:
        self.answered, self.failed = False, 0
        if self.said:  # almost always empty: no new list per device per read
            self.said = []

    @property
    def all_failed(self) -> bool:
        return self.failed > 0 and not self.answered


class Querier:
    """Runs NVML queries for the collector, turning errors into absent values and events."""

    def __init__(self, nv: Any, report: Callable[[Event], None], now: Callable[[], float]) -> None:
        self._nv = nv
        self._report_event = report
        self._now = now
        self.lost = tuple(getattr(nv, n) for n in LOST_ERRORS if hasattr(nv, n))
        self.reinit = tuple(getattr(nv, n) for n in REINIT_ERRORS if hasattr(nv, n))
        self.absent = (*(getattr(nv, n) for n in ABSENT_ERRORS), nv.NVMLLibraryMismatchError)
        self.absent_mig = (*self.absent, nv.NVMLError_InvalidArgument)
        self._not_found = nv.NVMLError_NotFound
        self._absent_codes = {
            getattr(nv, n, None) for n in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION")
        } - {None}
        self._reported: set[str] = set()

    # -- one query ---------------------------------------------------------------------------
    def call(self, d: DeviceQueries, key: str, fn: Any, *args: Any, since: bool = False) -> Any:
        """One NVML query: the value, or None (absent or failed). ``since``: NotFound is NOTHING_NEW."""
        if key in d.unsupported:
            return None
        try:
            value = fn(*args)
        except d.absent:
            d.unsupported.add(key)
            return None
        except self.lost:
            raise
        except self._not_found as exc:
            if since:
                d.answered = True
                d.failures.pop(key, None)
                return NOTHING_NEW
            self._fail(d, key, exc)
            return None
        except Exception as exc:  # Unknown, Timeout, a bug: this field, this read
            if fn is None:  # an nvidia-ml-py without the function: absent (tested here, not before every call)
                d.unsupported.add(key)
            else:
                self._fail(d, key, exc)
            return None
        d.answered = True  # a flag, not a count: this runs for every query of every tick
        if d.failures:
            d.failures.pop(key, None)
        return value

    def fields(self, d: DeviceQueries, fn: Any, handle: Any, ids: tuple[int, ...]) -> dict[int, Any]:
        """Field values by id: one call, each field judged on its own return code."""
        unsupported = d.unsupported
        hit = d.wanted.get(ids)
        if hit is not None and hit[0] == len(unsupported):
            wanted = hit[1]  # the same ids as last time and nothing newly unsupported
        else:
            wanted = [i for i in ids if _FIELD_KEYS.get(i, "") not in unsupported]
            d.wanted[ids] = (len(unsupported), wanted)
        if not wanted:
            return {}
        values = self.call(d, "fields", fn, handle, wanted)
        if values is None:
            return {}
        out: dict[int, Any] = {}
        failures = d.failures
        for v in values:
            ret = v.nvmlReturn
            if ret == 0:
                # Plain attribute reads for the two types gpuledger's fields have (the cheapest in
                # Python 3.11), the member of any other type by name.
                vtype, value, fid = v.valueType, v.value, v.fieldId
                if vtype == ULL_TYPE:
                    out[fid] = value.ullVal
                else:
                    out[fid] = value.uiVal if vtype == UINT_TYPE else _member(value, vtype)
                if failures:
                    failures.pop(field_key(fid), None)
            elif ret in self._absent_codes:
                unsupported.add(field_key(v.fieldId))
            else:
                self._fail(d, field_key(v.fieldId), _FieldError(self._nv, ret))
        return out

    # -- failures and events -----------------------------------------------------------------
    def _fail(self, d: DeviceQueries, key: str, exc: BaseException) -> None:
        d.failed += 1
        n = d.failures.get(key, 0) + 1
        d.failures[key] = n
        self.report(d, key, exc)
        if n >= MAX_FAILURES:
            d.unsupported.add(key)
            d.failures.pop(key, None)
            self.event(
                d, "sampler_error", f"{key}: failed {n} reads in a row ({type(exc).__name__}); no longer asked, "
                "the rest of the GPU is still metered", series=key, error=type(exc).__name__, dropped=True,
            )  # fmt: skip

    def forget_read(self, d: DeviceQueries) -> None:
        """A read in which nothing answered: the GPU is lost, its field failures were not theirs."""
        self._reported.difference_update(d.said)
        d.failures.clear()

    def report(self, d: DeviceQueries, series: str, exc: BaseException) -> None:
        """One ``sampler_error`` event per device, series and kind of error."""
        key = f"{d.uuid}/{series}/{type(exc).__name__}"
        if key not in self._reported:
            self._reported.add(key)
            d.said.append(key)
            self.event(d, "sampler_error", f"{series}: {type(exc).__name__}: {exc}", series=series,
                       error=type(exc).__name__)  # fmt: skip

    def event(self, d: DeviceQueries, kind: str, message: str, **payload: Any) -> None:
        self._report_event(
            Event(t=self._now(), kind=kind, message=f"GPU {d.label} ({d.uuid}): {message}",
                  payload={"uuid": d.uuid, **payload})
        )  # fmt: skip

    def once(self, d: DeviceQueries, key: str, kind: str, message: str, **payload: Any) -> None:
        """An event said once per device and key (a fact about the device, not an error)."""
        tag = f"{d.uuid}/{key}"
        if tag not in self._reported:
            self._reported.add(tag)
            self.event(d, kind, message, **payload)


class _FieldError(Exception):
    """A field's own return code in a field-value answer."""

    def __init__(self, nv: Any, code: int) -> None:
        self.code = code
        try:
            text = nv.nvmlErrorString(code)
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:
            text = f"NVML error {code}"
        super().__init__(text)
