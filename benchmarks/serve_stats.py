"""What the serve benchmarks measure besides latency: the server's CPU (event loop and the
rest, from ``/proc``), what else the machine ran meanwhile (``/proc/stat``), the slowest 1 %
grouped into episodes, the phases of a request's time (``Server-Timing``), where the door's
429s spent theirs (``--debug-stats`` stamps), resident memory and the server's own
``/debug/stats``; and the summary of one open-loop rate (:func:`summarize_open`).

Used by ``benchmarks/serve_load.py`` and ``benchmarks/serve_ab.py``; it starts nothing and
sends nothing but the ``/debug/stats`` request.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from benchmarks.common import percentiles


def server_timing(value: bytes) -> dict[str, float]:
    """``queue;dur=0.12, prepare;dur=0.3;desc="batch of 4", ..., app;dur=6.1`` -> durations in ms (+ batch size)."""
    out: dict[str, float] = {}
    for part in value.decode().split(","):
        name, *params = [p.strip() for p in part.split(";")]
        for p in params:
            if p.startswith("dur="):
                out[name] = float(p[4:])
            elif p.startswith("desc=") and name == "prepare":  # desc="batch of N"
                out["batch_size"] = float(p[5:].strip('"').split()[-1])
    return out


def process_cpu(pid: int, tid: int | None = None) -> float | None:
    """CPU seconds (user + system, all threads) a process has used so far, or only its thread
    ``tid`` (the server's main thread, ``tid == pid``, runs the event loop); None where /proc is missing."""
    try:
        stat = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def debug_stats(url: str, reset: bool = False) -> dict | None:
    """``GET /debug/stats`` of a server started with ``--debug-stats`` (None otherwise)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/debug/stats" + ("?reset=true" if reset else ""), timeout=10) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def machine_busy_s() -> float | None:
    """CPU seconds all the machine's cores have been busy (not idle, not waiting for I/O) since boot."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def others_cores(samples: list[tuple[float, float, float]], t0: float, t1: float) -> tuple[float, float] | None:
    """Over the sampled interval [t0, t1] (perf_counter seconds): the cores the machine's processes
    but the server used (the generator included), and the server's cores."""
    inside = [x for x in samples if t0 <= x[0] <= t1]
    before = [x for x in samples if x[0] < t0]
    if before:
        inside = [before[-1]] + inside
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    dt = b[0] - a[0]
    if dt <= 0:
        return None
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / dt, (b[2] - a[2]) / dt


def tail_episodes(res: list, samples: list, gap_s: float = 1.0) -> list[dict]:
    """The slowest 1 % of the answered requests, grouped into episodes (due times less than
    ``gap_s`` apart), each with what the machine did meanwhile: were they one stall or spread out?"""
    ok = [(x[4], x[1]) for x in res if x[0] == 200 and len(x) > 4]
    if len(ok) < 100:
        return []
    slow = sorted(sorted(ok, key=lambda x: -x[1])[:max(1, len(ok) // 100)])  # the slowest 1 %, by due time
    groups: list[list[tuple[float, float]]] = [[slow[0]]]
    for due, ms in slow[1:]:
        if due - groups[-1][-1][0] < gap_s:
            groups[-1].append((due, ms))
        else:
            groups.append([(due, ms)])
    out = []
    for g in sorted(groups, key=len, reverse=True):
        start, end = g[0][0], max(d + ms / 1000 for d, ms in g)
        o = others_cores(samples, start - 0.25, end)
        before = others_cores(samples, start - 3.0, start - 0.25)
        out.append({"requests": len(g), "span_ms": (end - start) * 1000, "worst_ms": max(ms for _, ms in g),
                    "others_cores": o[0] if o else None, "server_cores": o[1] if o else None,
                    "others_cores_before": before[0] if before else None})
    return out


def add_cpu(acc: dict, r: dict) -> None:
    """Adds one slice's server CPU seconds (whole process, event-loop thread), the other
    processes' CPU seconds and the machine's samples to a pooled row."""
    for key in ("server_cpu_s", "server_loop_cpu_s"):
        acc[key] = None if acc.get(key) is None or r.get(key) is None else acc[key] + r[key]
    if r.get("slice_wall_s"):
        acc["others_cpu_s"] = acc.get("others_cpu_s", 0.0) + r["others_cpu_s"]
        acc["slice_wall_s"] = acc.get("slice_wall_s", 0.0) + r["slice_wall_s"]
    acc.setdefault("machine_samples", []).extend(r.get("machine_samples") or [])


def print_machine(rows: list[dict], label: str = "fraction") -> None:
    """The other processes' share of the cores per row, and the episodes of the slowest 1 %."""
    print()
    print("What else ran (cores used by the machine's other processes, the generator included, from /proc/stat), "
          "and the slowest 1 % of the answered requests grouped into episodes (due times < 1 s apart): "
          "how many, the largest three (requests, span ms, worst ms, other processes' cores during it / in the "
          "3 s before, the server's cores during it):")
    print()
    for r in rows:
        eps = r.get("tail_episodes") or []
        oc = r.get("others_cores")
        head = f"{r[label]:.2f}" if isinstance(r[label], float) else str(r[label])
        big = "; ".join(f"{e['requests']} req, {e['span_ms']:.0f} ms, worst {e['worst_ms']:.0f} ms, others "
                        f"{_f(e['others_cores'])} / {_f(e['others_cores_before'])}, server {_f(e['server_cores'])}"
                        for e in eps[:3])
        print(f"- {head} (rate {r['rate']:.0f}/s): others {_f(oc)} cores on average; {len(eps)} episodes: {big or '-'}")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def process_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


PHASES = ("pre", "queue", "prepare", "wait", "engine", "answer", "deliver")


def breakdown(res: list, tail_pct: float = 99.0) -> dict:
    """Where the answered requests' time went: per phase its p50 and p99 over all answered
    requests, and its mean over the slowest ``100 - tail_pct`` % of them (the tail), with
    ``outside`` = the client's time minus the server's (``pre`` + ``app``): the generator's
    lateness, the network, uvicorn's parsing and any event-loop delay before the app saw it."""
    rows = []
    for item in res:
        st, ms, late, timing = item[0], item[1], item[2], (item[3] if len(item) > 3 else "")
        if st != 200 or not timing:
            continue
        t = server_timing(timing.encode("latin-1"))
        if "app" not in t:
            continue
        t["total"] = ms
        t["late"] = late
        t["outside"] = ms - late - t.get("pre", 0.0) - t["app"]
        t["engine_wait"] = max(0.0, t.get("engine", 0.0) - t.get("engine_cpu", 0.0))
        t["answer_wait"] = max(0.0, t.get("answer", 0.0) - t.get("answer_cpu", 0.0))
        rows.append(t)
    if not rows:
        return {}
    names = ("late", "outside") + PHASES + ("engine_cpu", "engine_wait", "answer_cpu", "answer_wait", "total")
    totals = np.array([r["total"] for r in rows])
    cut = np.percentile(totals, tail_pct)
    tail = [r for r in rows if r["total"] >= cut]
    out = {}
    for k in names:
        v = np.array([r.get(k, 0.0) for r in rows])
        out[k] = {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                  "tail_mean": float(np.mean([r.get(k, 0.0) for r in tail]))}
    return out


def shed_split(res: list) -> dict | None:
    """Where the door's 429s spent their time, from the server's stamps (``--debug-stats``:
    ``Server-Timing: shed;desc="T_RECV T_SEND"``) and the generator's own write and receive times,
    all ``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for every process here): ``to_loop``
    from the generator's write to the server's event loop handing uvicorn the bytes (the kernel,
    and the loop's thread waking or finishing what it was doing), ``in_server`` from there to the
    429 written (uvicorn's parsing, the app's task being scheduled, the gates), ``back`` from
    there to the generator's last byte (the kernel, and the generator's loop waking or busy).
    p50 / p99 / max ms of each, and for the slowest 1 % the mean of each."""
    rows = []
    for x in res:
        if x[0] != 429 or len(x) < 7 or 'shed;desc="' not in x[3]:
            continue
        try:
            t_recv, t_send = (float(v) for v in x[3].split('shed;desc="', 1)[1].split('"', 1)[0].split())
        except ValueError:
            continue
        rows.append(((t_recv - x[5]) * 1000, (t_send - t_recv) * 1000, (x[6] - t_send) * 1000))
    if not rows:
        return None
    a = np.array(rows)
    total = a.sum(axis=1)
    slow = a[total >= np.percentile(total, 99)]
    out = {"n": len(rows)}
    for j, name in enumerate(("to_loop", "in_server", "back")):
        out[name] = {"p50": float(np.percentile(a[:, j], 50)), "p99": float(np.percentile(a[:, j], 99)),
                     "max": float(a[:, j].max()), "slowest_1pct_mean": float(slow[:, j].mean())}
    out["total"] = {"p50": float(np.percentile(total, 50)), "p99": float(np.percentile(total, 99)),
                    "max": float(total.max())}
    return out


def print_shed_split(rows: list[dict], label, head: str) -> None:
    """The table of :func:`shed_split` (rows of a server started with ``--debug-stats``), one line a row."""
    if not any(r.get("shed_split") for r in rows):
        return
    print("The door's 429s, from the generator's write to its last byte read (ms; --debug-stats stamps): "
          "to_loop = to the server's event loop, in_server = uvicorn + the gates, back = to the generator")
    print()
    print(f"| {head} | n | to_loop p50 / p99 / max | in_server p50 / p99 / max | back p50 / p99 / max | "
          "total p50 / p99 / max | slowest 1 %: to_loop / in_server / back |")
    print("|---|---:|---|---|---|---|---|")
    for r in rows:
        sp = r.get("shed_split")
        if not sp:
            continue
        cell = lambda k: f"{sp[k]['p50']:.2f} / {sp[k]['p99']:.2f} / {sp[k]['max']:.2f}"  # noqa: E731
        print(f"| {label(r)} | {sp['n']} | {cell('to_loop')} | {cell('in_server')} | {cell('back')} | {cell('total')} | "
              f"{sp['to_loop']['slowest_1pct_mean']:.2f} / {sp['in_server']['slowest_1pct_mean']:.2f} / "
              f"{sp['back']['slowest_1pct_mean']:.2f} |")
    print()


def summarize_open(rate: float, r: dict, seconds: float, rss_start: float | None) -> dict:
    res = r["results"]
    ok = [x[1] for x in res if x[0] == 200]
    shed = [x[1] for x in res if x[0] == 429]
    # 429s of searches that waited past --queue-timeout-ms carry their queue wait; the door's carry nothing
    shed_queue = [x[1] for x in res if x[0] == 429 and len(x) > 3 and "queue;dur" in x[3]]
    shed_door = [x[1] for x in res if x[0] == 429 and not (len(x) > 3 and "queue;dur" in x[3])]
    door = percentiles(shed_door, (50, 99))
    other: dict[str, int] = {}
    for x in res:
        if x[0] not in (200, 429):
            other[str(x[0])] = other.get(str(x[0]), 0) + 1
    every = [x[1] for x in res if x[0] > 0]
    a, b = percentiles(ok, (50, 99)), percentiles(shed, (50, 99))
    # from the moment it was sent: without the generator's own lateness (it shares the cores)
    ok_sent = percentiles([x[1] - x[2] for x in res if x[0] == 200], (99,))
    shed_sent = percentiles([x[1] - x[2] for x in res if x[0] == 429], (50, 99))
    late = percentiles([x[2] for x in res], (99,))
    nan = float("nan")
    growth = (None if rss_start is None or r.get("rss_peak_mb") is None
              else (r["rss_peak_mb"] - rss_start) / rss_start * 100)
    n = max(1, len(res))
    split = shed_split(res)
    return {"rate": rate, "offered": r["offered"], "sent": len(res), "qps": len(ok) / seconds, "shed_split": split,
            "p50_ms": a.get("p50_ms", nan), "p99_ms": a.get("p99_ms", nan), "max_ms": max(every) if every else nan,
            "shed_pct": 100 * len(shed) / n, "shed_p50_ms": b.get("p50_ms", nan),
            "shed_p99_ms": b.get("p99_ms", nan), "shed_max_ms": max(shed) if shed else nan, "errors": other,
            "p99_from_sent_ms": ok_sent.get("p99_ms", nan), "shed_p50_from_sent_ms": shed_sent.get("p50_ms", nan),
            "shed_p99_from_sent_ms": shed_sent.get("p99_ms", nan),
            "sent_late_p99_ms": late.get("p99_ms", nan), "connections": r["connections"],
            "generator_cpu_ms_per_request": (r.get("generator_cpu_s") or 0.0) * 1000 / n,
            "generator_core_pct": 100 * (r.get("generator_cpu_s") or 0.0) / max(1e-9, r.get("generator_wall_s") or seconds),
            "server_cpu_ms_per_request": (None if r.get("server_cpu_s") is None else r["server_cpu_s"] * 1000 / n),
            # the event loop's thread: uvicorn, the gates, parsing, validation, routing, the response
            "server_loop_cpu_ms_per_request": (None if r.get("server_loop_cpu_s") is None
                                               else r["server_loop_cpu_s"] * 1000 / n),
            "shed_door_pct": 100 * len(shed_door) / n, "shed_queue_pct": 100 * len(shed_queue) / n,
            "shed_door_p50_ms": door.get("p50_ms", nan), "shed_door_p99_ms": door.get("p99_ms", nan),
            "shed_door_max_ms": max(shed_door) if shed_door else nan,
            "others_cores": (r["others_cpu_s"] / r["slice_wall_s"] if r.get("slice_wall_s") else None),
            "tail_episodes": tail_episodes(res, r.get("machine_samples") or []),
            "breakdown": breakdown(res),
            "rss_start_mb": rss_start, "rss_peak_mb": r.get("rss_peak_mb"), "rss_growth_pct": growth}
