"""The exported metric names, their help text and labels: the one list the docs and tests check.

Base units, counters end in ``_total`` (the client library appends it to the family name),
no hostname label (the scrape adds ``instance``).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "gpuledger_"
RUN_LABELS = ("run_id", "project", "team", "user")
GPU_LABELS = ("gpu", "uuid", *RUN_LABELS)
INFO_LABELS = (*RUN_LABELS, "name", "status", "replayed")  # replayed: "true" for a --replay-gpus run
MAX_LABEL_CHARS = 200
# The throttle reasons the collectors record (collect/nvml.py); the reason label takes these values.
THROTTLE_REASONS = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_util",
    "reliability",
    "hw_slowdown",
    "hw_power_brake",
)  # user text (names) is cut, so one odd run cannot bloat every scrape


@dataclass(frozen=True)
class MetricName:
    name: str  # as it appears in the exposition (counters with _total, info with _info)
    kind: str  # "counter", "gauge" or "info"
    help: str
    labels: tuple[str, ...]

    @property
    def family(self) -> str:
        """The name handed to the client library (it adds ``_total`` / ``_info`` itself)."""
        for suffix, kind in (("_total", "counter"), ("_info", "info")):
            if self.kind == kind and self.name.endswith(suffix):
                return self.name[: -len(suffix)]
        return self.name


GPU_BUSY = MetricName(
    "gpuledger_gpu_busy_seconds_total",
    "counter",
    "GPU busy time (utilisation-weighted seconds; rate() is the busy share 0-1).",
    GPU_LABELS,
)
GPU_ENERGY = MetricName("gpuledger_gpu_energy_joules_total", "counter", "GPU energy drawn, joules.", GPU_LABELS)
GPU_THROTTLE = MetricName(
    "gpuledger_gpu_throttle_seconds_total",
    "counter",
    "Seconds the GPU was throttled, per reason (power, thermal, ...).",
    (*GPU_LABELS, "reason"),
)
RUN_CPU = MetricName(
    "gpuledger_run_cpu_seconds_total",
    "counter",
    "CPU time of the run's process tree (user + system), seconds.",
    RUN_LABELS,
)
GPU_POWER = MetricName(
    "gpuledger_gpu_power_watts", "gauge", "Highest GPU power draw in the latest interval, watts.", GPU_LABELS
)
GPU_MEMORY = MetricName(
    "gpuledger_gpu_memory_used_bytes",
    "gauge",
    "GPU device memory used at the latest interval's end, bytes.",
    GPU_LABELS,
)
GPU_MEMORY_TOTAL = MetricName("gpuledger_gpu_memory_total_bytes", "gauge", "GPU device memory size, bytes.", GPU_LABELS)
GPU_TEMPERATURE = MetricName(
    "gpuledger_gpu_temperature_celsius", "gauge", "Highest GPU temperature in the latest interval, °C.", GPU_LABELS
)
RUN_INFO = MetricName("gpuledger_run_info", "info", "A run being metered (value 1).", INFO_LABELS)
RUN_START = MetricName("gpuledger_run_start_time_seconds", "gauge", "When the run started, Unix time.", RUN_LABELS)
RUN_END = MetricName(
    "gpuledger_run_end_time_seconds", "gauge", "When the run ended, Unix time (ended runs only).", RUN_LABELS
)

# The value of an ended run that carries a model or model_version label (the team server's /metrics
# only: they need the ledger and its rate card). Gauges, one series per run, exposed while the run is
# in the scrape (an hour after its end); Prometheus' max_over_time(...[7d]) sums a week of runs.
VALUE_LABELS = (*RUN_LABELS, "model", "model_version", "status")
RUN_COST = MetricName(
    "gpuledger_run_cost",
    "gauge",
    "What the ended run cost, whole run, on the server rate card's basis, in its currency.",
    VALUE_LABELS,
)
RUN_IDLE_COST = MetricName(
    "gpuledger_run_idle_cost",
    "gauge",
    "Idle GPU time of the ended run, priced (in its cost on the allocated basis).",
    VALUE_LABELS,
)
RUN_EPOCHS = MetricName("gpuledger_run_epochs", "gauge", "Training epochs the ended run recorded.", VALUE_LABELS)
RUN_TRAIN_IMAGES = MetricName(
    "gpuledger_run_train_images",
    "gauge",
    "Training images the ended run saw (epochs x images per epoch).",
    VALUE_LABELS,
)
RUN_MAP_GAIN = MetricName(
    "gpuledger_run_map50_95_gain_ratio",
    "gauge",
    "mAP50-95 (0-1) the ended run added to the best of the attempts it resumes (its best, for a first attempt).",
    VALUE_LABELS,
)
RUN_BUSY_GPU = MetricName(
    "gpuledger_run_busy_gpu_seconds", "gauge", "GPU busy time of the ended run, all its GPUs, seconds.", VALUE_LABELS
)
RUN_MEASURED_GPU = MetricName(
    "gpuledger_run_measured_gpu_seconds",
    "gauge",
    "GPU time the ended run held on GPUs that report utilisation, seconds (busy share = busy / this).",
    VALUE_LABELS,
)
VALUE: tuple[MetricName, ...] = (
    RUN_COST,
    RUN_IDLE_COST,
    RUN_EPOCHS,
    RUN_TRAIN_IMAGES,
    RUN_MAP_GAIN,
    RUN_BUSY_GPU,
    RUN_MEASURED_GPU,
)

ALL: tuple[MetricName, ...] = (
    GPU_BUSY,
    GPU_ENERGY,
    GPU_THROTTLE,
    RUN_CPU,
    GPU_POWER,
    GPU_MEMORY,
    GPU_MEMORY_TOTAL,
    GPU_TEMPERATURE,
    RUN_INFO,
    RUN_START,
    RUN_END,
    *VALUE,
)
EXPOSED_NAMES = frozenset(m.name for m in ALL)
