"""Load benchmark of `stair-es serve`: N concurrent clients on 127.0.0.1 against /v1/search.

For each corpus size it builds (once, cached) an embedded index of the synthetic STAIR-like
corpus of ``benchmarks/corpora.py`` and starts one `stair-es serve` process on 127.0.0.1 per
setting compared (``--batching off,on``: the worker pool against the batching queue).

Load model (printed with every report):

* closed loop: C clients, each on its own keep-alive connection, send a query, wait for the
  answer, think (an exponential pause of mean ``--think-ms``; 0: none, which measures the
  server at saturation), and send the next;
* the client runs in this process, on the same machine and cores as the server; it is a lean
  asyncio + httptools client whose CPU per request is reported (about 0.2-0.3 ms; httpx took
  more than 3 ms, which on 2 shared cores was a large share of what was measured);
* queries are the corpus's 1000 distinct token maps ("captions" of random images; client k
  sends queries k, k+C, k+2C, ...), so the figures are the server's search path, not a
  model's; the server caches no results and no query vectors;
* the settings take turns in ``--rounds`` slices per row, and so does an in-process
  measurement (one-thread search latency, and the engine's own ``search_batch`` throughput),
  so a change in the machine's other load falls on all of them alike.

Little's law bounds what a closed loop can show: with no think time the mean latency is
C / QPS, so the report ends with the bound the engine's own throughput sets at 50 clients.

Open loop (``--open-loop``), the measure of a server under a given offered load (issue 26):

* the load generator is another process (``python -m benchmarks.serve_load --generate ...``),
  so its CPU is not this process's, though it shares the machine's cores with the server;
* saturation S: the answers per second of ``--saturation-clients`` closed-loop clients with no
  think time (the most the server answers here, now);
* then, per rate (``--rate R,...`` in searches/s, or ``--fractions 0.5,0.8,1.5`` of S):
  requests arrive as a Poisson process of that rate for ``--seconds``, each on an idle
  keep-alive connection or a new one, whether or not earlier ones were answered; latency is
  counted from the moment a request was due, not sent, so a generator that falls behind
  cannot hide the server's queueing (coordinated omission);
* the rates take turns in ``--rounds`` slices (as the closed-loop settings do), so a change in
  the machine's other load falls on all of them alike, and S is measured again at the end;
* per rate: answered (200) per second, p50/p99 of the answered, the slowest response of any
  kind, the share shed (429) and how fast those came back, other errors, and the server's
  resident memory before the first rate and its peak during that rate's slices (sampled every
  0.25 s).

    python -m benchmarks.serve_load --docs 100000,1000000 --clients 1,10,50 --seconds 24
    python -m benchmarks.serve_load --docs 1000000 --clients 50 --think-ms 1000,3000 --seconds 30
    python -m benchmarks.serve_load --docs 100000 --clients 50 --batching off,on:2,on:16
    python -m benchmarks.serve_load --open-loop --docs 1000000 --fractions 0.5,0.8,1.5 --seconds 20
    python -m benchmarks.serve_load --open-loop --docs 100000 --rate 50,100,200 --max-queue 16

Every request loop is bounded in count and time and talks only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Timer, git_commit, percentiles
from benchmarks.corpora import CACHE_DIR, CorpusSpec, load_corpus
from benchmarks.serve_stats import (  # noqa: F401 - also imported from here by serve_ab and the tests
    PHASES,
    add_cpu,
    breakdown,
    debug_stats,
    machine_busy_s,
    others_cores,
    print_machine,
    print_shed_split,
    process_cpu,
    process_rss_mb,
    server_timing,
    shed_split,
    summarize_open,
    tail_episodes,
)

FIELD = "image"
#: The Python and folder the server runs with (``--server-python``, ``--server-cwd``): another
#: checkout's server can be measured with this benchmark's own generator and summary.
SERVER = {"python": sys.executable, "cwd": None}
#: ``--generator-realtime``: the load generator in SCHED_FIFO 1 (root or CAP_SYS_NICE), so that on two
#: shared cores its own wake-ups (sending when due, reading an answer) do not wait for a scheduler tick
#: behind the server's search threads: what is left is the server's.
GENERATOR = {"realtime": False}


def build_index(home: Path, name: str, n_docs: int):
    """The corpus as an embedded index (one optimized segment), reused when already built."""
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    corpus = load_corpus(CorpusSpec(n_docs=n_docs, n_queries=1000))
    path = home / name
    if not (path / "manifest.json").exists():
        t0 = time.perf_counter()
        home.mkdir(parents=True, exist_ok=True)
        ix = EngineIndex.create(path, IndexSchema(fields={}, sparse_fields=(FIELD,), encoder={"name": "bow"}))
        d = corpus.docs
        step = 200_000
        for a in range(0, d.n_rows, step):
            b = min(d.n_rows, a + step)
            lo, hi = int(d.indptr[a]), int(d.indptr[b])
            ix.add_arrays([str(i) for i in range(a, b)],
                          {FIELD: (np.asarray(d.indptr[a:b + 1] - lo), np.asarray(d.indices[lo:hi]),
                                   np.asarray(d.weights[lo:hi]))})
        ix.optimize()
        ix.close()
        print(f"# built {name}: {n_docs} docs in {time.perf_counter() - t0:.0f} s", flush=True)
    return corpus


def query_maps(corpus, n: int) -> list[dict[str, float]]:
    from stair_es.vocab import default_vocabulary

    tokens = default_vocabulary().tokens
    q = corpus.queries
    return [{tokens[int(t)]: float(w) for t, w in zip(*q.row(i))} for i in range(min(n, q.n_rows))]


def in_process_p50(home: Path, name: str, queries: list[dict[str, float]], top_k: int, seconds: float) -> float:
    """Median ms of the same search through the library on one thread (make_request + backend.search)."""
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.search import QuerySpec, make_request

    b = EmbeddedBackend(home)
    times = []
    deadline = time.monotonic() + seconds
    for i, qm in enumerate(queries * 10):
        with Timer() as t:
            req, _ = make_request(b, name, QuerySpec(tokens=qm, top_k=top_k, caption_weight=0))
            b.search(name, req)
        if i >= 5:
            times.append(t.wall_ms)
        if time.monotonic() > deadline and len(times) >= 20:
            break
    b.close()
    return percentiles(times, (50,))["p50_ms"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_log(port: int):
    import tempfile

    f = tempfile.NamedTemporaryFile("w", prefix=f"stair-serve-{port}-", suffix=".log", delete=False)
    _server_log.last = f.name
    return f


def start_server(home: Path, index: str, workers: int, batching: str = "auto", max_batch: int | None = None,
                 window_ms: float = 0.0, max_queue: int = 1000, extra: list[str] | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """``extra``: more options; an item ``ENV:NAME=VALUE`` sets that environment variable instead."""
    port = free_port()
    env = dict(os.environ)
    for item in [x for x in (extra or []) if x.startswith("ENV:")]:
        key, _, value = item[4:].partition("=")
        env[key] = value
    extra = [x for x in (extra or []) if not x.startswith("ENV:")]
    proc = subprocess.Popen([SERVER["python"], "-m", "stair_es.cli.main", "serve", "--home", str(home), "--encoder", "bow",
                             "--index", index, "--port", str(port), "--workers", str(workers), "--max-queue",
                             str(max_queue), "--batching", batching, "--batch-window-ms", str(window_ms),
                             "--log-level", "warning"]
                            + (["--max-batch", str(max_batch)] if max_batch else []) + (extra or []),
                            # a file, not a pipe: a pipe nobody reads fills up with the server's log and then
                            # blocks its event loop's thread in write() (seen once when its index was deleted)
                            stdout=subprocess.DEVNULL, stderr=_server_log(port), text=True, cwd=SERVER["cwd"],
                            env=env)
    url = f"http://127.0.0.1:{port}"
    proc.stderr_path = _server_log.last  # its log, for the error below and for whoever wants to read it
    import urllib.request

    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"stair-es serve exited: {Path(proc.stderr_path).read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2):
                return proc, url
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("stair-es serve did not become ready in 120 s")
            time.sleep(0.3)


class _Response:
    """httptools callbacks for one response: its status, Server-Timing header and end."""

    def __init__(self):
        self.done = False
        self.timing = b""
        self.retry_ms = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"server-timing":
            self.timing = value
        elif name == b"retry-after-ms":
            self.retry_ms = int(value)

    def on_message_complete(self) -> None:
        self.done = True


#: One busy-looping process: another job on the machine (``--hog``), at most ``limit`` seconds.
_HOG = "import os, time\nos.nice({nice})\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def start_hogs(n: int, nice: int = 0, limit_s: float = 900.0) -> list[subprocess.Popen]:
    """``n`` processes that each spin on a core at ``nice`` (``--hog``): a busy machine on purpose, so
    that a run measures the server while another job takes a core instead of waiting for one. Each
    stops by itself after ``limit_s`` seconds; :func:`stop_hogs` stops them sooner."""
    return [subprocess.Popen([sys.executable, "-c", _HOG.format(nice=int(nice), limit=float(limit_s))])
            for _ in range(max(0, n))]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
        h.wait()


def stop_servers(servers: dict) -> None:
    """Ask each server process (``label -> (process, port)``) to stop; kill one that does not within 20 s."""
    for proc, _ in servers.values():
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


class Connection:
    """One keep-alive HTTP/1.1 connection with pre-encoded requests and httptools' C parser: a
    load client that costs far less CPU per request than a general one (httpx), which matters
    when the client shares the server's cores."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        # of the last request: Retry-After-Ms (0: none), and time.perf_counter() when it was written
        # (after any connect) and when its answer was complete
        self.retry_ms, self.t_write, self.t_done = 0, 0.0, 0.0

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        import httptools

        for attempt in (0, 1):
            if self.writer is None:
                await self._connect()
            resp = _Response()
            parser = httptools.HttpResponseParser(resp)
            got = False
            try:
                self.t_write = time.perf_counter()
                self.writer.write(raw)
                while not resp.done:
                    data = await self.reader.read(65536)
                    if not data:
                        break
                    got = True
                    parser.feed_data(data)
            except ConnectionError:
                pass
            if resp.done:
                self.t_done, self.retry_ms = time.perf_counter(), resp.retry_ms
                return parser.get_status_code(), resp.timing
            self.close()
            # the server closed an idle keep-alive connection (uvicorn: after 5 s, which a long
            # think time exceeds): open a new one and send again; closed mid-answer: an error
            if got or attempt:
                return 0, b""
        return 0, b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def search_request(host: str, port: int, query: dict[str, float], top_k: int) -> bytes:
    body = json.dumps({"tokens": query, "top_k": top_k, "caption_weight": 0}).encode()
    return (f"POST /v1/search HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def load(url: str, queries: list[dict[str, float]], clients: int, seconds: float, top_k: int,
               max_requests: int, think_ms: float = 0.0, seed: int = 0) -> dict:
    """C closed-loop clients, each on its own keep-alive connection: send a query, wait for the
    answer, think (exponential pause of mean ``think_ms``; 0: none), send the next. Client k sends
    queries k, k+C, k+2C, ... of the list, so concurrent requests are distinct queries. A client
    told 429 waits its ``Retry-After-Ms`` (at most 1 s) before its next request, as a polite
    client does: the server's queue timeout (on by default) refuses what would wait past it, and
    clients that resent at once would measure how fast it refuses, not how many it answers."""
    import random
    from urllib.parse import urlsplit

    u = urlsplit(url)
    raws = [search_request(u.hostname, u.port, q, top_k) for q in queries]
    latencies: list[float] = []
    timings: list[dict[str, float]] = []
    errors: dict[int, int] = {}
    sent = 0
    conns = [Connection(u.hostname, u.port) for _ in range(clients)]
    # warm-up: every connection once
    await asyncio.gather(*(c.request(raws[i % len(raws)]) for i, c in enumerate(conns)))
    rng = random.Random(seed)
    stop = time.monotonic() + seconds

    async def client(k: int) -> None:
        nonlocal sent
        i = k
        conn = conns[k]
        if think_ms > 0:  # spread the clients' first requests over one think time (counted in the wall time)
            await asyncio.sleep(rng.random() * think_ms / 1000)
        while time.monotonic() < stop and sent < max_requests:
            sent += 1
            t = time.perf_counter()
            status, timing = await conn.request(raws[i % len(raws)])
            dt = (time.perf_counter() - t) * 1000
            if status == 200:
                latencies.append(dt)
                if timing:
                    timings.append(server_timing(timing))
            else:
                errors[status] = errors.get(status, 0) + 1
                if status == 429 and conn.retry_ms:
                    await asyncio.sleep(min(1.0, conn.retry_ms / 1000, max(0.0, stop - time.monotonic())))
            i += clients
            if think_ms > 0:  # never past the end: the wall time below is the load's, not a last pause's
                await asyncio.sleep(max(0.0, min(rng.expovariate(1000 / think_ms), stop - time.monotonic())))

    with Timer() as load:
        await asyncio.gather(*(client(k) for k in range(clients)))
    for c in conns:
        c.close()
    return {"latencies": latencies, "app": [t["app"] for t in timings if "app" in t],
            "sizes": [t["batch_size"] for t in timings if "batch_size" in t], "errors": errors, "wall": load.wall_s,
            "client_cpu": load.cpu_s}


