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
#                            for its --hpc-job-mapping-dir, a job id a line, files named by the GPU
#                            index only (a MIG UUID or GPU- UUID is not an index and gets no file)
#
# It always exits 0: a prolog that fails drains the node and requeues the job, and metering is
# not worth that. Slurm gives prologs no PATH, hence the one below.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
umask 022
GPUSTAT_DIR="${GPULEDGER_GPUSTAT_DIR:-/run/gpustat}"
JOB_DIR="${GPULEDGER_SLURM_JOB_DIR:-/run/gpuledger/slurm}"
DCGM_DIR="${GPULEDGER_DCGM_JOB_MAP_DIR:-}"  # off unless set, e.g. /run/dcgm-job-map

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

# dcgm-exporter's --hpc-job-mapping-dir: a file per GPU index, the job id alone on its line.
write_dcgm() {
  local job=$1 gpu
  shift
  [[ -n $DCGM_DIR ]] || return 0
  if [[ ${DCGM_DIR%/} == "${GPUSTAT_DIR%/}" ]]; then
    say "GPULEDGER_DCGM_JOB_MAP_DIR is the jobstats directory $GPUSTAT_DIR: nothing written for dcgm-exporter"
    return 0
  fi
  mkdir -p "$DCGM_DIR" || { say "cannot create $DCGM_DIR"; return 0; }
  for gpu in "$@"; do
    if [[ $gpu =~ ^[0-9]+$ ]]; then
      put_line "$DCGM_DIR/$gpu" "$job" || say "cannot write $DCGM_DIR/$gpu"
    else
      say "$gpu is no GPU index: no dcgm-exporter mapping file for it"
    fi
  done
}

main() {
  local job="${SLURM_JOB_ID:-}" uid="${SLURM_JOB_UID:-}" gpu known_gpus=no
  local -a gpus=()
  [[ $job =~ ^[0-9]+$ ]] || { say "no numeric SLURM_JOB_ID: nothing written"; return 0; }
  [[ $uid =~ ^[0-9]+$ ]] || uid=""
  if [[ -n ${CUDA_VISIBLE_DEVICES:-}${SLURM_JOB_GPUS:-} ]]; then known_gpus=yes; fi
  mapfile -t gpus < <(job_gpus)
  mkdir -p "$GPUSTAT_DIR" "$JOB_DIR" || { say "cannot create $GPUSTAT_DIR or $JOB_DIR"; return 0; }
  exec 9>"$GPUSTAT_DIR/.lock"
  flock -w 10 9 || say "no lock on $GPUSTAT_DIR/.lock after 10 s: writing anyway"
  for gpu in "${gpus[@]}"; do
    put_line "$GPUSTAT_DIR/$gpu" "$job${uid:+ $uid}" || say "cannot write $GPUSTAT_DIR/$gpu"
  done
  write_dcgm "$job" "${gpus[@]}"
  write_facts "$job" "$uid" "$(IFS=,; printf '%s' "${gpus[*]}")" "$known_gpus" || say "cannot write $JOB_DIR/$job.job"
}

main
exit 0
