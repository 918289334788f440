"""Each slow door 429 of `stair-es serve` split by what the server's event-loop thread did meanwhile.

Under open-loop overload the server refuses excess searches at the door (429, before the body is
read). Most come back within a millisecond; the slowest take several. This says where such an
answer waited: one server (``--debug-stats``, which stamps each door 429 with
``Server-Timing: shed;desc="T_RECV T_SEND"``), one open-loop run (the generator of
``benchmarks.serve_load``, another process), and beside them a sampler, a third process, that
reads the event-loop thread's ``/proc/PID/task/TID/schedstat`` (ns it ran, ns it waited for a
core) and ``/proc/PID/task/TID/syscall`` (the system call it sleeps in: futex is the GIL or a
lock, epoll_wait is the loop with nothing to do; "running" is on a core or waiting for one)
every ``--period-ms``, with ``time.perf_counter()`` timestamps. Every process here reads the
same clock (CLOCK_MONOTONIC), so each 429's stamps and the samples line up.

For each door 429 it splits the time from its due time: due -> sent (the generator's lateness),
sent -> written (a new connection's connect), ``to_loop`` (written -> the loop handing uvicorn
the bytes), ``in_server`` (-> the 429 written), ``back`` (-> the generator's last byte). Over
``to_loop`` it reports what the loop's thread did: ran, waited for a core (run-delay growth),
slept (the rest), the search threads' run time, and the loop thread's sampled system calls by
number. Means over the 429s slower than ``--threshold-ms`` from due, over those slower than it
from their write (the generator's own lateness left out) and over all door 429s, the slowest
five one by one, the machine's other load, and a JSON line of the same.

    python -m benchmarks.serve_loopsample --home /work/scratch/serve11 --rate 940 --seconds 20
    python -m benchmarks.serve_loopsample --rate 940 --hog 1 --server-args=--loop-realtime

The sampler is not free: about 0.4 ms apart it takes a share of a core (printed), and the
counters have their own grain: ``schedstat``'s run time of a thread that is on a core is brought
up to date at the scheduler's tick or switch, and its run delay grows by a whole wait when the
wait ends. A window's growth is read between the first samples at or after its start and its
end (so the wait that ends as the loop takes the bytes is in it, and a wait that began before
the window counts whole): a window's figures are good to about one sample period at each end,
and a mean over many windows is better than any one of them.

It owns the sampler and the split; the server start, the generator and the summaries are
``serve_load``'s and ``serve_stats``'s. It knows nothing of the server's code, only what Linux
shows of its threads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import git_commit
from benchmarks.corpora import CACHE_DIR
from benchmarks.serve_load import (
    GENERATOR,
    build_index,
    query_maps,
    run_generator,
    start_hogs,
    start_server,
    stop_hogs,
    stop_servers,
)
from benchmarks.serve_stats import (
    debug_stats,
    print_machine,
    print_shed_split,
    summarize_open,
)

#: System call numbers of the calls that matter here (``/proc/PID/task/TID/syscall``'s first field).
SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 20: "writev", 35: "nanosleep", 44: "sendto", 45: "recvfrom",
               46: "sendmsg", 47: "recvmsg", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
               270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4", 441: "epoll_pwait2"},
    "aarch64": {22: "epoll_pwait", 63: "read", 64: "write", 66: "writev", 73: "ppoll", 98: "futex",
                101: "nanosleep", 115: "clock_nanosleep", 202: "accept4", 206: "sendto", 207: "recvfrom",
                211: "sendmsg", 212: "recvmsg", 441: "epoll_pwait2"},
}
RUNNING, NOT_IN_CALL, GONE = -2, -1, -3  # the sampler's codes for "running", "-1 sp pc" and a failed read


def syscall_name(code: int) -> str:
    if code == RUNNING:
        return "running"
    if code == NOT_IN_CALL:
        return "blocked outside a call"
    return SYSCALLS.get(os.uname().machine, {}).get(code, f"syscall {code}")


def category(name: str) -> str:
    """futex / epoll_wait / running / other (a system call's name as :func:`syscall_name` gives it): the report's columns."""
    return "epoll_wait" if name.startswith("epoll_") else name if name in ("futex", "running") else "other"


# --- the sampler (its own process) ---------------------------------------------------------------
def sampler_main(argv: list[str]) -> None:
    """``--sample PID TID,TID,... PERIOD_MS MAX_SECONDS OUT.npz``: reads the first thread's
    ``schedstat`` and ``syscall`` and the others' ``schedstat`` every PERIOD_MS until SIGUSR1 or
    MAX_SECONDS, keeps them in memory, then writes them out."""
    import ctypes
    import resource

    pid, tids, period_ms, max_s, out = argv
    tids = [int(t) for t in tids.split(",")]
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
    try:  # PR_SET_TIMERSLACK 1 ns: the sleeps below end when asked, not up to 50 us later
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    sched = [os.open(f"/proc/{pid}/task/{t}/schedstat", os.O_RDONLY) for t in tids]
    sysfd = os.open(f"/proc/{pid}/task/{tids[0]}/syscall", os.O_RDONLY)
    ts: list[float] = []
    runs: list[list[int]] = []
    calls: list[int] = []
    period, clock = float(period_ms) / 1000, time.perf_counter
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = clock()
    end, nxt = t0 + float(max_s), t0
    print("ready", flush=True)
    why = "stopped"
    while not stop:
        t = clock()
        if t > end:
            why = "reached its time limit"
            break
        try:
            row = [int(v) for fd in sched for v in os.pread(fd, 100, 0).split()[:2]]
        except OSError:
            why = "a thread was gone"
            break
        try:
            head = os.pread(sysfd, 100, 0).split(maxsplit=1)[0]
            code = RUNNING if head == b"running" else int(head)
        except (OSError, IndexError, ValueError):
            code = GONE
        ts.append(t)
        runs.append(row)
        calls.append(code)
        nxt = max(nxt + period, t)  # behind: go on from now instead of bunching up to catch up
        wait = nxt - clock()
        if wait > 0:
            time.sleep(wait)
    wall = clock() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    np.savez(out, t=np.array(ts), sched=np.array(runs, dtype=np.int64).reshape(len(ts), 2 * len(tids)),
             calls=np.array(calls, dtype=np.int32), cpu_s=cpu, wall_s=wall, why=why)


def start_sampler(pid: int, tids: list[int], period_ms: float, max_s: float, out: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.serve_loopsample", "--sample", str(pid),
                          ",".join(map(str, tids)), str(period_ms), str(max_s), str(out)],
                         stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise SystemExit(f"the sampler did not start (status {p.wait()}); run it alone to see why: {' '.join(p.args)}")
    return p


def stop_sampler(p: subprocess.Popen, out: Path) -> dict:
    p.send_signal(signal.SIGUSR1)
    if p.wait(120) != 0:
        raise SystemExit(f"the sampler failed with status {p.returncode}")
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


# --- the server's threads --------------------------------------------------------------------------
def thread_table(pid: int) -> dict[int, dict]:
    """Each thread of ``pid``: its name (``comm``), nice value and CPU seconds so far."""
    out = {}
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        out[tid] = {"comm": comm, "nice": int(f[16]), "cpu_s": (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")}
    return out


def idle_calls(pid: int, tid: int, n: int = 20) -> dict[str, int]:
    """What thread ``tid`` is in, read ``n`` times 5 ms apart (the server idle: an event loop sleeps in epoll_wait)."""
    seen: dict[str, int] = {}
    for _ in range(n):
        try:
            head = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split(maxsplit=1)[0]
            name = syscall_name(RUNNING if head == "running" else int(head))
        except (OSError, IndexError, ValueError):
            name = "unreadable"
        seen[name] = seen.get(name, 0) + 1
        time.sleep(0.005)
    return seen


def search_threads(before: dict[int, dict], after: dict[int, dict], pid: int, workers: int) -> tuple[list[int], str]:
    """The search threads: named ``stair-es-search*`` where the OS names Python's threads (Python 3.14+),
    else the ``workers`` threads other than the loop's, niced below it, that used the most CPU in the warm-up."""
    named = [t for t, v in after.items() if v["comm"].startswith("stair-es-search")]
    if named:
        return named, "by name"
    grew = {t: v["cpu_s"] - before.get(t, {"cpu_s": 0.0})["cpu_s"] for t, v in after.items()
            if t != pid and v["nice"] > after[pid]["nice"]}
    top = sorted((t for t, g in grew.items() if g > 0), key=lambda t: -grew[t])[:workers]
    return sorted(top), (f"not named by the OS (all '{after[pid]['comm']}'): the {len(top)} threads niced below the "
                         "loop's that used the most CPU in the warm-up (" +
                         ", ".join(f"{t}: {grew[t]:.2f} s" for t in sorted(top)) + ")")


# --- the split -----------------------------------------------------------------------------------
def split_door(res: list, s: dict) -> list[dict]:
    """Each door 429 (one with the ``shed;desc`` stamps) split as the module's docstring says."""
    ts, sched, calls = s["t"], s["sched"] / 1e6, s["calls"]  # ms
    rows = []
    for x in res:
        if x[0] != 429 or len(x) < 7 or 'shed;desc="' not in x[3]:
            continue
        t_recv, t_send = (float(v) for v in x[3].split('shed;desc="', 1)[1].split('"', 1)[0].split())
        due, t_write, t_done = x[4], x[5], x[6]
        r = {"due": due, "from_due": x[1], "late": x[2], "connect": (t_write - due) * 1000 - x[2],
             "to_loop": (t_recv - t_write) * 1000, "in_server": (t_send - t_recv) * 1000,
             "back": (t_done - t_send) * 1000, "loop_ran": None, "loop_waited": None, "loop_slept": None,
             "search_ran": None, "calls": {}}
        a, b = np.searchsorted(ts, [t_write, t_recv])  # the first samples at or after each
        if len(ts) > 1 and ts[0] <= t_write and b < len(ts):
            # not interpolated: run delay grows when a wait ends, and the wait that ends as the loop takes the
            # bytes ends just before T_RECV, so the sample after T_RECV holds it and the one before does not
            d = sched[b] - sched[a]
            r.update(loop_ran=float(d[0]), loop_waited=float(d[1]), loop_slept=r["to_loop"] - float(d[0] + d[1]),
                     search_ran=float(d[2::2].sum()))
            for c in calls[a:b]:
                r["calls"][syscall_name(int(c))] = r["calls"].get(syscall_name(int(c)), 0) + 1
        rows.append(r)
    return rows


COLS = ("from_due", "late", "connect", "to_loop", "in_server", "back", "loop_ran", "loop_waited", "loop_slept",
        "search_ran")
SHARES = ("futex", "epoll_wait", "running", "other")


def pooled(rows: list[dict]) -> dict:
    """Means of :data:`COLS` over ``rows`` (the sampled ones for the thread figures), and the loop
    thread's samples during their ``to_loop`` windows by category, pooled (by number of samples)."""
    out: dict = {"n": len(rows), "sampled": sum(r["loop_ran"] is not None for r in rows)}
    for c in COLS:
        v = [r[c] for r in rows if r[c] is not None]
        out[c] = float(np.mean(v)) if v else None
    calls: dict[str, int] = {}
    for r in rows:
        for k, v in r["calls"].items():
            calls[k] = calls.get(k, 0) + v
    out.update(shares(calls))
    out["other_calls"] = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if category(k) == "other"}
    return out


