#!/usr/bin/env bash
# h200_check.sh -- validate gpuledger's NVML collector on a real NVIDIA GPU (written for one H200).
# (gpuledger's copy: the workload's memory scales down on GPUs under 60 GiB; the per-interval
#  table also shows util_idle_s, util_unknown_s and proc_method,
#  and the summary their totals; the probe also records how far the newest utilisation sample is
#  behind the host's boot clock, to tell which clock the driver stamps samples with; everything
#  else as the original device check.)
#
# Run from the project checkout (installed with `pip install -e .`), torch + nvidia-ml-py present:
#     bash /path/to/h200_check.sh            # results under $OUT/h200_check if OUT is set, else a temp dir
# Optional env: PYTHON (default python3), GPU_INDEX (default 0), CYCLES (default 12: 3 s busy / 2 s idle),
# BUDGET_S (default 285: later steps shrink their timeouts to stay inside it).
# Budget: about 2 minutes when all goes well; every step has its own timeout (< 5 minutes in all).
# It writes nothing into the checkout: all files (and a private ledger, GPULEDGER_HOME) go under the result dir.
# On a remote device runner that copies only the working tree, copy this file into the checkout first.
#
# What it does
#   1. probe.py     raw pynvml facts on the idle GPU: utilisation sample buffer (depth, spacing, what a
#                   cursor with nothing newer returns, clock domain of the timestamps), energy counter
#                   update period, power (GetPowerUsage vs FieldValues instant/average), memory v1 vs v2,
#                   violation counters, clock-event bits, process queries, cost of each call.
#   2. ground truth, in parallel with the run:
#        nvidia-smi --query-gpu=... -lms 100                       -> smi.csv
#        poller.py: pynvml every 50 ms (energy counter, power, memory v1/v2, per-process memory) and a
#                   drain of the raw utilisation sample buffer        -> truth.jsonl, samples.jsonl
#        cost_probe.py: gpuledger's own NvmlCollector behind a timing proxy of pynvml, read once a second
#                   -> ms per tick per GPU, NVML calls per tick       -> cost.json
#        workload.py writes its own busy windows (host clock, after cuda synchronize) -> workload.json
#   3. gpuledger run --interval 1 -- python workload.py   (matmuls: 3 s busy / 2 s idle, 12 cycles,
#                   20 GiB held throughout, +16 GiB held during cycles 4-7; a third and a quarter
#                   of the GPU's memory on GPUs under 60 GiB)
#   4. analyze.py   gpuledger's show --json / export jsonl / report json against the ground truth;
#                   prints every measurement, the method recorded per interval, and a PASS/FAIL table:
#                   energy within 1 % of the counter truth; busy within 5 % of the duty cycle and of the
#                   nvidia-smi integral; peak device memory and peak process memory within 2 %.
# Exit status: 0 all PASS, 1 some FAIL, 2 setup problem (no GPU / no torch / no gpuledger data).
set -u

PY="${PYTHON:-python3}"
GPU_INDEX="${GPU_INDEX:-0}"
CYCLES="${CYCLES:-12}"
BASE="${OUT:-}"
if [ -z "$BASE" ]; then BASE="$(mktemp -d -t h200_check.XXXXXX)"; fi
W="$BASE/h200_check"
mkdir -p "$W"
exec > >(tee -a "$W/console.log") 2>&1
T_START=$(date +%s)
BG_PIDS=()
SMI_PID=""

left() { local l=$(( ${BUDGET_S:-285} - ($(date +%s) - T_START) )); [ "$l" -lt "${2:-10}" ] && l=${2:-10}; [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
say() { printf '\n=== [%4ss] %s\n' "$(( $(date +%s) - T_START ))" "$*"; }
cleanup() {
  touch "$W/stop" 2>/dev/null
  for p in "${BG_PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
  [ -n "$SMI_PID" ] && kill -INT "$SMI_PID" 2>/dev/null
  return 0
}
trap cleanup EXIT

say "h200_check: results in $W"
echo "cwd: $(pwd)"; date; uname -a
command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi || echo "nvidia-smi: not available or failed"
timeout 20 nvidia-smi -L 2>&1 | head -20

say "Python environment"
timeout 120 "$PY" - <<'EOF'
import importlib.metadata as md, sys
print("python", sys.version.split()[0], sys.executable)
for pkg in ("torch", "nvidia-ml-py", "gpuledger", "psutil"):
    try:
        print(f"{pkg:14s}", md.version(pkg))
    except Exception as exc:
        print(f"{pkg:14s} MISSING ({exc})")
import torch
print("torch cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count(),
      "| cuda", torch.version.cuda)
EOF
if ! timeout 60 "$PY" -c 'import torch, pynvml, gpuledger; assert torch.cuda.is_available()'; then
  echo "SETUP FAILED: need torch with CUDA, nvidia-ml-py and gpuledger importable by $PY"; exit 2
fi
if timeout 60 "$PY" -m gpuledger --version >/dev/null 2>&1; then GL=("$PY" -m gpuledger); else GL=(gpuledger); fi
echo "gpuledger command: ${GL[*]}  ($("${GL[@]}" --version 2>&1))"

UUID="$(timeout 30 "$PY" -c "
import pynvml as N; N.nvmlInit(); h=N.nvmlDeviceGetHandleByIndex($GPU_INDEX); u=N.nvmlDeviceGetUUID(h)
print(u.decode() if isinstance(u, bytes) else u)")"
if [ -z "$UUID" ]; then echo "SETUP FAILED: could not read the UUID of GPU $GPU_INDEX"; exit 2; fi
echo "GPU under test: index $GPU_INDEX uuid $UUID"
MIG="$(timeout 30 "$PY" -c "
import pynvml as N; N.nvmlInit(); h=N.nvmlDeviceGetHandleByIndex($GPU_INDEX)
try: print(N.nvmlDeviceGetMigMode(h)[0])
except Exception as e: print('n/a', type(e).__name__)" 2>&1)"
echo "MIG mode (current): $MIG"
case "$MIG" in 1*) echo "WARNING: MIG is enabled on this GPU: the whole-GPU checks below do not apply (gpuledger meters slices, NVML has no utilisation/energy for slices)";; esac

# ------------------------------------------------------------------------------------------------
cat > "$W/probe.py" <<'EOF'
"""Raw NVML facts on the (idle) GPU: what gpuledger's collector assumes, checked."""
import importlib.metadata as md
import json, statistics, sys, time
import pynvml as N

out, uuid = sys.argv[1], sys.argv[2]
R = {}
VAL = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def rec(key, fn):
    try:
        R[key] = fn()
    except Exception as exc:  # record the error class: that is what the collector sees
        R[key] = f"ERROR {type(exc).__name__}: {exc}"
    return R[key]


def txt(v):
    return v.decode() if isinstance(v, bytes) else v


def samples(h, cursor):
    vt, s = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, cursor)
    f = VAL[vt] if 0 <= vt < len(VAL) else "uiVal"
    return vt, [(int(x.timeStamp), getattr(x.sampleValue, f)) for x in s]