def summarize(slices: list[dict]) -> dict:
    """One row from the slices of one setting (their latencies pooled, their times added)."""
    lat = np.array([x for s in slices for x in s["latencies"]])
    app = [x for s in slices for x in s["app"]]
    sizes = [x for s in slices for x in s["sizes"]]
    errors: dict[int, int] = {}
    for s in slices:
        for k, v in s["errors"].items():
            errors[k] = errors.get(k, 0) + v
    n_err = sum(errors.values())

    client, server = percentiles(lat, (50, 99)), percentiles(app, (50, 99))
    nan = float("nan")
    return {"requests": len(lat), "errors": n_err, "error_statuses": errors,
            "qps": len(lat) / sum(s["wall"] for s in slices), "p50_ms": client.get("p50_ms", nan),
            "p99_ms": client.get("p99_ms", nan), "server_p50_ms": server.get("p50_ms", nan),
            "server_p99_ms": server.get("p99_ms", nan),
            "mean_batch": float(np.mean(sizes)) if sizes else None,
            "client_cpu_ms_per_request": sum(s["client_cpu"] for s in slices) * 1000 / max(1, len(lat) + n_err),
            # the warm-up requests of each slice are in it too (one per client): a small overestimate
            "server_cpu_ms_per_request": (None if any(s.get("server_cpu") is None for s in slices) else
                                          sum(s["server_cpu"] for s in slices) * 1000 / max(1, len(lat) + n_err))}


