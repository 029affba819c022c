"""VTC inside the real transformers continuous-batching engine (tiny random Llama on the CPU)."""

import asyncio
import logging
import threading

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fairserve.core import make_policy, theorem_bound  # noqa: E402
from fairserve.engines.hf_engine import EngineError, EngineSizing, HFEngine  # noqa: E402
from fairserve.engines.hf_models import load_model  # noqa: E402
from fairserve.engines.hf_scheduler import FairScheduler  # noqa: E402

PROMPT, OUTPUT = 30, 20  # tokens per request
SMALL = 8, 8  # one 16-token page each
W_P, W_Q = 1, 2


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


def bound(sizing: EngineSizing, prompt: int = PROMPT) -> float:
    """Theorem 4.4: 2·max(w_p·L_in, w_q·M), M = the KV pool in tokens."""
    return theorem_bound(prompt, sizing.kv_tokens, W_P, W_Q)


class Trace:
    """Every client's service and queue length after each charged step, seen from inside the engine."""

    def __init__(self, engine: HFEngine) -> None:
        self.rows: list[dict[str, tuple[float, int]]] = []
        self.exact: list[tuple[float, float]] = []  # (charged before reconciling, actual cost) per finished request
        q = engine.queue
        output, finished = q.output, q.finished

        def traced_output(rid, tokens=1):
            output(rid, tokens)
            self.rows.append({c: (a.service, a.queued) for c, a in q.accounts().items()})

        def traced_finished(rid, output_tokens=None):
            req = q.request(rid)
            if req is not None:
                self.exact.append((req.charged, W_P * req.prompt_tokens + W_Q * output_tokens))
            finished(rid, output_tokens)

        q.output, q.finished = traced_output, traced_finished

    def backlogged_gap(self, weights: dict[str, float]) -> float:
        """The largest difference of weighted service while every client is backlogged."""
        gaps = [
            max(r[c][0] / w for c, w in weights.items()) - min(r[c][0] / w for c, w in weights.items())
            for r in self.rows
            if all(c in r and r[c][1] > 0 for c in weights)
        ]
        assert gaps, "the clients were never backlogged together"
        return max(gaps)


def run_clients(
    engine: HFEngine, counts: dict[str, int], prompt: int = PROMPT, output: int = OUTPUT
) -> list[tuple[str, int, int]]:
    """All requests at once, each client's spread evenly over the arrival order (the heavy client sends three
    for each of the light one's); (client, prompt, output) per request. Not streamed: handing every token to the
    event loop costs more than the tiny model's step."""
    order = [c for _, c in sorted(((k + 1) / n, c) for c, n in counts.items() for k in range(n))]

    async def one(client: str, i: int) -> tuple[str, int, int]:
        out = None
        async for out in engine.generate(  # noqa: B007  # the last item is the result
            client, [3 + i % 200] * (prompt - 1) + [7], output, ignore_eos=True, stream=False
        ):
            pass
        return client, len(out.prompt_ids), len(out.generated_tokens)

    async def main():
        results = await asyncio.gather(*(one(c, i) for i, c in enumerate(order)))
        for _ in range(50):  # the scheduler settles a finish at its next loop turn
            if all(a.running == 0 for a in engine.accounts().values()):
                break
            await asyncio.sleep(0.02)
        return results

    return asyncio.run(main())


def started(tiny, policy, sizing: EngineSizing, weights=None) -> HFEngine:
    model, tok = tiny
    engine = HFEngine(model, tok, policy, sizing, weights=weights)
    engine.start()
    return engine


SIZING = EngineSizing(num_blocks=8, page_size=16, max_batch_tokens=64, max_requests_per_batch=8)  # M = 128
# NOTE: the bound grows with M, and so do the tokens FIFO needs to exceed it: half the pool, half the tokens
HALF = EngineSizing(num_blocks=4, page_size=16, max_batch_tokens=64, max_requests_per_batch=8)  # M = 64


def served(results, client):
    return sum(W_P * p + W_Q * o for c, p, o in results if c == client)


