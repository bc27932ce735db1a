#!/bin/bash
# gpuledger's Slurm prolog: tells the node agent which job holds which GPU, and who the job is,
# without a single call to slurmctld (docs/AGENT.md, "Slurm").
#
# Install on every GPU node, run by slurmd as root at job allocation (slurm.conf):
#   Prolog=/etc/slurm/prolog.d/*     (this file as /etc/slurm/prolog.d/50-gpuledger.sh)
#   Epilog=/etc/slurm/epilog.d/*     (gpuledger-epilog.sh as /etc/slurm/epilog.d/50-gpuledger.sh)
#   PrologFlags=Alloc,Contain        (Alloc: run at allocation, before the first step)
#
# It writes:
#   $GPUSTAT_DIR/<gpu>       "<jobid> <uid>", one line per job holding the GPU: the GPU -> job
#                            mapping of Princeton's jobstats; <gpu> is what Slurm put in
#                            CUDA_VISIBLE_DEVICES for the prolog (a device index, or a MIG UUID).
#                            This is NOT dcgm-exporter's format: never point its
#                            --hpc-job-mapping-dir here (it would label metrics hpc_job="<jobid> <uid>").
#   $JOB_DIR/<jobid>.job     key=value lines: job, uid, user, account, partition, gpus, comment
#   $DCGM_DIR/<gpu index>    only when GPULEDGER_DCGM_JOB_MAP_DIR is set: dcgm-exporter's own format
#   $DCGM_DIR/<gpu>.<gi>     for its --hpc-job-mapping-dir, a job id a line, files named by the GPU
#                            index, or for a MIG slice its GPU's index and GPU instance id. Slurm
#                            names MIG slices (and may name GPUs) by UUID: those are resolved on
#                            this node by `$GPULEDGER_BIN agent mig-map UUID...` (NVML), under a
#                            timeout of GPULEDGER_MIG_MAP_TIMEOUT seconds (default 10); a UUID it
#                            cannot resolve gets no file, and the prolog says why on stderr.
#
# It always exits 0: a prolog that fails drains the node and requeues the job, and metering is
# not worth that. Slurm gives prologs no PATH, hence the one below, and GPULEDGER_BIN: the
# gpuledger executable (default /usr/local/bin/gpuledger, where `pip install` as root puts it).

PATH=/usr/sbin:/usr/bin:/sbin:/bin
umask 022
GPUSTAT_DIR="${GPULEDGER_GPUSTAT_DIR:-/run/gpustat}"
JOB_DIR="${GPULEDGER_SLURM_JOB_DIR:-/run/gpuledger/slurm}"
DCGM_DIR="${GPULEDGER_DCGM_JOB_MAP_DIR:-}"  # off unless set, e.g. /run/dcgm-job-map
GPULEDGER_BIN="${GPULEDGER_BIN:-/usr/local/bin/gpuledger}"
MIG_MAP_TIMEOUT="${GPULEDGER_MIG_MAP_TIMEOUT:-10}"

say() { printf 'gpuledger prolog: %s\n' "$*" >&2; }

# One line: a comment may hold newlines, and the agent reads one key=value a line.
one_line() {
  local value=${1//$'\n'/ }
  printf '%s' "${value//$'\r'/ }"
}

# The GPU names Slurm gave the prolog: CUDA_VISIBLE_DEVICES (device indices, or MIG UUIDs), else
# SLURM_JOB_GPUS (GRES indices). Anything else (NoDevFiles, a path) is no file name of ours.
job_gpus() {
  local devices="${CUDA_VISIBLE_DEVICES:-${SLURM_JOB_GPUS:-}}" name
  local -a names=()
  IFS=',' read -r -a names <<<"$devices"
  for name in "${names[@]}"; do
    name="${name//[[:space:]]/}"
    if [[ $name =~ ^([0-9]+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z-]+)$ ]]; then
      printf '%s\n' "$name"
    fi
  done
}

# Replace $1 atomically with its lines of other jobs, then "$2" (a reader never sees half a file).
# The temporary file is a dot-file of the same directory: neither reader takes it for a GPU.
put_line() {
  local file=$1 line=$2 job=${2%% *} tmp
  tmp=$(mktemp "${file%/*}/.gpuledger.XXXXXX") || return 1
  if [[ -f $file ]]; then
    grep -v -E "^${job}([[:space:]]|\$)" "$file" >"$tmp" || true
  fi
  if ! { printf '%s\n' "$line" >>"$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$file"; }; then
    rm -f "$tmp"
    return 1
  fi
}