N.nvmlInit()
h = N.nvmlDeviceGetHandleByUUID(uuid)
rec("driver", lambda: txt(N.nvmlSystemGetDriverVersion()))
rec("nvml_version", lambda: txt(N.nvmlSystemGetNVMLVersion()))
rec("cuda_driver", N.nvmlSystemGetCudaDriverVersion)
rec("nvidia_ml_py", lambda: md.version("nvidia-ml-py"))
rec("name", lambda: txt(N.nvmlDeviceGetName(h)))
rec("architecture", lambda: N.nvmlDeviceGetArchitecture(h))
rec("mig_mode", lambda: list(N.nvmlDeviceGetMigMode(h)))
rec("persistence_mode", lambda: N.nvmlDeviceGetPersistenceMode(h))
rec("power_limit_mw", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h))

# --- utilisation sample buffer -----------------------------------------------------------------
now_us = int(time.time() * 1e6)
vt, buf = samples(h, 0)
R["samples_value_type"] = vt
if buf:
    ts = [t for t, _ in buf]
    gaps = [(b - a) / 1e6 for a, b in zip(ts, ts[1:])]
    R["buffer"] = {
        "count": len(buf), "span_s": (max(ts) - min(ts)) / 1e6, "sorted": ts == sorted(ts),
        "gap_median_s": statistics.median(gaps) if gaps else None,
        "gap_min_s": min(gaps) if gaps else None, "gap_max_s": max(gaps) if gaps else None,
        "values_min_max": [min(v for _, v in buf), max(v for _, v in buf)],
        "host_now_minus_newest_s": now_us / 1e6 - max(ts) / 1e6,  # ~0..period if NVML uses the epoch clock
        # ~0..period if NVML stamps CLOCK_BOOTTIME instead (seen on some drivers; docs/METERING.md)
        "boot_now_minus_newest_s": time.clock_gettime(time.CLOCK_BOOTTIME) - max(ts) / 1e6,
        "last_10": buf[-10:],
    }
    last = max(ts)
    rec("cursor_at_newest", lambda: f"{len(samples(h, last)[1])} samples")  # expect NVMLError_NotFound
    rec("cursor_at_host_now", lambda: f"{len(samples(h, int(time.time() * 1e6))[1])} samples")
    time.sleep(2.0)  # how many samples does an idle GPU add in 2 s?
    rec("idle_new_samples_in_2s", lambda: (lambda r: {"count": len(r), "ts_gaps_s": [
        round((b - a) / 1e6, 4) for (a, _), (b, _) in zip(r, r[1:])], "values": [v for _, v in r]})(samples(h, last)[1]))
else:
    R["buffer"] = "EMPTY"

# --- energy counter: units and update period (tight poll for 1 s, idle) ------------------------
def energy_updates(seconds):
    out_, t_end = [], time.perf_counter() + seconds
    prev = None
    while time.perf_counter() < t_end:
        e = N.nvmlDeviceGetTotalEnergyConsumption(h)
        if e != prev:
            out_.append((time.perf_counter(), e))
            prev = e
    d = [b[0] - a[0] for a, b in zip(out_, out_[1:])]
    return {"changes": len(out_) - 1, "update_period_median_s": statistics.median(d) if d else None,
            "mJ_first_last": [out_[0][1], out_[-1][1]] if out_ else None}


rec("energy_counter_idle", lambda: energy_updates(1.0))

# --- power: average vs instant -------------------------------------------------------------------
rec("power_usage_mw", lambda: N.nvmlDeviceGetPowerUsage(h))
def fields():
    ids = [getattr(N, n) for n in ("NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_POWER_INSTANT") if hasattr(N, n)]
    vals = N.nvmlDeviceGetFieldValues(h, ids)
    return {str(v.fieldId): (v.nvmlReturn, v.value.uiVal) for v in vals}
rec("power_fields_avg185_inst186", fields)

# --- memory v1 / v2 -------------------------------------------------------------------------------
rec("mem_v1", lambda: (lambda m: {"total": m.total, "used": m.used, "free": m.free})(N.nvmlDeviceGetMemoryInfo(h)))
rec("mem_v2", lambda: (lambda m: {"total": m.total, "used": m.used, "reserved": m.reserved, "free": m.free})(
    N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)))

# --- throttling ------------------------------------------------------------------------------------
viol = {}
for name in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION", "RELIABILITY"):
    try:
        v = N.nvmlDeviceGetViolationStatus(h, getattr(N, "NVML_PERF_POLICY_" + name))
        viol[name] = {"referenceTime": v.referenceTime, "violationTime_ns": v.violationTime}
    except Exception as exc:
        viol[name] = f"ERROR {type(exc).__name__}"
R["violation_counters"] = viol
rec("clocks_event_reasons", lambda: hex(N.nvmlDeviceGetCurrentClocksEventReasons(h)))
rec("temperature_gpu_c", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU))
rec("clock_sm_mhz", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM))
rec("clock_mem_mhz", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM))
rec("utilization_rates", lambda: (lambda u: {"gpu": u.gpu, "memory": u.memory})(N.nvmlDeviceGetUtilizationRates(h)))

# --- processes --------------------------------------------------------------------------------------
rec("compute_procs", lambda: [(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetComputeRunningProcesses(h)])
rec("graphics_procs", lambda: [(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetGraphicsRunningProcesses(h)])
rec("process_utilization_0", lambda: [(s.pid, s.timeStamp, s.smUtil) for s in N.nvmlDeviceGetProcessUtilization(h, 0)])
R["has_nvmlDeviceGetProcessesUtilizationInfo"] = hasattr(N, "nvmlDeviceGetProcessesUtilizationInfo")

# --- cost of each call gpuledger makes per tick (idle GPU) -----------------------------------------
def cost(fn, n=100):
    errs, t0 = 0, time.perf_counter()
    for _ in range(n):
        try:
            fn()
        except Exception:
            errs += 1
    return {"us": round((time.perf_counter() - t0) / n * 1e6, 1), "errors": errs}


newest = max((t for t, _ in buf), default=0)
calls = {
    "GetSamples(cursor=newest)": lambda: N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, newest),
    "GetSamples(cursor=0)": lambda: N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0),
    "GetPowerUsage": lambda: N.nvmlDeviceGetPowerUsage(h),
    "GetTotalEnergyConsumption": lambda: N.nvmlDeviceGetTotalEnergyConsumption(h),
    "GetMemoryInfo_v2": lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
    "GetTemperature": lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
    "GetClockInfo(SM)": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
    "GetCurrentClocksEventReasons": lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h),
    "GetViolationStatus(POWER)": lambda: N.nvmlDeviceGetViolationStatus(h, N.NVML_PERF_POLICY_POWER),
    "GetComputeRunningProcesses": lambda: N.nvmlDeviceGetComputeRunningProcesses(h),
    "GetGraphicsRunningProcesses": lambda: N.nvmlDeviceGetGraphicsRunningProcesses(h),
    "GetProcessUtilization(now-1s)": lambda: N.nvmlDeviceGetProcessUtilization(h, int(time.time() * 1e6) - 1_000_000),
    "GetFieldValues(9 fields)": lambda: N.nvmlDeviceGetFieldValues(h, [
        N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, N.NVML_FI_DEV_POWER_INSTANT, N.NVML_FI_DEV_POWER_AVERAGE,
        N.NVML_FI_DEV_PERF_POLICY_POWER, N.NVML_FI_DEV_PERF_POLICY_THERMAL, N.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
        N.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, N.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
        N.NVML_FI_DEV_PERF_POLICY_RELIABILITY]),
}
R["call_cost_idle"] = {k: cost(f) for k, f in calls.items()}
N.nvmlShutdown()
json.dump(R, open(f"{out}/probe.json", "w"), indent=1, default=str)
for k, v in R.items():
    s = json.dumps(v, default=str)
    print(f"  {k:38s} {s if len(s) < 300 else s[:300] + ' ...'}")
