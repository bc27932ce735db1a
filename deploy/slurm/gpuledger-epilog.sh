#!/bin/bash
# gpuledger's Slurm epilog: removes what gpuledger-prolog.sh wrote for this job — its line in
# every GPU mapping file (the file itself when no other job holds the GPU), in the jobstats
# directory and, when GPULEDGER_DCGM_JOB_MAP_DIR is set, in dcgm-exporter's; and its facts file.
# Install next to the prolog (slurm.conf: Epilog=/etc/slurm/epilog.d/*; docs/AGENT.md, "Slurm").
# Every mapping file is looked at, not only the job's GPUs: a file the prolog wrote is removed
# even when the epilog's environment names the GPUs differently.
#
# It always exits 0: an epilog that fails drains the node.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
umask 022
GPUSTAT_DIR="${GPULEDGER_GPUSTAT_DIR:-/run/gpustat}"
JOB_DIR="${GPULEDGER_SLURM_JOB_DIR:-/run/gpuledger/slurm}"
DCGM_DIR="${GPULEDGER_DCGM_JOB_MAP_DIR:-}"

say() { printf 'gpuledger epilog: %s\n' "$*" >&2; }

# Drop the job's lines from $1; remove the file when no line is left (atomically replaced).
drop_job() {
  local file=$1 job=$2 tmp
  grep -q -E "^${job}([[:space:]]|\$)" "$file" 2>/dev/null || return 0
  tmp=$(mktemp "${file%/*}/.gpuledger.XXXXXX") || return 1
  grep -v -E "^${job}([[:space:]]|\$)" "$file" >"$tmp" || true
  if grep -q '[^[:space:]]' "$tmp"; then
    if ! { chmod 0644 "$tmp" && mv -f "$tmp" "$file"; }; then
      rm -f "$tmp"
      return 1
    fi
  else
    rm -f "$tmp" "$file"
  fi
}

main() {
  local job="${SLURM_JOB_ID:-}" file dir
  [[ $job =~ ^[0-9]+$ ]] || { say "no numeric SLURM_JOB_ID: nothing removed"; return 0; }
  rm -f "$JOB_DIR/$job.job"
  [[ -d $GPUSTAT_DIR ]] || return 0
  exec 9>"$GPUSTAT_DIR/.lock"
  flock -w 10 9 || say "no lock on $GPUSTAT_DIR/.lock after 10 s: removing anyway"
  for dir in "$GPUSTAT_DIR" ${DCGM_DIR:+"$DCGM_DIR"}; do
    [[ -d $dir ]] || continue
    for file in "$dir"/*; do
      [[ -f $file ]] || continue
      drop_job "$file" "$job" || say "cannot rewrite $file"
    done
  done
}

main
exit 0