write_facts() {
  local job=$1 uid=$2 gpus=$3 known_gpus=$4 tmp
  tmp=$(mktemp "$JOB_DIR/.gpuledger.XXXXXX") || return 1
  if ! {
    printf 'job=%s\n' "$job"
    printf 'uid=%s\n' "$uid"
    printf 'user=%s\n' "$(one_line "${SLURM_JOB_USER:-}")"
    printf 'account=%s\n' "$(one_line "${SLURM_JOB_ACCOUNT:-}")"
    printf 'partition=%s\n' "$(one_line "${SLURM_JOB_PARTITION:-}")"
    # Without either variable the job may have no GPU or Slurm may not set them: say nothing then.
    if [[ $known_gpus == yes ]]; then printf 'gpus=%s\n' "$gpus"; fi
    printf 'comment=%s\n' "$(one_line "${SLURM_JOB_COMMENT:-}")"
  } >"$tmp" || ! chmod 0644 "$tmp" || ! mv -f "$tmp" "$JOB_DIR/$job.job"; then
    rm -f "$tmp"
    return 1
  fi
}

# The dcgm-exporter file names of the job's GPUs, one a line: an index is its own; the UUIDs are
# asked of `gpuledger agent mig-map` at once (NVML starts once), whose `<uuid> <name>` lines are
# checked before use: only a UUID asked for, only a name of digits (never a path).
dcgm_names() {
  local gpu uuid name rc
  local -a uuids=()
  local -A asked=() named=()
  for gpu in "$@"; do
    if [[ $gpu =~ ^[0-9]+$ ]]; then
      printf '%s\n' "$gpu"
    else
      uuids+=("$gpu")
      asked[$gpu]=1
    fi
  done
  ((${#uuids[@]})) || return 0
  if [[ ! -x $GPULEDGER_BIN ]]; then
    say "no executable GPULEDGER_BIN ($GPULEDGER_BIN): no dcgm-exporter mapping file for ${uuids[*]}"
    return 0
  fi
  [[ $MIG_MAP_TIMEOUT =~ ^[0-9]+$ ]] || MIG_MAP_TIMEOUT=10
  local out
  out=$(timeout -k 2 "$MIG_MAP_TIMEOUT" "$GPULEDGER_BIN" agent mig-map -- "${uuids[@]}")
  rc=$?
  if ((rc == 124 || rc == 137)); then
    say "$GPULEDGER_BIN agent mig-map timed out after $MIG_MAP_TIMEOUT s"
  elif ((rc == 126 || rc == 127)); then
    say "cannot run $GPULEDGER_BIN agent mig-map (exit $rc)"
  fi
  while read -r uuid name; do
    if [[ -n ${asked[$uuid]:-} && $name =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
      printf '%s\n' "$name"
      named[$uuid]=1
    fi
  done <<<"$out"
  for uuid in "${uuids[@]}"; do
    [[ -n ${named[$uuid]:-} ]] || say "$uuid not resolved to a GPU index: no dcgm-exporter mapping file for it"
  done
}

# dcgm-exporter's --hpc-job-mapping-dir: a file per GPU (or MIG slice), the job id alone on its line.
write_dcgm() {
  local job=$1 name
  shift
  for name in "$@"; do
    put_line "$DCGM_DIR/$name" "$job" || say "cannot write $DCGM_DIR/$name"
  done
}

# Whether the dcgm-exporter directory is wanted and usable (said once when it is not).
dcgm_wanted() {
  [[ -n $DCGM_DIR ]] || return 1
  if [[ ${DCGM_DIR%/} == "${GPUSTAT_DIR%/}" ]]; then
    say "GPULEDGER_DCGM_JOB_MAP_DIR is the jobstats directory $GPUSTAT_DIR: nothing written for dcgm-exporter"
    return 1
  fi
  mkdir -p "$DCGM_DIR" || { say "cannot create $DCGM_DIR"; return 1; }
}

main() {
  local job="${SLURM_JOB_ID:-}" uid="${SLURM_JOB_UID:-}" gpu known_gpus=no
  local -a gpus=() dcgm=()
  [[ $job =~ ^[0-9]+$ ]] || { say "no numeric SLURM_JOB_ID: nothing written"; return 0; }
  [[ $uid =~ ^[0-9]+$ ]] || uid=""
  if [[ -n ${CUDA_VISIBLE_DEVICES:-}${SLURM_JOB_GPUS:-} ]]; then known_gpus=yes; fi
  mapfile -t gpus < <(job_gpus)
  # resolved before the lock: NVML may take seconds to start, and other jobs' prologs wait on it
  if dcgm_wanted; then mapfile -t dcgm < <(dcgm_names "${gpus[@]}"); fi
  mkdir -p "$GPUSTAT_DIR" "$JOB_DIR" || { say "cannot create $GPUSTAT_DIR or $JOB_DIR"; return 0; }
  exec 9>"$GPUSTAT_DIR/.lock"
  flock -w 10 9 || say "no lock on $GPUSTAT_DIR/.lock after 10 s: writing anyway"
  for gpu in "${gpus[@]}"; do
    put_line "$GPUSTAT_DIR/$gpu" "$job${uid:+ $uid}" || say "cannot write $GPUSTAT_DIR/$gpu"
  done
  write_dcgm "$job" "${dcgm[@]}"
  write_facts "$job" "$uid" "$(IFS=,; printf '%s' "${gpus[*]}")" "$known_gpus" || say "cannot write $JOB_DIR/$job.job"
}

main
exit 0