def in_process_batch_qps(home: Path, name: str, queries: list[dict[str, float]], top_k: int, threads: int,
                         seconds: float) -> float:
    """Searches per second of the engine alone (``search_batch`` on ``threads`` threads, batches of
    16, requests prepared beforehand): the most the server could answer on this machine now."""
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.search import QuerySpec, make_request

    b = EmbeddedBackend(home)
    reqs = [make_request(b, name, QuerySpec(tokens=qm, top_k=top_k, caption_weight=0))[0] for qm in queries]
    done, t0 = 0, time.perf_counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for a in range(0, len(reqs), 16):
            b.search_batch(name, reqs[a:a + 16], threads=threads)
            done += len(reqs[a:a + 16])
            if time.monotonic() > deadline:
                break
    qps = done / (time.perf_counter() - t0)
    b.close()
    return qps


# --- open loop ---------------------------------------------------------------------------------
async def open_loop(url: str, queries: list[dict[str, float]], rate: float, seconds: float, top_k: int,
                    seed: int = 0, max_connections: int = 2000) -> dict:
    """Poisson arrivals of ``rate`` searches/s for ``seconds``; each request goes out when due on
    an idle keep-alive connection (or a new one), whatever the state of the earlier ones."""
    import random
    from urllib.parse import urlsplit

    u = urlsplit(url)
    raws = [search_request(u.hostname, u.port, q, top_k) for q in queries]
    rng = random.Random(seed)
    idle: list[Connection] = []
    opened = 0
    # (status, ms from due to answer, ms from due to sent, Server-Timing, due time in seconds, written and
    # answered at: time.perf_counter() of the write, after any connect, and of the answer's last byte)
    out: list[tuple[int, float, float, str, float, float, float]] = []
    # a few connections open before the clock starts, as a steady client population would have
    warm = [Connection(u.hostname, u.port) for _ in range(8)]
    await asyncio.gather(*(c.request(raws[i % len(raws)]) for i, c in enumerate(warm)))
    idle.extend(warm)
    opened = len(warm)

    async def one(k: int, due: float) -> None:
        nonlocal opened
        conn = idle.pop() if idle else None
        if conn is None:
            if opened >= max_connections:
                out.append((-1, float("nan"), 0.0, "", due))  # the generator's own limit: counted, never hidden
                return
            conn = Connection(u.hostname, u.port)
            opened += 1
        sent = time.perf_counter()
        status, timing = await conn.request(raws[k % len(raws)])
        done = time.perf_counter()
        # due is time.perf_counter(), CLOCK_MONOTONIC on Linux: the same clock as the sampler's in the parent
        out.append((status, (done - due) * 1000, (sent - due) * 1000,
                    timing.decode("latin-1") if status in (200, 429) else "", due, conn.t_write, conn.t_done))
        if status:
            idle.append(conn)

    tasks = []
    start = time.perf_counter()
    due, k = start, 0
    end = start + seconds
    while True:
        due += rng.expovariate(rate)
        if due >= end:
            break
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(k, due)))
        k += 1
    await asyncio.wait(tasks, timeout=120)
    for c in idle:
        c.close()
    return {"offered": k / seconds, "results": out, "connections": opened}