@pytest.mark.parametrize("policy", ["vtc", "fcfs"])
def test_heavy_client_three_times_more(tiny, policy):
    engine = started(tiny, make_policy(policy), HALF)
    try:
        assert isinstance(engine.manager.batch_processor.scheduler, FairScheduler)  # not transformers' fallback
        trace = Trace(engine)
        # NOTE: FIFO's gap grows by (3/4 - 1/4) of each request's 24 cost units: 60 requests make ~720 > 2·256
        results = run_clients(engine, {"heavy": 45, "light": 15}, *SMALL)
        accounts = engine.accounts()
    finally:
        engine.stop()
    assert all(o == SMALL[1] for _, _, o in results)
    # the counters are exactly the tokens the engine processed, and were exact before any reconciliation
    for client in ("heavy", "light"):
        assert accounts[client].service == served(results, client)
    assert trace.exact and all(charged == actual for charged, actual in trace.exact)
    gap = trace.backlogged_gap({"heavy": 1, "light": 1})
    if policy == "vtc":
        assert gap <= bound(HALF, SMALL[0])
    else:  # FIFO serves the heavy client three requests for every one of the light client's
        assert gap > 2 * bound(HALF, SMALL[0])


def test_weights_one_to_two(tiny):
    engine = started(tiny, make_policy("vtc"), SIZING, weights={"one": 1, "two": 2})
    try:
        trace = Trace(engine)
        results = run_clients(engine, {"one": 24, "two": 24})
    finally:
        engine.stop()
    assert trace.backlogged_gap({"one": 1, "two": 2}) <= bound(SIZING)
    last = [r for r in trace.rows if r["one"][1] > 0 and r["two"][1] > 0][-1]
    assert last["two"][0] / last["one"][0] == pytest.approx(2, rel=0.25)
    assert served(results, "one") + served(results, "two") == 48 * (W_P * PROMPT + W_Q * OUTPUT)


def test_evict_and_recompute_is_not_charged_twice(tiny):
    # six 16-token pages: three requests fit at admission, then run out of pages while decoding
    small = EngineSizing(num_blocks=6, page_size=16, max_batch_tokens=64, max_requests_per_batch=8)
    engine = started(tiny, make_policy("vtc"), small)
    preempted: list[str] = []
    requeue = engine.queue.preempted
    engine.queue.preempted = lambda rid, item: preempted.append(rid) or requeue(rid, item)
    try:
        trace = Trace(engine)
        results = run_clients(engine, {"a": 4, "b": 4})
        accounts = engine.accounts()
    finally:
        engine.stop()
    assert preempted, "the cache was large enough: nothing was evicted"
    assert all(o == OUTPUT for _, _, o in results)
    assert trace.exact and all(charged == actual for charged, actual in trace.exact)
    assert accounts["a"].service == served(results, "a") and accounts["b"].service == served(results, "b")


def test_cancel_charges_only_what_was_generated(tiny):
    engine = started(tiny, make_policy("vtc"), SIZING)

    async def main():
        gen = engine.generate("c", [5] * PROMPT, 200, ignore_eos=True)
        async for out in gen:
            if len(out.generated_tokens) >= 5:
                break
        await gen.aclose()
        for _ in range(100):
            acct = engine.accounts()["c"]
            if acct.running == 0:
                return acct
            await asyncio.sleep(0.02)
        raise AssertionError("the cancelled request never left the engine")

    try:
        acct = asyncio.run(main())
    finally:
        engine.stop()
    # 5 tokens were seen; the engine may have produced a few more before the cancel reached it, never 200
    assert W_P * PROMPT + W_Q * 5 <= acct.service <= W_P * PROMPT + W_Q * 20


def test_scheduler_exception_fails_requests_with_a_clear_error(tiny, caplog):
    policy = make_policy("vtc")
    engine = started(tiny, policy, SIZING)

    def broken():
        raise ValueError("policy exploded")

    policy.peek = broken

    async def main():
        async for _ in engine.generate("c", [5] * PROMPT, 10):
            pass

    try:
        with caplog.at_level(logging.ERROR), pytest.raises(EngineError, match="policy exploded"):
            asyncio.run(asyncio.wait_for(main(), 20))
        with pytest.raises(EngineError, match="policy exploded"):  # and the next one too, at once
            asyncio.run(asyncio.wait_for(main(), 5))
    finally:
        engine.stop()
    assert "policy exploded" in caplog.text