def shares(calls: dict[str, int]) -> dict:
    """Samples by system call -> their number and the % in each of :data:`SHARES` (None without samples)."""
    n = sum(calls.values())
    return {"samples": n, **{f"{c}_pct": (100 * sum(v for k, v in calls.items() if category(k) == c) / n
                                          if n else None) for c in SHARES}}


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_split(head: list[tuple[str, dict]], slowest: list[dict], threshold: float) -> None:
    print("Door 429s split (ms): from due = due -> the generator's last byte; late = due -> sent (the generator); "
          "connect = sent -> written (a new connection); to_loop = written -> the server's event loop handing uvicorn "
          "the bytes; in_server = -> the 429 written; back = -> the generator's last byte. During to_loop, the loop's "
          "thread: ran, waited for a core (run-delay growth), slept (the rest: in a futex, in epoll_wait, ...); the "
          "search threads' run time added up; the loop thread's samples in to_loop by system call (% of them)")
    print()
    cols = ("from due", "late", "connect", "to_loop", "in_server", "back", "loop ran", "loop waited for a core",
            "loop slept", "search threads ran", "samples", "futex %", "epoll_wait %", "running %", "other %")
    print("| door 429s | n | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for label, p in head + [(f"#{i + 1} slowest", {**r, "n": 1, **shares(r["calls"])}) for i, r in enumerate(slowest)]:
        pct = " | ".join("-" if p.get(f"{c}_pct") is None else f"{p[f'{c}_pct']:.0f}" for c in SHARES)
        print(f"| {label} | {p['n']} | " + " | ".join(_ms(p[c]) for c in COLS) + f" | {p.get('samples', 0)} | {pct} |")
    print()
    for label, p in head:
        if p.get("other_calls"):
            print(f"- {label}, 'other' samples: " + ", ".join(f"{k} {v}" for k, v in p["other_calls"].items()))
    print("- loop slept = to_loop - ran - waited; below 0 where a wait for a core or a run that began before the "
          "window is counted whole (both counters grow when the stretch ends)")
    print(f"- {threshold:g} ms is --threshold-ms; from written = to_loop + in_server + back (the generator's lateness "
          "and connects left out); a 429 whose to_loop the sampler did not cover counts in n, not in the thread columns")
    print()


def whole_run(s: dict) -> str:
    """The loop thread over the sampled time, and how well the sampler kept its period."""
    ts, sched, calls = s["t"], s["sched"], s["calls"]
    if len(ts) < 2:
        return f"# the sampler took {len(ts)} sample(s) ({s['why']}): nothing to say of the loop's thread"
    dur = ts[-1] - ts[0]
    gaps = np.diff(ts) * 1000
    states: dict[str, int] = {}
    for c in calls:
        states[syscall_name(int(c))] = states.get(syscall_name(int(c)), 0) + 1
    top = ", ".join(f"{k} {100 * v / len(calls):.1f} %" for k, v in sorted(states.items(), key=lambda kv: -kv[1])[:6])
    search = ", ".join(f"{(sched[-1, j] - sched[0, j]) / 1e9 / dur * 100:.0f} %" for j in range(2, sched.shape[1], 2))
    return (f"# sampler: {len(ts)} samples over {dur:.1f} s, period p50 {np.median(gaps):.3f} ms, p99 "
            f"{np.percentile(gaps, 99):.3f} ms, longest gap {gaps.max():.2f} ms; its own CPU {float(s['cpu_s']):.2f} s "
            f"= {100 * float(s['cpu_s']) / float(s['wall_s']):.1f} % of a core; it {s['why']}\n"
            f"# the loop thread over that time: ran {(sched[-1, 0] - sched[0, 0]) / 1e9 / dur * 100:.1f} %, waited for "
            f"a core {(sched[-1, 1] - sched[0, 1]) / 1e9 / dur * 100:.1f} %; its samples: {top}; the search threads "
            f"ran {search or '-'} of the time")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sample":
        return sampler_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--home", type=Path, default=Path(CACHE_DIR) / "serve_load")
    ap.add_argument("--rate", type=float, default=940.0, help="Arrival rate (searches/s, Poisson).")
    ap.add_argument("--seconds", type=float, default=20.0, help="Load time, all sampled.")
    ap.add_argument("--threshold-ms", type=float, default=5.0, help="A door 429 slower than this from due is slow.")
    ap.add_argument("--period-ms", type=float, default=0.4, help="The sampler's period.")
    ap.add_argument("--warm-seconds", type=float, default=4.0, help="Load before, not counted (starts the search threads).")
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="stair-es serve --workers.")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--server-args", default="", help="More stair-es serve options (--debug-stats is always on); "
                                                "one that starts with -- goes after '=': --server-args=--loop-realtime")
    ap.add_argument("--hog", type=int, default=0, help="Processes that spin at nice --hog-nice throughout, as another "
                                                       "job taking a core (default 0: none; counted in 'others').")
    ap.add_argument("--hog-nice", type=int, default=0)
    ap.add_argument("--generator-realtime", action="store_true",
                    help="Run the load generator in SCHED_FIFO 1 (root or CAP_SYS_NICE; see serve_load).")
    ap.add_argument("--json", type=Path, help="Also write every door 429's split here.")
    args = ap.parse_args()
    GENERATOR.update(realtime=args.generator_realtime)
    name = f"load-{args.docs}"
    corpus = build_index(args.home, name, args.docs)
    work = Path(tempfile.mkdtemp(prefix="stair-serve-loopsample-"))
    qfile = work / "queries.json"
    qfile.write_text(json.dumps(query_maps(corpus, 1000)))
    print(f"# stair-es serve, door 429s against the event loop's thread: commit {git_commit()}, {os.cpu_count()} cores, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.docs:,} docs, {args.rate:g} searches/s "
          f"offered for {args.seconds:g} s (after {args.warm_seconds:g} s not counted), --max-queue {args.max_queue}, "
          f"--workers {args.workers}, --debug-stats {args.server_args}, sampled every {args.period_ms:g} ms"
          f"{', the generator in SCHED_FIFO 1' if args.generator_realtime else ''}"
          f"{f', {args.hog} busy-looping process(es) at nice {args.hog_nice} throughout' if args.hog else ''}", flush=True)
    proc, url = start_server(args.home, name, args.workers, "auto", None, 0.0, max_queue=args.max_queue,
                             extra=["--debug-stats", *args.server_args.split()])
    servers = {"server": (proc, url)}
    hogs = start_hogs(args.hog, args.hog_nice, limit_s=args.warm_seconds + args.seconds + 120)
    try:
        pid = proc.pid
        idle = idle_calls(pid, pid)
        before = thread_table(pid)
        run_generator(f"open:{args.rate}", url, qfile, args.warm_seconds, args.top_k, 7, pid)
        after = thread_table(pid)
        search, how = search_threads(before, after, pid, args.workers)
        print(f"# the event loop's thread: {pid} (the main thread, '{after[pid]['comm']}', nice {after[pid]['nice']}); "
              f"idle before the load it was in: {', '.join(f'{k} {v}x' for k, v in idle.items())}; in the warm-up it "
              f"used {after[pid]['cpu_s'] - before[pid]['cpu_s']:.2f} s of CPU", flush=True)
        print(f"# search threads {search} (nice {', '.join(str(after[t]['nice']) for t in search)}), {how}; "
              f"{len(after)} threads in all", flush=True)
        if not any(k.startswith("epoll_") for k in idle):
            print("# NOTE: the main thread was never seen in epoll_wait while idle: it may not run the event loop",
                  flush=True)
        debug_stats(url, reset=True)
        sampler = start_sampler(pid, [pid, *search], args.period_ms, args.seconds + 300, work / "samples.npz")
        try:
            r = run_generator(f"open:{args.rate}", url, qfile, args.seconds, args.top_k, 11, pid)
        finally:
            s = stop_sampler(sampler, work / "samples.npz")
        st = debug_stats(url)
    finally:
        stop_hogs(hogs)
        stop_servers(servers)
        shutil.rmtree(work, ignore_errors=True)  # the queries and the samples (what matters of them is printed)
    row = {"run": f"{args.rate:g}/s", **summarize_open(args.rate, r, args.seconds, None)}
    doors = split_door(r["results"], s)
    slow = [d for d in doors if d["from_due"] > args.threshold_ms]
    # the same without the generator's own lateness and connects: the server's part and the way back
    slow_w = [d for d in doors if d["to_loop"] + d["in_server"] + d["back"] > args.threshold_ms]
    head = [(f"slower than {args.threshold_ms:g} ms from due", pooled(slow)),
            (f"slower than {args.threshold_ms:g} ms from written", pooled(slow_w)), ("all door 429s", pooled(doors))]
    slowest = sorted(doors, key=lambda d: -d["from_due"])[:5]
    print(whole_run(s))
    print(f"# {row['sent']} sent, {row['qps']:.0f} answered/s, p50 / p99 {row['p50_ms']:.1f} / {row['p99_ms']:.1f} ms; "
          f"429 {row['shed_pct']:.1f} % (at the door {row['shed_door_pct']:.1f} %, door p50 / p99 / max "
          f"{row['shed_door_p50_ms']:.2f} / {row['shed_door_p99_ms']:.2f} / {row['shed_door_max_ms']:.2f} ms); "
          f"{len(doors)} door 429s with stamps; other statuses: {row['errors'] or 'none'}", flush=True)
    if st is not None:
        print(json.dumps({"debug_stats": {k: st.get(k) for k in ("gc", "loop_lag", "shed", "shed_from_queue")}}))
    print(json.dumps({"rate": args.rate, "seconds": args.seconds, "threshold_ms": args.threshold_ms,
                      "search_threads": how, "split": dict(head), "slowest": slowest}))
    if args.json:
        args.json.write_text(json.dumps({"rate": args.rate, "door_429s": doors}))
    print()
    print_split(head, slowest, args.threshold_ms)
    print_shed_split([row], lambda x: x["run"], "run")
    print_machine([row], "run")


if __name__ == "__main__":
    main()
