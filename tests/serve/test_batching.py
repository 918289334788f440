"""Inter-query batching of /v1/search: arrival order, per-request errors, the same answers as
one-by-one searches, and an index that changes under a running server."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from fakes import ColorEncoder
from stair_es.backends.embedded import EmbeddedBackend
from stair_es.encoders.base import register_encoder
from stair_es.errors import IndexNotFoundError, InvalidInputError
from stair_es.schema import Document
from stair_es.serve.app import create_app
from stair_es.serve.batching import Batcher, _deliver
from stair_es.serve.inbox import LoopInbox
from stair_es.serve.service import Service
from stair_es.sparse import SparseVector

from .conftest import make_config


# --- the batcher alone ------------------------------------------------------------------------
def test_batcher_serves_in_arrival_order_in_bounded_batches():
    gate = threading.Event()
    prepared: list[list[int]] = []
    ran: list[int] = []

    def prepare(items):
        gate.wait(5)  # the first batch holds the dispatcher while the others queue up
        prepared.append(list(items))
        return items

    def run(i):
        ran.append(i)
        return i * 10

    b = Batcher(prepare, run, workers=1, max_batch=4)

    async def main():
        first = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0.05)  # the dispatcher has taken request 0 alone and waits at the gate
        rest = [asyncio.ensure_future(b.submit(i)) for i in range(1, 11)]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(first, *rest)

    answers = asyncio.run(main())
    b.close()
    assert [a for a, _ in answers] == [i * 10 for i in range(11)]
    assert [i for batch in prepared for i in batch] == list(range(11)) and ran == list(range(11))  # first come, first served
    assert prepared[0] == [0] and all(len(batch) <= 4 for batch in prepared) and len(prepared) == 4
    timing = answers[5][1]
    assert timing.size == 4 and timing.queued > 0 and timing.run >= 0


def test_search_threads_take_work_straight_from_the_queue():
    """No thread between the queue and the searches: the batcher starts only its search threads,
    which prepare and search, and batches are prepared one at a time in arrival order."""
    prepared_on, batches = [], []

    def prepare(items):
        prepared_on.append(threading.current_thread().name)
        batches.append(list(items))
        return items

    before = set(threading.enumerate())
    b = Batcher(prepare, lambda i: (i, threading.current_thread().name), workers=2, max_batch=3, name="t")
    started = {t.name for t in set(threading.enumerate()) - before}

    async def main():
        return await asyncio.gather(*(b.submit(i) for i in range(12)))

    answers = asyncio.run(main())
    b.close()
    assert started == {"t-search-0", "t-search-1"}
    assert set(prepared_on) <= started and {name for (_, name), _ in answers} <= started
    assert [i for batch in batches for i in batch] == list(range(12)) and all(len(x) <= 3 for x in batches)
    assert [i for (i, _), _ in answers] == list(range(12))


def test_queue_timeout_drops_what_waited_too_long_and_serves_what_comes_next():
    gate = threading.Event()
    ran = []

    def run(i):
        if i == 0:
            gate.wait(5)  # a stall: the only thread is held
        ran.append(i)
        return i

    b = Batcher(lambda items: items, run, workers=1, max_batch=4, max_wait=0.1,
                overdue=lambda waited: LookupError(f"waited {waited:.2f} s"))

    async def main():
        first = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0.05)
        backlog = [asyncio.ensure_future(b.submit(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0.2)
        gate.set()
        done = await asyncio.gather(first, *backlog, return_exceptions=True)
        return done, await b.submit(4)

    (first, *late), after = asyncio.run(main())
    b.close()
    assert first[0] == 0 and after[0] == 4 and ran == [0, 4]
    assert all(isinstance(x, LookupError) for x in late) and b.overdue == 3


def test_queue_timeout_does_not_count_a_batchs_own_preparation():
    """A batch of query texts prepared together may take longer than the wait allowed (here 0.3 s
    against 0.1 s): its requests were being worked on, not waiting, so they are searched, not
    answered 429. The limit may be a function (the auto queue timeout follows the service times)."""
    import time as _time

    gate = threading.Event()

    def prepare(items):
        if 0 not in items:
            _time.sleep(0.3)  # one slow preparation of the whole batch
        return items

    def run(i):
        if i == 0:
            gate.wait(5)  # holds the only thread while the others queue together
        return i

    limits = []

    def limit():
        limits.append(1)
        return 0.1

    b = Batcher(prepare, run, workers=1, max_batch=8, max_wait=limit,
                overdue=lambda waited: LookupError(f"waited {waited:.2f} s"))

    async def main():
        first = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0.05)
        batch = [asyncio.ensure_future(b.submit(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0.02)
        gate.set()  # they waited about 20 ms in the queue, then 0.3 s in their own preparation
        return await asyncio.gather(first, *batch, return_exceptions=True)

    done = asyncio.run(main())
    b.close()
    assert [x[0] for x in done] == [0, 1, 2, 3] and b.overdue == 0 and limits


def test_a_slow_search_does_not_hold_the_others():
    release = threading.Event()

    def run(x):
        if x == "slow":
            release.wait(5)
        return x

    b = Batcher(lambda items: items, run, workers=2, max_batch=8, window=0.05)

    async def main():
        slow = asyncio.ensure_future(b.submit("slow"))
        fast = await asyncio.gather(*(b.submit(f"fast{i}") for i in range(5)))  # all on the other thread
        assert not slow.done()
        release.set()
        return fast, await slow

    fast, slow = asyncio.run(main())
    b.close()
    assert [a for a, _ in fast] == [f"fast{i}" for i in range(5)] and slow[0] == "slow"


def test_batcher_errors_stay_with_their_request():
    def prepare(items):
        if "boom" in items:
            raise RuntimeError("the whole batch failed")
        return [ValueError(f"bad {x}") if x == "bad" else x for x in items]

    def run(x):
        if x == "crash":
            raise KeyError("crash")
        return x.upper()

    b = Batcher(prepare, run, workers=2, max_batch=8, window=0.05)

    async def main():
        return await asyncio.gather(b.submit("a"), b.submit("bad"), b.submit("c"), b.submit("crash"),
                                    return_exceptions=True)

    a, bad, c, crash = asyncio.run(main())
    assert a[0] == "A" and c[0] == "C" and isinstance(bad, ValueError) and str(bad) == "bad bad"
    assert isinstance(crash, KeyError)

    async def alone():
        return await b.submit("boom")

    with pytest.raises(RuntimeError, match="whole batch"):
        asyncio.run(alone())
    b.close()


def test_batch_window_gathers_requests():
    sizes = []

    def prepare(items):
        sizes.append(len(items))
        return items

    b = Batcher(prepare, lambda x: x, max_batch=5, window=1.0)

    async def main():
        return await asyncio.gather(*(b.submit(i) for i in range(5)))

    asyncio.run(main())
    b.close()
    assert sizes == [5]  # the window closes as soon as the batch is full, not after 1 s


def _loops():
    """The event loops the server may run on: asyncio's own, and uvloop (uvicorn's choice when installed)."""
    factories = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:
        pass
    else:
        factories.append(uvloop.new_event_loop)
    return factories


@pytest.mark.parametrize("new_loop", _loops(), ids=lambda f: f.__module__.split(".")[0])
def test_answers_from_two_search_threads_all_reach_the_loop_with_their_own_values(new_loop):
    """The search threads hand answers over through the batcher's pipe (not call_soon_threadsafe):
    every one arrives, with its own value, however the threads and the loop interleave."""

    def run(x):
        time.sleep(0.0002 * (x % 3))  # the two threads finish in varying order
        return x * 2

    b = Batcher(lambda items: items, run, workers=2, max_batch=4)

    async def rounds():
        for k in range(40):
            n = 1 + (k * 7) % 23
            got = await asyncio.wait_for(asyncio.gather(*(b.submit(i) for i in range(n))), 10)
            assert [a for a, _ in got] == [2 * i for i in range(n)]

    loop = new_loop()
    try:
        loop.run_until_complete(rounds())
    finally:
        b.close()
        loop.close()


def test_an_answer_handed_over_while_the_loop_reads_the_pipe_is_not_stranded(monkeypatch):
    """A search thread that writes its wake-up byte while the loop is reading the pipe: the loop
    reads both bytes at once; the next answer must still wake the loop (it waited forever when
    the loop cleared its flag before the read)."""
    from stair_es.serve import inbox as inbox_module

    async def main():
        loop = asyncio.get_running_loop()
        inbox = LoopInbox(loop)
        first, during, after = (loop.create_future() for _ in range(3))
        real_read = os.read
        hooked = True

        def read_during_put(fd, n):
            nonlocal hooked
            if hooked:
                hooked = False
                inbox.call(_deliver, during, "during", None)  # as a search thread would, in the middle of the read
            return real_read(fd, n)

        monkeypatch.setattr(inbox_module.os, "read", read_during_put)
        inbox.call(_deliver, first, "first", None)
        assert (await asyncio.wait_for(first, 2))[0] == "first"
        assert (await asyncio.wait_for(during, 2))[0] == "during"
        inbox.call(_deliver, after, "after", None)
        try:
            return (await asyncio.wait_for(after, 2))[0]
        finally:
            inbox.close()

    assert asyncio.run(main()) == "after"


def test_answers_handed_over_after_the_inbox_closed_are_still_delivered():
    async def main():
        loop = asyncio.get_running_loop()
        inbox = LoopInbox(loop)
        waiting, late = loop.create_future(), loop.create_future()
        inbox.call(_deliver, waiting, "waiting", None)  # in the pipe when the inbox closes
        inbox.close()
        inbox.call(_deliver, late, "late", None)  # after close: through call_soon_threadsafe
        return [(await asyncio.wait_for(f, 2))[0] for f in (waiting, late)]

    assert asyncio.run(main()) == ["waiting", "late"]


# --- the service ------------------------------------------------------------------------------
def test_search_many_equals_one_by_one_and_keeps_errors_apart(config):
    svc = Service(config)
    bodies = [{"text": "red"}, {"text": "blue", "top_k": 2}, {"index": "nope", "text": "red"},
              {"tokens": {"green": 1.0}}, {"text": "   "}, {"text": "dark", "where": ["kind=landscape"]},
              {"text": "red", "explain": True}]
    many = svc.search_many(bodies, threads=2)
    assert isinstance(many[2], IndexNotFoundError) and isinstance(many[4], InvalidInputError)
    for body, got in zip(bodies, many):
        if isinstance(got, Exception):
            continue
        one = svc.search(body)
        assert [h["id"] for h in got["hits"]] == [h["id"] for h in one["hits"]]
        assert [h["score"] for h in got["hits"]] == [h["score"] for h in one["hits"]]
        assert got["query_tokens"] == one["query_tokens"]
    assert all(h["metadata"]["kind"] == "landscape" for h in many[5]["hits"])
    assert "explanation" in many[6]["hits"][0]
    svc.close()


def test_query_texts_of_a_batch_are_encoded_in_one_call(home, image_root):
    calls = []

    class CountingEncoder(ColorEncoder):
        name = "fake-color"

        def encode_texts(self, texts, **kw):
            calls.append(len(texts))
            return super().encode_texts(texts, **kw)

    register_encoder("fake-color", CountingEncoder)
    try:
        svc = Service(make_config(home, image_root))
        svc.search_many([{"text": "red"}, {"text": "blue"}, {"text": "green"}, {"tokens": {"red": 1.0}}])
        assert calls == [3]
        svc.close()
    finally:
        register_encoder("fake-color", ColorEncoder)


def test_searches_see_documents_added_while_the_server_runs(home, image_root):
    svc = Service(make_config(home, image_root))
    assert "purple-thing" not in [h["id"] for h in svc.search({"tokens": {"purple": 1.0}, "top_k": 50})["hits"]]
    writer = EmbeddedBackend(home)  # another process's writer, as `stair-es ingest` would be
    writer.ingest("pics", [Document(id="purple-thing", vectors={"image": SparseVector.from_token_map({"purple": 2.0})})])
    writer.close()
    hits = svc.search({"tokens": {"purple": 1.0}, "top_k": 50})["hits"]
    assert hits[0]["id"] == "purple-thing"  # the remembered schema/IDF did not hide the new commit
    assert next(i for i in svc.indices() if i["name"] == "pics")["doc_count"] == 7
    svc.close()


# --- over HTTP --------------------------------------------------------------------------------
def test_concurrent_searches_are_batched_and_answered_like_single_ones(home, image_root):
    httpx = pytest.importorskip("httpx")
    app = create_app(make_config(home, image_root, max_batch=6, batch_window_ms=500, workers=2))
    queries = [{"text": t, "top_k": 3} for t in ("red", "blue", "green", "dark", "bright", "white")]

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            together = await asyncio.gather(*(http.post("/v1/search", json=q) for q in queries))
            alone = [await http.post("/v1/search", json=q) for q in queries]
            bad = await asyncio.gather(http.post("/v1/search", json={"text": "red", "index": "nope"}),
                                       http.post("/v1/search", json={"text": "red"}))
        return together, alone, bad

    together, alone, bad = asyncio.run(main())
    for t, a in zip(together, alone):
        assert t.status_code == a.status_code == 200
        assert [h["id"] for h in t.json()["hits"]] == [h["id"] for h in a.json()["hits"]]
    assert all('search;dur=' in r.headers["server-timing"] and 'desc="batch of 6"' in r.headers["server-timing"]
               for r in together)
    assert bad[0].status_code == 404 and bad[0].json()["error"]["type"] == "IndexNotFoundError"
    assert bad[1].status_code == 200  # its batch-mate's error is not its own


def test_batching_off_answers_the_same(client, home, image_root):
    from fastapi.testclient import TestClient

    with TestClient(create_app(make_config(home, image_root, batching="off"))) as off:
        a = off.post("/v1/search", json={"text": "red"})
    b = client.post("/v1/search", json={"text": "red"})
    assert a.status_code == b.status_code == 200
    assert a.json()["hits"] == b.json()["hits"] and a.json()["query_tokens"] == b.json()["query_tokens"]
    assert "queue;" not in a.headers["server-timing"] and "queue;" in b.headers["server-timing"]


def test_bad_batching_mode_is_refused(home, image_root):
    with pytest.raises(InvalidInputError, match="auto, on or off"):
        create_app(make_config(home, image_root, batching="sometimes"))


def test_batched_searches_past_the_queue_get_429(home, image_root):
    httpx = pytest.importorskip("httpx")
    import time

    class SlowEncoder(ColorEncoder):
        name = "fake-color"

        def encode_texts(self, texts, **kw):
            time.sleep(0.5)
            return super().encode_texts(texts, **kw)

    register_encoder("fake-color", SlowEncoder)
    try:
        app = create_app(make_config(home, image_root, workers=1, max_queue=1, queue_timeout_ms=None,
                                     load_encoder_at_start=False))  # only --max-queue counts

        async def main():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
                return await asyncio.gather(*(http.post("/v1/search", json={"text": "red"}) for _ in range(4)))

        answers = asyncio.run(main())
        codes = sorted(r.status_code for r in answers)
    finally:
        register_encoder("fake-color", ColorEncoder)
    assert codes == [200, 200, 429, 429], codes  # workers + max_queue = 2 admitted, the rest refused at once
    shed = next(r for r in answers if r.status_code == 429)
    assert int(shed.headers["retry-after"]) >= 1 and int(shed.headers["retry-after-ms"]) >= 1
    assert shed.json()["error"]["retry_after_ms"] == int(shed.headers["retry-after-ms"])


def test_the_search_threads_cpu_clock_agrees_with_thread_time():
    """``engine_cpu`` and ``answer_cpu`` are read by :func:`thread_cpu_s` (the system call made
    with the GIL released): the same clock as ``time.thread_time()``, not the process's nor the wall's."""
    from stair_es.serve.clocks import thread_cpu_s

    c0, t0 = thread_cpu_s(), time.thread_time()
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:  # 50 ms of this thread's own CPU
        pass
    c1, t1 = thread_cpu_s(), time.thread_time()
    assert abs((c1 - c0) - (t1 - t0)) < 0.005
    slept0 = thread_cpu_s()
    time.sleep(0.05)  # waiting is not CPU
    assert thread_cpu_s() - slept0 < 0.01


def test_a_batcher_used_from_loop_after_loop_keeps_no_pipe_of_the_ended_ones():
    """Each event loop gets its own inbox (a pipe); once a loop has ended, the next loop's first request closes
    the ended one's, so a batcher driven from many short-lived loops does not gather open descriptors."""
    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("counts open descriptors in /proc/self/fd (Linux)")
    b = Batcher(lambda items: items, lambda x: x + 1, workers=1, max_batch=1)
    try:
        counts = []
        for i in range(6):
            loop = asyncio.new_event_loop()
            try:
                assert loop.run_until_complete(b.submit(i))[0] == i + 1
            finally:
                loop.close()
            counts.append(open_fds())
        assert counts[-1] == counts[1], counts  # flat after the first loops (it grew by a pipe a loop before)
    finally:
        b.close()