def test_fifo_baseline_uses_transformers_own_scheduler(tiny):
    engine = started(tiny, None, SIZING)
    try:
        assert not isinstance(engine.manager.batch_processor.scheduler, FairScheduler)
        results = run_clients(engine, {"a": 3})
    finally:
        engine.stop()
    assert [o for _, _, o in results] == [OUTPUT] * 3 and engine.accounts() == {}


def test_admits_no_more_than_one_batch(tiny):
    """Requests beyond one batch wait in the policy's queue. Identical prompts make admission nearly free (prefix
    sharing) while decodes starve for pages: left to itself, transformers keeps admitting into the slots the
    starved requests leave in the batch (10 active here), and the oldest-first decode order then decides."""
    sizing = EngineSizing(num_blocks=16, page_size=16, max_batch_tokens=128, max_requests_per_batch=4)
    engine = started(tiny, make_policy("vtc"), sizing)
    scheduler = engine.manager.batch_processor.scheduler
    inner, active = scheduler.schedule_batch, []

    def schedule_batch(token_budget, cache_budget):
        out = inner(token_budget, cache_budget)
        active.append(len(scheduler.active_requests))
        return out

    scheduler.schedule_batch = schedule_batch

    async def one(i):
        out = None
        async for out in engine.generate("ab"[i % 2], [5] * PROMPT, 60, ignore_eos=True, stream=False):  # noqa: B007  # the last item is the result
            pass
        return len(out.generated_tokens)

    async def main():
        return await asyncio.gather(*(one(i) for i in range(24)))

    try:
        produced = asyncio.run(main())
    finally:
        engine.stop()
    assert produced == [60] * 24 and max(active) == 4


def test_a_counter_reset_from_another_thread_cannot_reorder_an_admission(tiny):
    """The HTTP thread's POST /admin/reset lands between the scheduler's peek and pop: it must wait for the pop
    (else the policy pops another request than the one transformers scheduled, and the engine breaks)."""
    engine = started(
        tiny,
        make_policy("vtc"),
        EngineSizing(num_blocks=32, page_size=16, max_batch_tokens=64, max_requests_per_batch=2),
    )
    q = engine.queue
    peek, pop, fired, peeked, popped = q.peek, q.pop, [], [], []

    def reset_from_another_thread():
        with q.lock:
            q.reset()

    def recording_peek():
        peeked.append(peek())
        return peeked[-1]

    def racing_pop():
        if len(q.ledger.backlogged()) == 2 and not fired:
            fired.append(threading.Thread(target=reset_from_another_thread))
            fired[0].start()
            fired[0].join(0.1)  # runs now unless the scheduler holds the lock across peek → pop
        popped.append((peeked[-1], pop()))
        return popped[-1][1]

    q.peek, q.pop = recording_peek, racing_pop

    async def one(client):
        out = None
        async for out in engine.generate(client, [5] * PROMPT, 30, ignore_eos=True, stream=False):  # noqa: B007  # the last item is the result
            pass
        return len(out.generated_tokens)

    async def main():
        first = [asyncio.ensure_future(one("a")) for _ in range(3)]
        while len(popped) < 2:  # both slots taken by "a": its third request waits, then "b" arrives
            await asyncio.sleep(0.005)
        return await asyncio.wait_for(asyncio.gather(*first, *(one("b") for _ in range(3))), 120)

    try:
        produced = asyncio.run(main())
    finally:
        engine.stop()
    assert fired and produced == [30] * 6 and len(popped) == 6
    assert all(admitted is scheduled for scheduled, admitted in popped)  # the pop took the request peeked


def test_a_cancel_that_lands_as_an_output_arrives_is_not_lost():
    """The server's drain cancels a stream's task while the generation thread keeps delivering outputs: the wait for
    the next output must raise the cancel (a lost one keeps a cancelled request generating, and the shutdown waits)."""
    from fairserve.engines.hf_engine import _Latest

    async def trial(turns: int) -> str:
        latest = _Latest()
        task = asyncio.create_task(latest.get(10.0))
        await asyncio.sleep(0)
        latest.put(object())  # type: ignore[arg-type]
        for _ in range(turns):
            await asyncio.sleep(0)
        if task.done():
            return "delivered"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "lost"

    async def trials() -> list[str]:
        return [await trial(k) for k in range(4)]

    outcomes = asyncio.run(trials())
    assert "lost" not in outcomes and "cancelled" in outcomes, outcomes