EOF

# ------------------------------------------------------------------------------------------------
cat > "$W/poller.py" <<'EOF'
"""Ground truth, independent of gpuledger: pynvml every 50 ms until W/stop exists (or 280 s)."""
import json, os, sys, time
import pynvml as N

W, uuid = sys.argv[1], sys.argv[2]
VAL = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
N.nvmlInit()
h = N.nvmlDeviceGetHandleByUUID(uuid)
tf = open(f"{W}/truth.jsonl", "w")
sf = open(f"{W}/samples.jsonl", "w")
burst = {"done": False}
stats = {"samples_notfound": 0, "samples_errors": {}, "drains": 0}
have_inst = hasattr(N, "NVML_FI_DEV_POWER_INSTANT")


def q(fn, *a):
    try:
        return fn(*a)
    except Exception:
        return None


t_begin = time.time()
cursor = 0
try:
    _, s0 = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
    cursor = max((int(x.timeStamp) for x in s0), default=0)
except Exception:
    pass
i = 0
next_t = time.time()
last_drain = 0.0
while not os.path.exists(f"{W}/stop") and time.time() - t_begin < 280:
    t = time.time()
    row = {"t": t, "e": q(N.nvmlDeviceGetTotalEnergyConsumption, h), "p": q(N.nvmlDeviceGetPowerUsage, h)}
    if have_inst:
        fv = q(N.nvmlDeviceGetFieldValues, h, [N.NVML_FI_DEV_POWER_INSTANT])
        if fv is not None and fv[0].nvmlReturn == 0:
            row["pi"] = fv[0].value.uiVal
    m1 = q(N.nvmlDeviceGetMemoryInfo, h)
    m2 = q(N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2)
    row["m1"] = None if m1 is None else m1.used
    if m2 is not None:
        row["m2"], row["m2r"] = m2.used, m2.reserved
    u = q(N.nvmlDeviceGetUtilizationRates, h)
    row["u"] = None if u is None else u.gpu
    if i % 2 == 0:
        procs = q(N.nvmlDeviceGetComputeRunningProcesses, h)
        row["procs"] = None if procs is None else [[p.pid, p.usedGpuMemory] for p in procs]
    tf.write(json.dumps(row) + "\n")
    if t - last_drain >= 0.25:  # raw utilisation samples, cursor-based like gpuledger
        last_drain = t
        stats["drains"] += 1
        try:
            vt, s = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, cursor)
            f = VAL[vt] if 0 <= vt < len(VAL) else "uiVal"
            for x in s:
                sf.write(json.dumps({"tr": t, "ts": int(x.timeStamp), "v": getattr(x.sampleValue, f)}) + "\n")
            if s:
                cursor = max(cursor, max(int(x.timeStamp) for x in s))
        except N.NVMLError_NotFound:
            stats["samples_notfound"] += 1
        except Exception as exc:
            k = type(exc).__name__
            stats["samples_errors"][k] = stats["samples_errors"].get(k, 0) + 1
    if not burst["done"] and os.path.exists(f"{W}/busy_now") and t - t_begin > 15:
        # energy counter update period under load: tight poll for 1 s
        pts, prev, t_end = [], None, time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            e = q(N.nvmlDeviceGetTotalEnergyConsumption, h)
            if e is not None and e != prev:
                pts.append((time.time(), e))
                prev = e
        pts = pts[:: max(1, len(pts) // 2000)]  # a counter that changes on every read: keep the file small
        burst.update(done=True, points=pts)
        for tt, e in pts:
            tf.write(json.dumps({"t": tt, "e": e}) + "\n")
    if i % 20 == 0:
        tf.flush(); sf.flush()
    i += 1
    next_t += 0.05
    time.sleep(max(0.0, next_t - time.time()))
stats["energy_burst"] = burst.get("points", [])
try:  # depth of the utilisation buffer right after the run: how long a stalled reader can wait
    _, s_end = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
    tss = sorted(int(x.timeStamp) for x in s_end)
    stats["buffer_at_end"] = {"count": len(tss), "span_s": (tss[-1] - tss[0]) / 1e6 if tss else None}
except Exception as exc:
    stats["buffer_at_end"] = f"ERROR {type(exc).__name__}"
json.dump(stats, open(f"{W}/poller_stats.json", "w"))
tf.close(); sf.close()
EOF

# ------------------------------------------------------------------------------------------------
cat > "$W/cost_probe.py" <<'EOF'
"""gpuledger's own NvmlCollector, behind a timing proxy of pynvml: ms per read and calls per tick."""
import json, os, sys, time
from collections import defaultdict
import pynvml

W, uuid = sys.argv[1], sys.argv[2]
calls, spent = defaultdict(int), defaultdict(float)


class Proxy:
    """pynvml with every nvml* function counted and timed; constants and error classes unchanged."""

    def __getattr__(self, name):
        obj = getattr(pynvml, name)
        if callable(obj) and name.startswith("nvml") and not isinstance(obj, type):
            def timed(*a, **k):
                t0 = time.perf_counter()
                try:
                    return obj(*a, **k)
                finally:
                    calls[name] += 1
                    spent[name] += time.perf_counter() - t0
            return timed
        return obj


out = {"ticks": [], "errors": []}
try:
    from gpuledger.collect.nvml import NvmlCollector
    col = NvmlCollector(nvml=Proxy(), visible=uuid)
except Exception as exc:
    out["errors"].append(f"cannot build NvmlCollector: {type(exc).__name__}: {exc}")
    json.dump(out, open(f"{W}/cost.json", "w"))
    sys.exit(0)
out["devices"] = [d.uuid for d in col.devices()]
t_begin = time.time()
pids = set()
col.read(pids, time.time())  # prime
per_tick = []
while not os.path.exists(f"{W}/stop") and time.time() - t_begin < 280:
    time.sleep(1.0)
    try:
        pids = {int(open(f"{W}/workload_pid").read().strip())}
    except Exception:
        pass
    calls.clear(); spent.clear()
    t0 = time.perf_counter()
    r = col.read(pids, time.time())
    dt = time.perf_counter() - t0
    for tk in r.ticks:
        out["ticks"].append({k: getattr(tk, k) for k in ("t0", "t1", "busy_s", "util_method", "util_max_pct",
                             "energy_j", "energy_method", "power_w", "mem_used_b", "mem_reserved_b",
                             "proc_mem_b", "proc_sm_util_pct")})
    out["errors"] += [e.message for e in r.events]
    per_tick.append({"ms": dt * 1e3, "pids": len(pids), "calls": dict(calls),
                     "us": {k: v * 1e6 for k, v in spent.items()}})
col.close()
out["per_tick"] = per_tick
json.dump(out, open(f"{W}/cost.json", "w"), default=str)
EOF

# ------------------------------------------------------------------------------------------------
cat > "$W/workload.py" <<'EOF'
"""The metered command: bf16 matmuls with a duty cycle; writes its own busy windows (host clock)."""
import json, os, sys, time
W = sys.argv[1]
CYCLES = int(os.environ.get("CYCLES", "12"))
BUSY_S, IDLE_S = 3.0, 2.0
info = {"pid": os.getpid(), "busy": [], "mem_step": None, "t_start": time.time(), "phase_log": []}
open(f"{W}/workload_pid", "w").write(str(os.getpid()))
try:
    import torch
    dev = torch.device("cuda:0")
    torch.cuda.init()
    info["device"] = torch.cuda.get_device_name(0)
    # 20 GiB held for the whole run and 16 GiB more in cycles 4..7, or less on a smaller GPU (a
    # third and a quarter of its memory), so the check runs on any CUDA GPU.
    total_b = torch.cuda.mem_get_info(dev)[1]
    base_b, extra_b = min(20 * 2**30, total_b // 3), min(16 * 2**30, total_b // 4)
    info["base_b"], info["extra_b"] = base_b, extra_b
    base = torch.empty(base_b, dtype=torch.uint8, device=dev)
    base.fill_(1)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def busy(seconds, k):
        """Back-to-back matmuls for ``seconds``; a sync every k kernels keeps the queue short."""
        s = time.time()
        open(f"{W}/busy_now", "w").close()
        while time.time() - s < seconds:
            for _ in range(k):
                c = a @ b
            torch.cuda.synchronize()
        e = time.time()
        info["busy"].append([s, e])
        return e - s

    # calibrate: k matmuls ~ 50 ms
    torch.cuda.synchronize(); s = time.time()
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    per = (time.time() - s) / 20
    k = max(1, int(0.05 / max(per, 1e-5)))
    info["busy"].append([s, time.time()])
    info["matmul_ms"], info["k"] = per * 1e3, k
    info["tflops"] = 2 * 8192**3 / per / 1e12
    busy(1.0, k)  # warm-up (clocks up)
    time.sleep(IDLE_S)
    extra = None
    for cyc in range(CYCLES):
        if cyc == 4:
            extra = torch.empty(extra_b, dtype=torch.uint8, device=dev)  # held for cycles 4..7
            extra.fill_(2)
            info["mem_step"] = [time.time(), None]
        busy(BUSY_S, k)
        if cyc == 7 and extra is not None:
            del extra
            extra = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            info["mem_step"][1] = time.time()
        try:
            os.remove(f"{W}/busy_now")
        except OSError:
            pass
        time.sleep(IDLE_S)
    info["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    info["torch_max_allocated"] = torch.cuda.max_memory_allocated()
    time.sleep(1.0)
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
    print("workload failed:", info["error"], file=sys.stderr)
finally:
    info["t_end"] = time.time()
    json.dump(info, open(f"{W}/workload.json", "w"), indent=1)
print(f"workload: {len(info['busy'])} busy windows, {sum(e - s for s, e in info['busy']):.2f} s busy, "
      f"matmul {info.get('matmul_ms', 0):.2f} ms ({info.get('tflops', 0):.0f} TFLOP/s)")
sys.exit(1 if "error" in info else 0)
EOF

# ------------------------------------------------------------------------------------------------
cat > "$W/analyze.py" <<'EOF'
"""gpuledger's recorded figures against the ground truth; prints everything, PASS/FAIL table.

Every section is guarded: a missing or broken input costs that section only, the table is still printed."""
import bisect, json, math, os, statistics, sys, traceback
from collections import Counter
from datetime import datetime

W, UUID = sys.argv[1], sys.argv[2]
GiB = 2**30
res = {"checks": [], "measured": {}, "section_errors": []}
M = res["measured"]


class guard:
    """``with guard("name"):`` prints a failing section's traceback and carries on."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        print(f"\n--- {self.name} " + "-" * max(0, 90 - len(self.name)))

    def __exit__(self, et, ev, tb):
        if et is not None:
            traceback.print_exception(et, ev, tb)
            res["section_errors"].append(f"{self.name}: {et.__name__}: {ev}")
        return True


def load_json(name, default=None):
    try:
        with open(f"{W}/{name}") as f:
            return json.load(f)
    except Exception as exc:
        print(f"  (could not read {name}: {exc})")
        return default


def load_jsonl(name):
    rows = []
    try:
        with open(f"{W}/{name}") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except Exception as exc:
        print(f"  (could not read {name}: {exc})")
    return rows


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def rel(a, b):
    return None if a is None or b in (None, 0) or isinstance(a, (dict, str)) else (a - b) / b


def fmt(v, d=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{d}f}"
    return str(v)


def num(x):
    try:
        return float(x)
    except Exception:
        return None


def check(name, value, truth, tol, unit="", note=""):
    r = rel(value, truth)
    status = "N/A" if r is None else ("PASS" if abs(r) <= tol else "FAIL")
    res["checks"].append({"check": name, "gpuledger": value, "truth": truth, "rel_err": r, "tol": tol,
                          "status": status, "unit": unit, "note": note})


show = load_json("show.json", {}) or {}
rows = [r for r in load_jsonl("export.jsonl") if r.get("series") == "gpu"]
report = load_json("report.json", {}) or {}
wl = load_json("workload.json", {}) or {}
probe = load_json("probe.json", {}) or {}
pstats = load_json("poller_stats.json", {}) or {}
cost = load_json("cost.json", {}) or {}
truth = load_jsonl("truth.jsonl")
raw = load_jsonl("samples.jsonl")
gpu = next((g for g in show.get("gpus", []) if g.get("uuid") == UUID), None) or (show.get("gpus") or [None])[0]
mine = sorted((r for r in rows if gpu is None or r.get("gpu_uuid") == gpu.get("uuid")), key=lambda r: (r["t0"], r["seq"]))
busy_windows = wl.get("busy") or []
W0 = W1 = None
busy_gl = energy_gl = busy_duty = busy_smi = smi_e = E_truth = None
e_at = None
peak_v2 = peak_v1 = proc_truth = None
ns_mismatch = False
um, emc = Counter(), Counter()
smi = []

with guard("gpuledger run"):
    print(f"  run {show.get('id')} status={show.get('status')} exit={show.get('exit_code')} "
          f"wall={fmt(show.get('wall_seconds'))} s intervals={show.get('intervals')} gpu_note={show.get('gpu_note')}")
    print(f"  versions {show.get('versions')}")
    if gpu:
        for k in ("index", "uuid", "name", "source", "mig_profile", "busy_seconds", "energy_joules", "peak_memory_bytes",
                  "peak_process_memory_bytes", "peak_utilization_pct", "peak_power_watts", "max_temperature_c",
                  "sm_clock_avg_mhz", "util_method", "energy_method", "throttle_seconds", "intervals"):
            print(f"  {k:28s} {gpu.get(k)}")
    ev = (report.get("events") or {}).get("items") or []
    print(f"  run events: {len(ev)}")
    for e in ev[:25]:
        print("   ", json.dumps(e, default=str)[:300])
    M["events"] = len(ev)
    if mine:
        W0, W1 = mine[0]["t0"], mine[-1]["t1"]
        M["window"] = [W0, W1, W1 - W0]
        busy_gl = math.fsum(r["busy_s"] for r in mine if r.get("busy_s") is not None) if any(
            r.get("busy_s") is not None for r in mine) else None
        energy_gl = math.fsum(r["energy_j"] for r in mine if r.get("energy_j") is not None) if any(
            r.get("energy_j") is not None for r in mine) else None
        M["busy_gl_s"], M["energy_gl_j"] = busy_gl, energy_gl
        print(f"  window [{W0:.3f}, {W1:.3f}] = {W1 - W0:.2f} s; sum busy_s = {fmt(busy_gl)} s; "
              f"sum energy_j = {fmt(energy_gl, 1)} J over {len(mine)} intervals")
        if gpu and gpu.get("busy_seconds") is not None and busy_gl is not None and abs(gpu["busy_seconds"] - busy_gl) > 1e-6:
            print(f"  NOTE: show --json busy_seconds {gpu['busy_seconds']} != sum over exported intervals {busy_gl}")
    else:
        print("  NO gpuledger GPU intervals for this GPU: nothing to compare (gpu_note above says why, if anything)")

with guard("workload (its own clock)"):
    print(f"  pid {wl.get('pid')} device {wl.get('device')} matmul {fmt(wl.get('matmul_ms'))} ms "
          f"({fmt(wl.get('tflops'), 0)} TFLOP/s) k={wl.get('k')} error={wl.get('error')}")
    print(f"  busy windows: {len(busy_windows)}, total {math.fsum(e - s for s, e in busy_windows):.3f} s")
    if W0 is not None:
        busy_duty = math.fsum(overlap(s, e, W0, W1) for s, e in busy_windows)
        M["busy_duty_s"] = busy_duty
        print(f"  busy inside gpuledger's window: {busy_duty:.3f} s; workload ran "
              f"[{fmt(wl.get('t_start', 0) - W0, 2)}, {fmt(wl.get('t_end', 0) - W0, 2)}] s into the window")
    print(f"  torch max reserved {fmt((wl.get('torch_max_reserved') or 0) / GiB)} GiB, "
          f"+{fmt((wl.get('extra_b') or 16 * GiB) / GiB)} GiB step {wl.get('mem_step')}")

with guard("nvidia-smi -lms 100"):
    fields = open(f"{W}/smi_fields.txt").read().strip().split(",")
    for line in open(f"{W}/smi.csv"):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        d = dict(zip(fields, cells))
        try:
            d["_t"] = datetime.strptime(d["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except Exception:
            continue
        smi.append(d)
    smi.sort(key=lambda d: d["_t"])
    gaps = [b["_t"] - a["_t"] for a, b in zip(smi, smi[1:])]
    print(f"  {len(smi)} rows, median spacing {fmt(statistics.median(gaps) if gaps else None)} s; fields {fields}")
    if smi and W0 is not None:
        busy_smi, smi_e = 0.0, 0.0
        for prev, cur in zip(smi, smi[1:]):
            u = num(cur.get("utilization.gpu"))
            if u is not None:
                busy_smi += u / 100 * overlap(prev["_t"], cur["_t"], W0, W1)  # a reading covers the span before it
            p0, p1 = num(prev.get("power.draw")), num(cur.get("power.draw"))
            if p0 is not None and p1 is not None:
                smi_e += (p0 + p1) / 2 * overlap(prev["_t"], cur["_t"], W0, W1)
        print(f"  utilization.gpu integral over the window {busy_smi:.3f} s; power.draw integral {smi_e:.1f} J")
        if smi[0]["_t"] > W0 or smi[-1]["_t"] < W1:
            print(f"  WARNING: nvidia-smi log covers [{smi[0]['_t'] - W0:.2f}, {smi[-1]['_t'] - W0:.2f}] s of the window only")
    M["busy_smi_s"], M["energy_smi_power_j"] = busy_smi, smi_e

with guard("pynvml poller (20 Hz)"):
    print(f"  {len(truth)} rows; poller stats: notfound={pstats.get('samples_notfound')} "
          f"errors={pstats.get('samples_errors')} buffer_at_end={pstats.get('buffer_at_end')}")
    E = sorted((r["t"], r["e"]) for r in truth if r.get("e") is not None)
    if W0 is not None and len(E) >= 2 and E[0][0] <= W0 and E[-1][0] >= W1:
        ts = [t for t, _ in E]

        def e_at(t):
            i = bisect.bisect_left(ts, t)
            if i <= 0:
                return E[0][1]
            if i >= len(E):
                return E[-1][1]
            (ta, ea), (tb, eb) = E[i - 1], E[i]
            return ea + (eb - ea) * (t - ta) / (tb - ta) if tb > ta else eb
        E_truth = (e_at(W1) - e_at(W0)) / 1000
        print(f"  energy counter over the window: {E_truth:.1f} J")
    else:
        print(f"  energy truth unavailable: {len(E)} counter readings "
              f"({'' if not E else f'{E[0][0]:.2f}..{E[-1][0]:.2f}'}) vs window {W0}..{W1}")
    M["energy_truth_j"] = E_truth
    if W0 is not None:
        def trapz(key, scale):
            pts = sorted((r["t"], r[key] * scale) for r in truth if r.get(key) is not None)
            return math.fsum((p0 + p1) / 2 * overlap(t0, t1, W0, W1)
                             for (t0, p0), (t1, p1) in zip(pts, pts[1:])) if len(pts) > 1 else None
        M["energy_power_avg_trapz_j"] = trapz("p", 1e-3)
        M["energy_power_inst_trapz_j"] = trapz("pi", 1e-3)
        in_w = [r for r in truth if W0 <= r["t"] <= W1]
        peak_v2 = max((r["m2"] for r in in_w if r.get("m2") is not None), default=None)
        peak_v1 = max((r["m1"] for r in in_w if r.get("m1") is not None), default=None)
        reserved = max((r["m2r"] for r in in_w if r.get("m2r") is not None), default=None)
        ps = [num(d.get("memory.used")) for d in smi if W0 <= d["_t"] <= W1]
        peak_smi = max((p for p in ps if p is not None), default=None)
        M.update(peak_mem_v2_b=peak_v2, peak_mem_v1_b=peak_v1, reserved_b=reserved,
                 peak_mem_smi_b=None if peak_smi is None else peak_smi * 2**20)
        print(f"  peak used: v2 {fmt(None if peak_v2 is None else peak_v2 / GiB)} GiB, v1 "
              f"{fmt(None if peak_v1 is None else peak_v1 / GiB)} GiB, reserved {fmt(None if reserved is None else reserved / GiB)} GiB, "
              f"nvidia-smi {fmt(None if peak_smi is None else peak_smi / 1024)} GiB")
        wpid = wl.get("pid")
        nvml_pids, proc_peak, foreign_peak, na_mem = Counter(), None, {}, 0
        for r in in_w:
            for pid, used in r.get("procs") or []:
                nvml_pids[pid] += 1
                if used is None:
                    na_mem += 1
                    continue
                if pid == wpid:
                    proc_peak = used if proc_peak is None else max(proc_peak, used)
                else:
                    foreign_peak[pid] = max(foreign_peak.get(pid, 0), used)
        ns_mismatch = wpid is not None and wpid not in nvml_pids and bool(nvml_pids)
        proc_truth = proc_peak
        if proc_truth is None and len(foreign_peak) == 1:
            proc_truth = next(iter(foreign_peak.values()))  # the only process on the GPU is ours, under its host pid
        M.update(nvml_pids_seen=dict(nvml_pids), workload_pid=wpid, pid_namespace_mismatch=ns_mismatch,
                 proc_mem_truth_b=proc_truth, proc_mem_na_readings=na_mem)
        print(f"  workload pid {wpid}; NVML compute pids seen {dict(nvml_pids)}; usedGpuMemory N/A readings {na_mem}; "
              f"peak for the workload {fmt(None if proc_truth is None else proc_truth / GiB)} GiB")
    eb = pstats.get("energy_burst") or []
    if len(eb) > 2:
        d = [b[0] - a[0] for a, b in zip(eb, eb[1:])]
        M["energy_update_period_load_s"] = statistics.median(d)
        print(f"  energy counter under load: {len(eb)} distinct values in 1 s, median update period "
              f"{statistics.median(d) * 1e3:.1f} ms (gpuledger assumes nothing here; shown for the record)")

with guard("raw NVML utilisation samples (poller drain, cursor-based like gpuledger)"):
    seen = {}
    for r in raw:
        seen.setdefault(r["ts"], r)
    S = sorted(seen.values(), key=lambda r: r["ts"])
    if not S or W0 is None:
        print(f"  {len(S)} raw samples; nothing to analyse")
    else:
        off = min(r["tr"] - r["ts"] / 1e6 for r in S)  # read time minus sample time: >= 0 on the same clock
        epoch_like = abs(off) < 5
        shift = 0.0 if epoch_like else off
        print(f"  {len(S)} samples; read-time minus sample-time min {off:.3f} s -> NVML timestamps "
              f"{'are on the host epoch clock' if epoch_like else 'are NOT on the host epoch clock (offset applied)'}")
        hs = [(r["ts"] / 1e6 + shift, r["v"]) for r in S]

        def in_busy(t, pad=0.4):
            return any(s + pad <= t <= e - pad for s, e in busy_windows)

        def in_idle(t, pad=0.4):
            return not any(s - pad <= t <= e + pad for s, e in busy_windows)

        pairs = list(zip(hs, hs[1:]))
        gaps_b = [b[0] - a[0] for a, b in pairs if in_busy(b[0])]
        gaps_i = [b[0] - a[0] for a, b in pairs if in_idle(b[0])]
        vals_b = [v for t, v in hs if in_busy(t)]
        vals_i = [v for t, v in hs if in_idle(t)]
        idle_time = (W1 - W0) - (busy_duty or 0)
        for name, g in (("busy", gaps_b), ("idle", gaps_i)):
            if g:
                print(f"  spacing while {name}: n={len(g)} median {statistics.median(g):.4f} s  "
                      f"p90 {sorted(g)[int(0.9 * (len(g) - 1))]:.4f} s  max {max(g):.3f} s")
            else:
                print(f"  spacing while {name}: NO samples")
        print(f"  samples per idle second {len(gaps_i) / idle_time if idle_time > 0 else float('nan'):.2f}; values while busy: "
              f"median {statistics.median(vals_b) if vals_b else None} min {min(vals_b, default=None)}; while idle: "
              f"max {max(vals_i, default=None)}")
        # first sample after each idle->busy transition: its gap is the span gpuledger charges at its value
        trans = []
        for s, e in busy_windows:
            after = [(i, t) for i, (t, v) in enumerate(hs) if t >= s and v > 0]
            if after:
                i, t = after[0]
                if i > 0:
                    trans.append((round(t - s, 3), round(t - hs[i - 1][0], 3), hs[i][1]))
        print(f"  first busy sample per busy window (delay after start s, gap to previous sample s, value): {trans[:14]}")
        P = statistics.median(gaps_b) if gaps_b else (statistics.median([b[0] - a[0] for a, b in pairs]) if pairs else 1 / 6)
        rule_a = math.fsum(min(max(v, 0), 100) / 100 * overlap(tp, t, W0, W1) for (tp, _), (t, v) in pairs)
        rule_b = math.fsum(min(max(v, 0), 100) / 100 * overlap(t - P, t, W0, W1) for t, v in hs)
        M.update(raw_rule_since_prev_s=rule_a, raw_rule_fixed_period_s=rule_b, raw_period_busy_s=P,
                 raw_gap_busy_median_s=statistics.median(gaps_b) if gaps_b else None,
                 raw_gap_idle_median_s=statistics.median(gaps_i) if gaps_i else None,
                 raw_gap_max_s=max((b[0] - a[0] for a, b in pairs), default=None),
                 raw_samples_idle_per_s=len(gaps_i) / idle_time if idle_time > 0 else None, nvml_clock_offset_s=off,
                 first_busy_samples=trans)
        print(f"  re-integrated over the window: since-previous rule (gpuledger's) {rule_a:.3f} s; fixed-period "
              f"rule (each sample covers P={P:.4f} s) {rule_b:.3f} s; duty cycle {fmt(busy_duty)} s")

with guard("per interval: method recorded, busy vs duty cycle, energy vs counter truth"):
    print(f"  {'seq':>3} {'t0+':>7} {'dur':>5} {'busy_s':>7} {'duty':>6} {'diff':>6} {'util_m':>8} {'umax':>4} "
          f"{'energy_j':>9} {'E_truth':>9} {'energy_m':>8} {'mem GiB':>7} {'proc GiB':>8} {'P max':>6} "
          f"{'idle_s':>6} {'unk_s':>6} {'proc_m':>6}")
    worst_busy, worst_e = 0.0, 0.0
    for r in mine:
        duty = math.fsum(overlap(s, e, r["t0"], r["t1"]) for s, e in busy_windows)
        et = None if e_at is None else (e_at(r["t1"]) - e_at(r["t0"])) / 1000
        b = r.get("busy_s")
        if b is not None:
            worst_busy = max(worst_busy, abs(b - duty))
        if et is not None and r.get("energy_j") is not None:
            worst_e = max(worst_e, abs(r["energy_j"] - et))
        print(f"  {r['seq']:>3} {r['t0'] - W0:>7.2f} {r['t1'] - r['t0']:>5.2f} {fmt(b):>7} {duty:>6.3f} "
              f"{fmt(None if b is None else b - duty):>6} {str(r.get('util_method')):>8} {fmt(r.get('util_max_pct'), 0):>4} "
              f"{fmt(r.get('energy_j'), 1):>9} {fmt(et, 1):>9} {str(r.get('energy_method')):>8} "
              f"{fmt(None if r.get('mem_used_max_b') is None else r['mem_used_max_b'] / GiB, 2):>7} "
              f"{fmt(None if r.get('proc_mem_max_b') is None else r['proc_mem_max_b'] / GiB, 2):>8} "
              f"{fmt(r.get('power_max_w'), 0):>6} {fmt(r.get('util_idle_s'), 2):>6} {fmt(r.get('util_unknown_s'), 2):>6} "
              f"{str(r.get('proc_method')):>6}")
    um.update(r.get("util_method") for r in mine)
    emc.update(r.get("energy_method") for r in mine)
    M.update(util_methods=dict(um), energy_methods=dict(emc), worst_interval_busy_err_s=worst_busy,
             worst_interval_energy_err_j=worst_e)
    print(f"  util_method per interval: {dict(um)}   energy_method per interval: {dict(emc)}")
    idle_sum = math.fsum(r.get("util_idle_s") or 0.0 for r in mine)
    unknown_sum = math.fsum(r.get("util_unknown_s") or 0.0 for r in mine)
    M.update(util_idle_s=idle_sum, util_unknown_s=unknown_sum,
             proc_methods=dict(Counter(r.get("proc_method") for r in mine)))
    print(f"  unsampled time taken as idle {idle_sum:.2f} s; time the samples could not cover {unknown_sum:.2f} s; "
          f"process attribution {M['proc_methods']}")
    print(f"  worst per-interval |busy - duty| {worst_busy:.3f} s; worst |energy - counter truth| {worst_e:.1f} J "
          "(per-interval phase error is expected: sample lag; only the sums are checked)")

with guard("per-tick NVML cost (gpuledger's NvmlCollector.read behind a timing proxy, 1 GPU)"):
    pt_all = cost.get("per_tick", [])
    pt = [t for t in pt_all if t.get("pids")] or pt_all
    if pt:
        ms = sorted(t["ms"] for t in pt)
        M.update(tick_ms_median=statistics.median(ms), tick_ms_p95=ms[int(0.95 * (len(ms) - 1))], tick_ms_max=ms[-1])
        tot_calls, tot_us = Counter(), Counter()
        for t in pt:
            tot_calls.update(t["calls"])
            tot_us.update(t["us"])
        n = len(pt)
        M["calls_per_tick"] = sum(tot_calls.values()) / n
        print(f"  {n} ticks with the run's pid: {M['tick_ms_median']:.2f} ms median, {M['tick_ms_p95']:.2f} ms p95, "
              f"{M['tick_ms_max']:.2f} ms max; {M['calls_per_tick']:.1f} pynvml calls per tick")
        for k, c in tot_calls.most_common():
            print(f"    {k:42s} {c / n:5.2f}/tick  {tot_us[k] / c:9.1f} us/call")
        viol = sum(1 for t in pt_all if t["calls"].get("nvmlDeviceGetViolationStatus"))
        print(f"  ticks that read the 6 violation counters: {viol}/{len(pt_all)}")
        ticks = cost.get("ticks", [])
        if ticks:
            print(f"  the probe's own collector: util methods {dict(Counter(t['util_method'] for t in ticks))}, "
                  f"energy methods {dict(Counter(t['energy_method'] for t in ticks))}, "
                  f"max busy_s in one ~1 s tick {max((t['busy_s'] or 0) for t in ticks):.3f}")
    else:
        print(f"  no cost data; errors: {cost.get('errors')}")
    if cost.get("errors"):
        print(f"  collector events in the cost probe: {cost['errors'][:10]}")

with guard("probe facts (idle GPU, before the run)"):
    for k in ("driver", "nvml_version", "cuda_driver", "nvidia_ml_py", "name", "architecture", "mig_mode",
              "persistence_mode", "samples_value_type", "buffer", "cursor_at_newest", "cursor_at_host_now",
              "idle_new_samples_in_2s", "energy_counter_idle", "power_usage_mw", "power_fields_avg185_inst186",
              "mem_v1", "mem_v2", "violation_counters", "clocks_event_reasons", "utilization_rates", "compute_procs",
              "process_utilization_0", "has_nvmlDeviceGetProcessesUtilizationInfo"):
        s = json.dumps(probe.get(k), default=str)
        print(f"  {k:34s} {s[:420]}")
    for k, v in (probe.get("call_cost_idle") or {}).items():
        print(f"    cost {k:36s} {v}")

with guard("RESULT"):
    check("energy vs energy-counter truth", energy_gl, E_truth, 0.01, "J",
          "pynvml counter at 20 Hz, interpolated at the window ends")
    check("busy vs duty cycle (workload's own windows)", busy_gl, busy_duty, 0.05, "s")
    check("busy vs nvidia-smi utilization.gpu integral", busy_gl, busy_smi, 0.05, "s", "-lms 100")
    check("peak device memory vs pynvml v2 used", gpu.get("peak_memory_bytes") if gpu else None, peak_v2, 0.02, "B")
    check("peak process memory vs pynvml usedGpuMemory", gpu.get("peak_process_memory_bytes") if gpu else None,
          proc_truth, 0.02, "B", "PID NAMESPACE MISMATCH: NVML reports other pids" if ns_mismatch else "")
    res["checks"].append({"check": "util_method == samples in every interval", "gpuledger": dict(um), "truth": "samples",
                          "status": "N/A" if not um else ("PASS" if set(um) == {"samples"} else "FAIL")})
    res["checks"].append({"check": "energy_method == counter in every interval", "gpuledger": dict(emc), "truth": "counter",
                          "status": "N/A" if not emc else ("PASS" if set(emc) == {"counter"} else "FAIL")})
    pk = gpu.get("peak_memory_bytes") if gpu else None
    info = [
        ("busy: raw samples re-integrated, since-previous rule", M.get("raw_rule_since_prev_s"), busy_duty),
        ("busy: raw samples re-integrated, fixed-period rule", M.get("raw_rule_fixed_period_s"), busy_duty),
        ("energy vs GetPowerUsage trapezoid (poller)", energy_gl, M.get("energy_power_avg_trapz_j")),
        ("energy vs FI POWER_INSTANT trapezoid (poller)", energy_gl, M.get("energy_power_inst_trapz_j")),
        ("energy vs nvidia-smi power.draw trapezoid", energy_gl, smi_e),
        ("peak device memory vs pynvml v1 used (incl. reserved)", pk, peak_v1),
        ("peak device memory vs nvidia-smi memory.used", pk, M.get("peak_mem_smi_b")),
    ]
    print(f"  {'check':58s} {'gpuledger':>16} {'truth':>16} {'rel err':>9} {'tol':>5}  status")
    for c in res["checks"]:
        g, t = c["gpuledger"], c["truth"]
        gs = json.dumps(g) if isinstance(g, dict) else fmt(g, 3)
        ts_ = t if isinstance(t, str) else fmt(t, 3)
        r = c.get("rel_err")
        print(f"  {c['check']:58s} {gs:>16} {ts_:>16} {fmt(None if r is None else 100 * r, 2):>8}% "
              f"{fmt(None if c.get('tol') is None else 100 * c['tol'], 0):>4}%  {c['status']} {c.get('note', '')}")
    print("  informational (no threshold):")
    for name, g, t in info:
        r = rel(g, t)
        print(f"  {name:58s} {fmt(g):>16} {fmt(t):>16} {fmt(None if r is None else 100 * r, 2):>8}%")
    print(f"  per-tick read cost: {fmt(M.get('tick_ms_median'), 2)} ms median / {fmt(M.get('tick_ms_p95'), 2)} ms p95 "
          f"per GPU, {fmt(M.get('calls_per_tick'), 1)} pynvml calls per tick")
    if ns_mismatch:
        print(f"  NOTE: workload pid {M.get('workload_pid')} never appeared in NVML's process list (saw "
              f"{M.get('nvml_pids_seen')}): PID namespace; gpuledger cannot match its pids.")

failed = [c for c in res["checks"] if c["status"] == "FAIL"]
na = [c for c in res["checks"] if c["status"] == "N/A"]
res["summary"] = {"fail": len(failed), "na": len(na), "pass": len(res["checks"]) - len(failed) - len(na),
                  "section_errors": len(res["section_errors"])}
print(f"\n  SUMMARY: {res['summary']}  {'ALL PASS' if not failed and not na else ''}")
if res["section_errors"]:
    print(f"  section errors: {res['section_errors']}")
json.dump(res, open(f"{W}/results.json", "w"), indent=1, default=str)
sys.exit(1 if failed else (2 if na or not mine else 0))
EOF

for f in probe poller cost_probe workload analyze; do
  "$PY" -m py_compile "$W/$f.py" || { echo "SETUP FAILED: $f.py does not compile"; exit 2; }
done

# ------------------------------------------------------------------------------------------------
say "1. probe (idle GPU, raw pynvml)"
timeout 60 "$PY" "$W/probe.py" "$W" "$UUID" || echo "probe.py failed (rc=$?) -- continuing"

say "2. ground truth loggers"
SMI_FIELDS="timestamp,utilization.gpu,power.draw,memory.used,memory.total,clocks.sm,temperature.gpu"
for extra in ",power.draw.instant,power.draw.average,memory.reserved,clocks_event_reasons.active" ""; do
  if timeout 15 nvidia-smi -i "$UUID" --query-gpu="${SMI_FIELDS}${extra}" --format=csv,noheader,nounits >/dev/null 2>&1; then
    SMI_FIELDS="${SMI_FIELDS}${extra}"; break
  fi
done
echo "$SMI_FIELDS" > "$W/smi_fields.txt"
echo "nvidia-smi fields: $SMI_FIELDS"
STDBUF=(); command -v stdbuf >/dev/null && STDBUF=(stdbuf -oL)
"${STDBUF[@]}" timeout -s INT 260 nvidia-smi -i "$UUID" --query-gpu="$SMI_FIELDS" --format=csv,noheader,nounits \
  -lms 100 > "$W/smi.csv" 2> "$W/smi.err" &
SMI_PID=$!
"$PY" "$W/poller.py" "$W" "$UUID" > "$W/poller.log" 2>&1 &
BG_PIDS+=($!); POLLER_PID=$!
"$PY" "$W/cost_probe.py" "$W" "$UUID" > "$W/cost_probe.log" 2>&1 &
BG_PIDS+=($!); COST_PID=$!
sleep 2

say "3. gpuledger run --interval 1 -- workload (${CYCLES} x 3 s busy / 2 s idle)"
export GPULEDGER_HOME="$W/glhome"
unset GPULEDGER_DB GPULEDGER_SERVER GPULEDGER_TOKEN 2>/dev/null
CUDA_VISIBLE_DEVICES="$UUID" CYCLES="$CYCLES" timeout "$(left 200 60)" "${GL[@]}" run --interval 1 --name h200-check \
  -- "$PY" "$W/workload.py" "$W"
echo "gpuledger run exit status: $?"
sleep 2
touch "$W/stop"
for p in "$POLLER_PID" "$COST_PID"; do
  for _ in $(seq 1 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
  kill "$p" 2>/dev/null
done
kill -INT "$SMI_PID" 2>/dev/null; sleep 1; kill "$SMI_PID" 2>/dev/null; SMI_PID=""
echo "nvidia-smi rows: $(wc -l < "$W/smi.csv" 2>/dev/null)  poller rows: $(wc -l < "$W/truth.jsonl" 2>/dev/null)  raw samples: $(wc -l < "$W/samples.jsonl" 2>/dev/null)"
[ -s "$W/smi.err" ] && { echo "nvidia-smi stderr:"; head -5 "$W/smi.err"; }
[ -s "$W/poller.log" ] && { echo "poller log:"; tail -5 "$W/poller.log"; }
[ -s "$W/cost_probe.log" ] && { echo "cost probe log:"; tail -5 "$W/cost_probe.log"; }

say "4. gpuledger's record"
RID="$(timeout "$(left 30)" "${GL[@]}" runs --json --limit 1 | "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["id"] if r else "")')"
echo "run id: ${RID:-NONE}"
if [ -n "$RID" ]; then
  timeout "$(left 30)" "${GL[@]}" show "$RID" --json > "$W/show.json" || echo "show failed"
  timeout "$(left 30)" "${GL[@]}" export "$RID" --format jsonl -o "$W/export.jsonl" || echo "export failed"
  timeout "$(left 30)" "${GL[@]}" report run "$RID" --format json --no-history -o "$W/report.json" || echo "report failed"
  timeout "$(left 30)" "${GL[@]}" show "$RID" || true
fi

say "5. analysis"
timeout "$(left 90 30)" "$PY" "$W/analyze.py" "$W" "$UUID"
RC=$?
say "done (exit $RC); everything is under $W"
ls -la "$W"
exit $RC
