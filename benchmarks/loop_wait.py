"""CPU of one wake-up of the recorder's loop: ``threading.Event.wait`` against one ``select`` on a pipe.

    python benchmarks/loop_wait.py [--waits 200] [--wait-ms 20] [--rounds 5]

The recorder's thread sleeps between ticks and is woken early only by ``stop()`` (or a control
message). Each wake-up costs its thread some CPU: the Python around the wait and the kernel's
timer and scheduler work. This times, with the thread's CPU clock, ``--waits`` timed-out waits of
``--wait-ms`` each, for the two ways of waiting the recorder has had, in turn, round after round,
while a second thread keeps the other core busy (as a training does), and prints the median of the
rounds. Both wait the same wall time; only the CPU spent per wake-up differs.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import sys
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine_line


def cpu_per_wait_us(wait: Callable[[], object], n: int) -> float:
    start = time.thread_time_ns()
    for _ in range(n):
        wait()
    return (time.thread_time_ns() - start) / n / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waits", type=int, default=200, help="timed-out waits per round and way (default 200)")
    ap.add_argument("--wait-ms", type=float, default=20.0, help="each wait's timeout, ms (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    args = ap.parse_args()
    timeout = args.wait_ms / 1000

    stop = threading.Event()
    read_fd, write_fd = os.pipe()

    def busy() -> None:  # the other core is not idle while a run trains
        while not stop.is_set():
            sum(range(10_000))

    threading.Thread(target=busy, daemon=True).start()
    ways = {
        "Event.wait (before)": lambda: stop.wait(timeout),
        "select on a pipe (now)": lambda: select.select([read_fd], [], [], timeout),
    }
    results: dict[str, list[float]] = {name: [] for name in ways}
    print(machine_line())
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            results[name].append(cpu_per_wait_us(ways[name], args.waits))
    stop.set()
    os.close(read_fd)
    os.close(write_fd)
    print(f"CPU per wake-up, µs (median of {args.rounds} rounds x {args.waits} waits of {args.wait_ms:g} ms)")
    for name, values in results.items():
        print(f"  {name:24s} {statistics.median(values):7.1f}   rounds: {', '.join(f'{v:.1f}' for v in values)}")
    before, now = (statistics.median(v) for v in results.values())
    print(f"ratio now / before: {now / before:.2f}")


if __name__ == "__main__":
    main()
