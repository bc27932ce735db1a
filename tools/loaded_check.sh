#!/usr/bin/env bash
# The timing-sensitive tests under load: two CPU burners (one per core on a 2-core CI runner) run
# beside pytest, so a test that sleeps for a guessed time instead of waiting for its condition
# fails here rather than on a busy machine. Usage: tools/loaded_check.sh [pytest args/files ...]
# (default: the process-tree collector and the `gpuledger run` end-to-end tests).
set -euo pipefail
cd "$(dirname "$0")/.."

burners=()
stop_burners() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${burners[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_burners EXIT

for _ in $(seq "${BURNERS:-2}"); do
  python -c "while True: pass" &
  burners+=("$!")
done

if [ "$#" -eq 0 ]; then
  set -- tests/test_host_collector.py tests/test_e2e_run.py
fi
python -m pytest -q -p no:cacheprovider "$@"