# --- the worker pool (encoding, explain, thumbnails) hands its answers over the same way ---------------
class _CountingLoop(asyncio.SelectorEventLoop):
    """An asyncio loop that counts ``call_soon_threadsafe`` (the hand-over that holds the GIL while it wakes the loop)."""

    threadsafe_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        type(self).threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_the_worker_pools_answers_and_errors_reach_the_loop_through_its_inbox():
    """Each pool job ends with one hand-over through the loop's pipe (before: two call_soon_threadsafe
    per job, the slot's release and the result); results, errors and the freed slots all arrive."""
    from stair_es.serve.admission import Admission

    adm = Admission(workers=2, max_queue=64)

    def work(x):
        time.sleep(0.0003 * (x % 3))
        if x % 5 == 4:
            raise ValueError(f"bad input {x}")
        return x * 3

    async def main():
        return await asyncio.gather(*(adm.run(work, i) for i in range(30)), return_exceptions=True)

    loop = _CountingLoop()
    _CountingLoop.threadsafe_calls = 0
    try:
        got = loop.run_until_complete(main())
    finally:
        adm.close()
        loop.close()
    for i, g in enumerate(got):
        if i % 5 == 4:
            assert isinstance(g, ValueError) and str(g) == f"bad input {i}"
        else:
            assert g == i * 3
    assert _CountingLoop.threadsafe_calls == 0
    assert adm.admitted == 0 and adm._busy == 0 and not adm._waiting  # every slot given back