def generator_main(argv: list[str]) -> None:
    """The load generator process: ``--generate open:RATE|closed:CLIENTS URL QUERIES.json SECONDS TOP_K SEED``;
    prints one JSON line of results."""
    import resource

    mode, url, qfile, seconds, top_k, seed = argv
    queries = json.loads(Path(qfile).read_text())
    kind, _, n = mode.partition(":")
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if kind == "open":
        r = asyncio.run(open_loop(url, queries, float(n), float(seconds), int(top_k), int(seed)))
    else:
        r = asyncio.run(load(url, queries, int(n), float(seconds), int(top_k), 10_000_000))
        r = {"qps": len(r["latencies"]) / r["wall"], "errors": r["errors"], "requests": len(r["latencies"])}
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    # the generator's own CPU (it shares the server's cores): seconds used, over the wall time
    r["generator_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    r["generator_wall_s"] = time.perf_counter() - t0
    print(json.dumps(r))


def run_generator(mode: str, url: str, qfile: Path, seconds: float, top_k: int, seed: int, pid: int,
                  nice: int = 0, cpus: set[int] | None = None) -> dict:
    """The generator in its own process (``nice`` steps below this one, on ``cpus`` only if given),
    the server's resident memory sampled meanwhile and its CPU time counted."""
    import threading

    realtime = GENERATOR["realtime"]

    def place() -> None:  # in the generator's process, before it runs
        if nice:
            os.nice(nice)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if realtime:
            os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))

    samples: list[float] = []
    machine: list[tuple[float, float, float]] = []  # (time, the machine's busy CPU s, the server's CPU s)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            mb = process_rss_mb(pid)
            if mb is not None:
                samples.append(mb)
            busy, cpu = machine_busy_s(), process_cpu(pid)
            if busy is not None and cpu is not None:
                machine.append((time.perf_counter(), busy, cpu))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    cpu0, loop0, busy0, t0 = process_cpu(pid), process_cpu(pid, pid), machine_busy_s(), time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "benchmarks.serve_load", "--generate", mode, url, str(qfile),
                            str(seconds), str(top_k), str(seed)], capture_output=True, text=True,
                           timeout=seconds + 300, cwd=Path(__file__).resolve().parents[1],
                           preexec_fn=place if (nice or cpus) else None)
    finally:
        stop.set()
        t.join()
    cpu1, loop1, busy1, t1 = process_cpu(pid), process_cpu(pid, pid), machine_busy_s(), time.perf_counter()
    if p.returncode != 0:
        raise SystemExit(f"the load generator failed: {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["rss_peak_mb"] = max(samples) if samples else None
    r["server_cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    r["server_loop_cpu_s"] = None if loop0 is None or loop1 is None else loop1 - loop0
    # the cores other processes used meanwhile: the machine's busy time minus the server's and the generator's
    if None not in (busy0, busy1, cpu0, cpu1):
        r["others_cpu_s"] = max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - r.get("generator_cpu_s", 0.0))
        r["slice_wall_s"] = t1 - t0
    r["machine_samples"] = machine
    return r


def open_loop_main(args, hogs: list) -> None:
    import tempfile

    print(f"# stair-es serve open-loop load: commit {git_commit()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, --workers {args.workers}, --max-queue {args.max_queue}, "
          f"--request-timeout {args.request_timeout:g}, batching {args.batching.split(',')[0]}, "
          f"{args.server_args or 'no other server options'}, server code {args.server_cwd or 'this checkout'}, "
          f"top_k {args.top_k}, "
          f"{args.seconds:g} s per rate in {args.rounds} slices", flush=True)
    print("# load model: open loop, Poisson arrivals from a generator in another process; latency counted from each "
          "request's due time; saturation S = answers/s of closed-loop clients with no think time", flush=True)
    gen_cpus = {int(c) for c in args.generator_cpus.split(",")} if args.generator_cpus else None
    print(f"# generator: nice +{args.generator_nice}, CPUs {sorted(gen_cpus) if gen_cpus else 'any'}"
          f"{', SCHED_FIFO 1' if args.generator_realtime else ''}", flush=True)
    if args.hog:
        print(f"# another job on purpose: {args.hog} busy-looping process(es) at nice {args.hog_nice} for the whole "
              "run (counted in 'others')", flush=True)
    for n in [int(x) for x in args.docs.split(",")]:
        name = f"load-{n}"
        corpus = build_index(args.home, name, n)
        queries = query_maps(corpus, 1000)
        qfile = Path(tempfile.mkdtemp(prefix="stair-serve-load-")) / "queries.json"
        qfile.write_text(json.dumps(queries))
        batching, _, max_batch = args.batching.split(",")[0].partition(":")
        proc, url = start_server(args.home, name, args.workers, batching, int(max_batch or args.max_batch or 0),
                                 args.batch_window_ms, max_queue=args.max_queue,
                                 extra=["--request-timeout", str(args.request_timeout)] + args.server_args.split())
        stop_hogs(hogs)
        n_rates = len((args.rate or args.fractions).split(","))
        hogs[:] = start_hogs(args.hog, args.hog_nice,
                             limit_s=2 * args.saturation_seconds + n_rates * (args.seconds + 3 * args.rounds) + 120)
        rows = []
        try:
            sat = run_generator(f"closed:{args.saturation_clients}", url, qfile, args.saturation_seconds, args.top_k, 0,
                                proc.pid, args.generator_nice, gen_cpus)
            s_qps = sat["qps"]
            print(f"# {n:,} docs: saturation S = {s_qps:.1f} searches/s ({args.saturation_clients} closed-loop clients, "
                  f"no think time, {args.saturation_seconds:g} s; statuses other than 200: {sat['errors']})", flush=True)
            rates = ([float(x) for x in args.rate.split(",")] if args.rate
                     else [round(f * s_qps, 1) for f in (float(x) for x in args.fractions.split(","))])
            # the rates take turns in --rounds slices, so a change in the machine's other load falls on all alike
            rss0 = process_rss_mb(proc.pid)
            pooled: dict[float, dict] = {}
            for rnd in range(args.rounds):
                for i, rate in enumerate(rates):
                    r = run_generator(f"open:{rate}", url, qfile, args.seconds / args.rounds, args.top_k,
                                      1 + i + rnd * len(rates), proc.pid, args.generator_nice, gen_cpus)
                    acc = pooled.setdefault(rate, {"results": [], "sent": 0, "connections": 0, "rss_peak_mb": None,
                                                   "generator_cpu_s": 0.0, "generator_wall_s": 0.0, "server_cpu_s": 0.0,
                                                   "server_loop_cpu_s": 0.0})
                    acc["results"] += r["results"]
                    acc["generator_cpu_s"] += r.get("generator_cpu_s", 0.0)
                    acc["generator_wall_s"] += r.get("generator_wall_s", 0.0)
                    add_cpu(acc, r)
                    acc["sent"] += r["offered"] * args.seconds / args.rounds
                    acc["connections"] = max(acc["connections"], r["connections"])
                    if r.get("rss_peak_mb") is not None:
                        acc["rss_peak_mb"] = max(acc["rss_peak_mb"] or 0.0, r["rss_peak_mb"])
            for rate in rates:
                acc = pooled[rate]
                acc["offered"] = acc["sent"] / args.seconds
                row = {"docs": n, "S": s_qps, "fraction": rate / s_qps, **summarize_open(rate, acc, args.seconds, rss0),
                       "load_average": os.getloadavg()[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
            st = debug_stats(url)
            if st is not None:  # with --server-args --debug-stats: the server's own view of all the rates together
                print(json.dumps({"debug_stats": {k: st.get(k) for k in ("gc", "loop_lag", "shed", "shed_from_queue")}}),
                      flush=True)
            # the machine's other load changes: S again, to show how far it moved during the rates
            after = run_generator(f"closed:{args.saturation_clients}", url, qfile, args.saturation_seconds, args.top_k,
                                  0, proc.pid, args.generator_nice, gen_cpus)
            print(f"# {n:,} docs: saturation after the rates = {after['qps']:.1f} searches/s (before: {s_qps:.1f})",
                  flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            log_text = Path(proc.stderr_path).read_text(errors="replace")
            print(f"# server log {proc.stderr_path}: {log_text.count('ERROR')} lines with ERROR", flush=True)
        print()
        print("| docs | rate /s | x S | sent | QPS | p50 ms | p99 ms | p99 from sent ms | slowest ms | shed % | "
              "shed p50 / p99 from sent ms | shed p99 ms | at the door: % , p50 / p99 / max ms | from the queue % | "
              "other errors | sent late p99 ms | RSS start MB | RSS peak MB | RSS growth % |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
        for r in rows:
            errs = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
            print(f"| {r['docs']:,} | {r['rate']:.1f} | {r['fraction']:.2f} | {r['sent']} | {r['qps']:.1f} | "
                  f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['p99_from_sent_ms']:.1f} | {r['max_ms']:.0f} | "
                  f"{r['shed_pct']:.1f} | {r['shed_p50_from_sent_ms']:.1f} / {r['shed_p99_from_sent_ms']:.1f} | "
                  f"{r['shed_p99_ms']:.1f} | {r['shed_door_pct']:.1f}, {r['shed_door_p50_ms']:.1f} / "
                  f"{r['shed_door_p99_ms']:.1f} / {r['shed_door_max_ms']:.1f} | {r['shed_queue_pct']:.1f} | "
                  f"{errs} | {r['sent_late_p99_ms']:.1f} | {r['rss_start_mb']:.0f} | "
                  f"{r['rss_peak_mb']:.0f} | {r['rss_growth_pct']:+.1f} |")
        print()
        print("| x S | generator CPU ms/req | generator % of a core | server CPU ms/req | of which event-loop thread |")
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            scpu, lcpu = r["server_cpu_ms_per_request"], r["server_loop_cpu_ms_per_request"]
            print(f"| {r['fraction']:.2f} | {r['generator_cpu_ms_per_request']:.2f} | {r['generator_core_pct']:.1f} | "
                  f"{'-' if scpu is None else f'{scpu:.2f}'} | {'-' if lcpu is None else f'{lcpu:.2f}'} |")
        print()
        print("Where the answered searches' time went (ms; Server-Timing of each answer): p50 / p99 of each phase, "
              "and its mean over the slowest 1 % (the tail). late: the generator sent it after its due time; "
              "outside: client time minus the server's pre + app (network, uvicorn, event-loop delay before the app)")
        print()
        print_shed_split(rows, lambda r: f"{r['fraction']:.2f}", "x S")
        cols = ("late", "outside") + PHASES + ("engine_cpu", "engine_wait", "answer_wait", "total")
        print("| x S | | " + " | ".join(cols) + " |")
        print("|---:|---|" + "---:|" * len(cols))
        for r in rows:
            bd = r["breakdown"]
            if not bd:
                continue
            for what in ("p50", "p99", "tail_mean"):
                print(f"| {r['fraction']:.2f} | {what} | " + " | ".join(f"{bd[c][what]:.1f}" for c in cols) + " |")
        print_machine(rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        return generator_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", default="100000", help="Corpus sizes, comma-separated (e.g. 100000,1000000).")
    ap.add_argument("--clients", default="1,10,50", help="Concurrent client counts, comma-separated.")
    ap.add_argument("--think-ms", default="0", help="Mean think time between a client's answer and its next request "
                                                   "(exponential), comma-separated; 0: none (saturation).")
    ap.add_argument("--batching", default=None, help="stair-es serve --batching settings to compare, comma-separated; "
                                                     "on:N sets --max-batch N for that one (default: off,on; open loop: "
                                                     "the server's own, auto).")
    ap.add_argument("--rounds", type=int, default=3, help="Slices per row: the settings take turns this many times.")
    ap.add_argument("--max-batch", type=int, help="stair-es serve --max-batch (default: its own).")
    ap.add_argument("--batch-window-ms", type=float, default=0.0, help="stair-es serve --batch-window-ms.")
    ap.add_argument("--seconds", type=float, default=20.0, help="Load time per row (split into --rounds slices).")
    ap.add_argument("--max-requests", type=int, default=200_000, help="Upper bound of requests per row.")
    ap.add_argument("--workers", type=int, default=2, help="stair-es serve --workers.")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--home", type=Path, default=Path(CACHE_DIR) / "serve_load", help="Where the indices are built.")
    ap.add_argument("--open-loop", action="store_true", help="Open loop: saturation S, then Poisson arrivals at each rate.")
    ap.add_argument("--rate", help="Open loop: arrival rates in searches/s, comma-separated (default: --fractions of S).")
    ap.add_argument("--fractions", default="0.5,0.8,1.5", help="Open loop: rates as fractions of the saturation S.")
    ap.add_argument("--saturation-clients", type=int, default=16, help="Open loop: closed-loop clients measuring S.")
    ap.add_argument("--saturation-seconds", type=float, default=15.0)
    ap.add_argument("--max-queue", type=int, default=None,
                    help="stair-es serve --max-queue (default: 1000 closed loop, 64 open loop, the server's own).")
    ap.add_argument("--request-timeout", type=float, default=30.0, help="Open loop: stair-es serve --request-timeout.")
    ap.add_argument("--generator-nice", type=int, default=0,
                    help="Open loop: run the load generator this many nice steps below the benchmark (it shares the "
                         "server's cores; its lateness is counted in the latencies, and reported apart).")
    ap.add_argument("--generator-realtime", action="store_true",
                    help="Open loop: run the load generator in SCHED_FIFO 1 (root or CAP_SYS_NICE), so its own "
                         "wake-ups do not wait behind the server's searches for a scheduler tick.")
    ap.add_argument("--generator-cpus", default="",
                    help="Open loop: pin the load generator to these CPUs (comma-separated ids; default: any).")
    ap.add_argument("--server-python", default=sys.executable,
                    help="Open loop: the Python that runs the server (e.g. another checkout's .venv/bin/python).")
    ap.add_argument("--server-cwd", help="Open loop: the folder the server runs in (another checkout, to compare).")
    ap.add_argument("--server-args", default="", help="Open loop: more stair-es serve options, e.g. '--worker-nice 5'.")
    ap.add_argument("--hog", type=int, default=0,
                    help="Open loop: processes that spin at nice --hog-nice for the whole run (from before S is "
                         "measured), as another job taking a core (default 0: none).")
    ap.add_argument("--hog-nice", type=int, default=0)
    args = ap.parse_args()
    SERVER.update(python=args.server_python, cwd=args.server_cwd)
    GENERATOR.update(realtime=args.generator_realtime)
    if args.open_loop:
        args.max_queue = 64 if args.max_queue is None else args.max_queue
        args.batching = args.batching or "auto"
        hogs = []
        try:
            return open_loop_main(args, hogs)
        finally:
            stop_hogs(hogs)
    args.batching = args.batching or "off,on"

    print(f"# stair-es serve load: commit {git_commit()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, --workers {args.workers}, "
          f"--max-batch {args.max_batch or 'default'}, "
          f"--batch-window-ms {args.batch_window_ms:g}, top_k {args.top_k}, {args.seconds:g} s per row", flush=True)
    print("# load model: closed loop; each client has its own keep-alive connection and sends its next request when "
          "the answer arrives (after a think time, if given); the client runs in this process on the same machine "
          "(its CPU per request is reported); queries are the corpus's 1000 distinct token maps, nothing is cached",
          flush=True)
    rows, ceilings = [], {}
    for n in [int(x) for x in args.docs.split(",")]:
        name = f"load-{n}"
        corpus = build_index(args.home, name, n)
        queries = query_maps(corpus, 1000)
        inproc: list[tuple[float, float]] = []  # (one-thread p50 ms, search_batch searches/s), one per slice

        def measure_in_process(seconds: float) -> None:
            inproc.append((in_process_p50(args.home, name, queries, args.top_k, seconds=seconds / 2),
                           in_process_batch_qps(args.home, name, queries, args.top_k, args.workers, seconds / 2)))

        measure_in_process(6)  # also warms the page cache
        modes = args.batching.split(",")
        servers = {}
        try:
            for mode in modes:  # all settings' servers run side by side; the idle ones cost no CPU
                batching, _, max_batch = mode.partition(":")
                servers[mode] = start_server(args.home, name, args.workers, batching,
                                             int(max_batch or args.max_batch or 0), args.batch_window_ms)
            for think in [float(x) for x in args.think_ms.split(",")]:
                for c in [int(x) for x in args.clients.split(",")]:
                    # the settings take turns in short slices, so a change in the machine's other load
                    # falls on all of them alike
                    slices: dict[str, list[dict]] = {m: [] for m in modes}
                    for _ in range(args.rounds):
                        measure_in_process(min(4.0, args.seconds / args.rounds))  # takes its turn too
                        for m in modes:
                            cpu0 = process_cpu(servers[m][0].pid)
                            part = asyncio.run(load(servers[m][1], queries, c, args.seconds / args.rounds, args.top_k,
                                                    args.max_requests, think))
                            cpu1 = process_cpu(servers[m][0].pid)
                            part["server_cpu"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
                            slices[m].append(part)
                    base = statistics.median(x for x, _ in inproc[-args.rounds:])
                    for m in modes:
                        r = {"docs": n, "batching": m, "clients": c, "think_ms": think, **summarize(slices[m]),
                             "in_process_p50_ms": base, "load_average": os.getloadavg()[0]}
                        rows.append(r)
                        print(json.dumps(r), flush=True)
        finally:
            stop_servers(servers)
        ceilings[n] = statistics.median(q for _, q in inproc)
        print(f"# {n:,} docs, in-process, in turn with the load: search p50 "
              f"{statistics.median(x for x, _ in inproc):.2f} ms (one thread); engine alone "
              f"{ceilings[n]:.0f} searches/s (search_batch, {args.workers} threads; slices from "
              f"{min(q for _, q in inproc):.0f} to {max(q for _, q in inproc):.0f})", flush=True)
    print()
    print("| docs | batching | clients | think ms | requests | errors | QPS | p50 ms | p99 ms | server p50 ms | "
          "server p99 ms | mean batch | server CPU ms/req | client CPU ms/req | in-process p50 ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mb = f"{r['mean_batch']:.1f}" if r["mean_batch"] else "-"
        scpu = f"{r['server_cpu_ms_per_request']:.2f}" if r["server_cpu_ms_per_request"] is not None else "-"
        print(f"| {r['docs']:,} | {r['batching']} | {r['clients']} | {r['think_ms']:g} | {r['requests']} | {r['errors']} | "
              f"{r['qps']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['server_p50_ms']:.1f} | "
              f"{r['server_p99_ms']:.1f} | {mb} | {scpu} | {r['client_cpu_ms_per_request']:.2f} | "
              f"{r['in_process_p50_ms']:.2f} |")
    print()
    for n, q in ceilings.items():
        print(f"# bound at {n:,} docs: the engine alone answers {q:.0f} searches/s here, so C closed-loop clients with "
              f"no think time wait at least C / {q:.0f} s on average (Little's law): "
              f"{50 / q * 1000:.0f} ms at 50 clients, before any HTTP cost")


if __name__ == "__main__":
    main()
