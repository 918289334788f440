"""How late a thread runs after it wakes while CPU-bound threads hold every core: what bounds a
shed answer of `stair-es serve` on a small shared machine.

A 429 of the door costs the event loop a tenth of a millisecond, but the loop's thread sleeps
in ``epoll_wait`` between requests, and when a request arrives while the search threads (or
other processes) run on every core, it must wait to be scheduled. This measures that wait
without any server: one thread sleeps 2 ms again and again and records how late it wakes, while
``--busy`` processes spin (each ``NICE`` or ``NICE:SLICE_US``, a custom EEVDF slice, with
``/idle`` or ``/batch`` for ``SCHED_IDLE`` or ``SCHED_BATCH``: what ``stair-es serve
--worker-policy`` gives its search threads; ``0`` alone is another job at nice 0), with the
sleeping thread as an ordinary one, at a lower nice value, with a short custom slice
(``sched_setattr``, Linux 6.12+), or in ``SCHED_FIFO`` (what ``stair-es serve --loop-realtime``
does to its event loop). The modes take turns in ``--rounds`` rounds.

    python -m benchmarks.serve_wake --busy 5,5 --busy 0,0,5,5
    python -m benchmarks.serve_wake --modes ordinary --busy 5,5 --busy 5/idle,5/idle --busy 5,5,0 --busy 5/idle,5/idle,0

Negative nice values and ``SCHED_FIFO`` need root or ``CAP_SYS_NICE``: a mode the kernel refuses
is reported and skipped. Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import subprocess
import sys
import threading
import time

import numpy as np

from benchmarks.common import git_commit

_SYS_SCHED_SETATTR = 314  # x86_64
_BUSY = ("import os, sys\nsys.path.insert(0, {root!r})\nfrom benchmarks.serve_wake import set_slice\n"
         "os.nice({nice})\nset_slice({slice_us})\n"
         "if {policy!r}:\n    os.sched_setscheduler(0, getattr(os, 'SCHED_' + {policy!r}.upper()), os.sched_param(0))\n"
         "while True:\n    pass\n")
MODES = ("ordinary", "nice -5", "nice -10", "slice 0.1 ms", "SCHED_FIFO 1")


def set_slice(us: int) -> bool:
    """This thread's EEVDF slice (``sched_attr.sched_runtime`` of a SCHED_OTHER thread), 0: the
    kernel's default. False where the kernel refuses or has no such call."""
    if sys.platform != "linux":
        return False
    nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 48, 0, 0, nice, 0, int(us) * 1000, 0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_SCHED_SETATTR, 0, attr, 0) == 0


def set_mode(mode: str) -> bool:
    tid = threading.get_native_id()
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, tid, 0)
    set_slice(0)
    try:
        if mode.startswith("nice"):
            os.setpriority(os.PRIO_PROCESS, tid, int(mode.split()[1]))
        elif mode.startswith("slice"):
            return set_slice(100)
        elif mode.startswith("SCHED_FIFO"):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        return False
    return True


_WAKER = ("import os, struct, time\nfd = {fd}\nwhile True:\n    time.sleep({sleep_s!r})\n"
          "    os.write(fd, struct.pack('d', time.perf_counter()))\n")


def lateness_ms(n: int, sleep_s: float, pipe: int | None = None) -> np.ndarray:
    """How late the calling thread runs: after its own timer (``time.sleep``), or with ``pipe``, after a
    byte from another process (the waker stamps each write with ``perf_counter``, one clock machine-wide):
    the way a request from the load generator wakes the server's event loop, on the waker's CPU."""
    late = np.empty(n)
    if pipe is not None:
        for i in range(n):
            (sent,) = struct.unpack("d", os.read(pipe, 8))
            late[i] = (time.perf_counter() - sent) * 1000
        return late
    for i in range(n):
        t = time.perf_counter()
        time.sleep(sleep_s)
        late[i] = (time.perf_counter() - t - sleep_s) * 1000
    return late


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", action="append", default=None,
                    help="Spinning processes, comma-separated, each NICE or NICE:SLICE_US (repeatable: one table row "
                         "group each; default 5,5: two search threads at --worker-nice 5).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wakes", type=int, default=1000, help="Sleeps per mode and round.")
    ap.add_argument("--sleep-ms", type=float, default=2.0)
    ap.add_argument("--waker", choices=("timer", "process"), default="timer",
                    help="What wakes the sleeping thread: its own timer, or another process writing to a pipe every "
                         "--sleep-ms (as the load generator's requests wake the event loop; default: timer).")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"The sleeping thread's modes, comma-separated (default: all of {', '.join(MODES)}).")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"# wake-up lateness: commit {git_commit()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, kernel {os.uname().release}, "
          f"{args.wakes} sleeps of {args.sleep_ms:g} ms per mode and round, {args.rounds} rounds, woken by "
          f"{'its own timer' if args.waker == 'timer' else 'another process through a pipe'}", flush=True)
    print()
    print("| busy processes (nice[:slice us]) | sleeping thread | p50 ms | p99 ms | p99.9 ms | max ms | p99 per round |")
    print("|---|---|---:|---:|---:|---:|---|")
    modes = [m.strip() for m in args.modes.split(",") if m.strip() in MODES]
    for spec in args.busy or ["5,5"]:
        procs = []
        for item in spec.split(","):
            item, _, policy = item.partition("/")
            if policy not in ("", "idle", "batch"):
                raise SystemExit(f"--busy {spec}: the policy after / is idle or batch, not {policy!r}")
            nice, _, slice_us = item.partition(":")
            procs.append(subprocess.Popen([sys.executable, "-c", _BUSY.format(
                root=root, nice=int(nice), slice_us=int(slice_us or 0), policy=policy)]))
        got: dict[str, list[np.ndarray]] = {m: [] for m in modes}
        refused: set[str] = set()
        try:
            time.sleep(0.3)
            for _ in range(args.rounds):
                for mode in modes:
                    if mode in refused:
                        continue
                    if not set_mode(mode):
                        refused.add(mode)
                        continue
                    if args.waker == "process":
                        r, w = os.pipe()
                        waker = subprocess.Popen([sys.executable, "-c", _WAKER.format(fd=w, sleep_s=args.sleep_ms / 1000)],
                                                 pass_fds=(w,))
                        os.close(w)
                        try:
                            got[mode].append(lateness_ms(args.wakes, 0, pipe=r)[5:])  # the waker's start left out
                        finally:
                            waker.kill()
                            waker.wait()
                            os.close(r)
                    else:
                        got[mode].append(lateness_ms(args.wakes, args.sleep_ms / 1000))
        finally:
            set_mode("ordinary")
            for p in procs:
                p.kill()
                p.wait()
        for mode in modes:
            if mode in refused or not got[mode]:
                print(f"| {spec} | {mode} | refused by the kernel (root or CAP_SYS_NICE needed) | | | | |")
                continue
            a = np.concatenate(got[mode])
            per = " ".join(f"{np.percentile(x, 99):.2f}" for x in got[mode])
            print(f"| {spec} | {mode} | {np.percentile(a, 50):.3f} | {np.percentile(a, 99):.2f} | "
                  f"{np.percentile(a, 99.9):.2f} | {a.max():.2f} | {per} |", flush=True)


if __name__ == "__main__":
    main()