@pytest.mark.parametrize("new_loop", _loops(), ids=lambda f: f.__module__.split(".")[0])
def test_a_pool_job_past_its_deadline_frees_its_slot_when_it_ends(new_loop):
    """A job answered 504 keeps its worker until it ends (a thread cannot be stopped); then its slot goes to
    the next in line, whose answer arrives."""
    from stair_es.serve.admission import Admission
    from stair_es.serve.errors import RequestTimeoutError

    adm = Admission(workers=1, max_queue=8, request_timeout=0.05)

    async def main():
        slow = await asyncio.gather(adm.run(time.sleep, 0.2), return_exceptions=True)
        await asyncio.sleep(0.3)  # the slow job ends meanwhile, on its worker
        return slow[0], await adm.run(lambda: "next")  # would wait past its own deadline if the slot stayed held

    loop = new_loop()
    try:
        slow, after = loop.run_until_complete(main())
    finally:
        adm.close()
        loop.close()
    assert isinstance(slow, RequestTimeoutError) and after == "next"


def test_a_pool_job_dropped_at_shutdown_is_cancelled_and_frees_its_slot():
    """A job still waiting in the pool when it shuts down never runs: its caller is cancelled (not left waiting
    forever) and its slot is given back."""
    import threading

    from stair_es.serve.admission import Admission

    adm = Admission(workers=1, max_queue=8)
    gate = threading.Event()
    adm._pool.submit(gate.wait, 5)  # the pool's one thread kept busy outside the admission: the next job waits

    async def main():
        job = asyncio.ensure_future(adm.run(lambda: "never run"))
        await asyncio.sleep(0.05)
        adm._pool.shutdown(wait=False, cancel_futures=True)
        try:
            return await asyncio.wait_for(job, 2)
        except asyncio.CancelledError:
            return "cancelled"

    try:
        got = asyncio.run(main())
    finally:
        gate.set()
        adm.close()
    assert got == "cancelled" and adm._busy == 0 and adm.admitted == 0
