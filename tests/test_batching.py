"""Token-budget batching (clfjudge.batching) and the server's Batcher driven by it: every sequence or request is
served exactly once, no batch is over budget unless one request alone is, and every caller gets its own results
back in order."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clfjudge.batching import Budget, next_call, padded_tokens, token_batches
from clfjudge.serving.server import Batcher, Limits, Stats

lengths_st = st.lists(st.integers(0, 600), max_size=60)
budget_st = st.one_of(st.none(), st.integers(1, 3000))


def test_padded_tokens_counts_rows_times_the_longest():
    assert padded_tokens([3, 10, 5]) == 30
    assert padded_tokens([]) == 0


@settings(deadline=None)  # no timed assertions: the machine is shared
@given(lengths_st, st.integers(1, 16), budget_st, st.one_of(st.none(), st.floats(0, 1)))
def test_token_batches_cover_every_index_once_within_budget(lengths, max_rows, budget, max_padding):
    batches = token_batches(lengths, max_rows, budget, max_padding)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert 1 <= len(b) <= max_rows
        padded = padded_tokens([lengths[i] for i in b])
        assert budget is None or len(b) == 1 or padded <= budget
        assert max_padding is None or padded - sum(lengths[i] for i in b) <= max_padding * padded + 1e-9
    # length buckets: each batch is a run of the sorted lengths
    for first, second in zip(batches, batches[1:]):
        assert max(lengths[i] for i in first) <= min(lengths[i] for i in second)


def test_token_batches_cut_at_the_budget_not_only_at_the_row_count():
    assert token_batches([100, 10, 10, 100], 8, 200) == [[1, 2], [0, 3]]
    assert token_batches([100, 10, 10, 100], 8) == [[1, 2, 0, 3]]
    assert token_batches([500, 10], 8, 100) == [[1], [0]]  # one over the budget runs alone
    assert token_batches([100, 10, 10, 95], 8, None, 0.1) == [[1, 2], [3, 0]]  # 10 with 95: 45% padding


@pytest.mark.parametrize("max_rows, budget, padding", [(0, None, None), (4, 0, None), (4, -5, None), (4, 9, 1.5)])
def test_a_budget_that_admits_nothing_is_refused(max_rows, budget, padding):
    with pytest.raises(ValueError):
        token_batches([1, 2], max_rows, budget, padding)


queued_st = st.lists(st.tuples(st.integers(1, 4), st.lists(st.integers(0, 600), max_size=8)), max_size=30)


@settings(deadline=None)
@given(queued_st, st.integers(1, 40), budget_st)
def test_next_call_takes_the_oldest_requests_in_order_while_they_fit(queued, max_items, budget):
    chosen = next_call(queued, max_items, budget)
    if not queued:
        assert chosen == []
        return
    assert chosen == list(range(len(chosen))) and chosen  # a prefix of the queue: no request is overtaken

    def fits(k: int) -> bool:
        cost = padded_tokens([n for j in range(k) for n in queued[j][1]])
        return sum(queued[j][0] for j in range(k)) <= max_items and (budget is None or cost <= budget)

    assert len(chosen) == 1 or fits(len(chosen))  # the oldest goes even over the limits, alone
    assert len(chosen) == len(queued) or not fits(len(chosen) + 1)  # the next one would not fit


def test_next_call_keeps_the_queue_order():
    queued = [(1, [100]), (1, [900]), (1, [110]), (1, [95]), (1, [400])]
    assert next_call(queued, 3) == [0, 1, 2]  # the next in line, whatever their lengths
    assert next_call(queued, 8, 2000) == [0, 1]  # a third at 900 tokens wide would cost 2700
    assert next_call(queued, 8, 400) == [0]  # the next in line does not fit: the call ends there
    assert next_call([(1, [5000]), (1, [10])], 8, 100) == [0]  # over budget: alone
    assert next_call([(1, [50]), (1, []), (1, [40])], 8, 90) == [0, 1]  # a cache hit is free; 2 rows x 50 are not


# -- the server's Batcher on this policy ------------------------------------------------------------------

requests_st = st.lists(st.tuples(st.lists(st.integers(1, 300), min_size=1, max_size=4), st.booleans()),
                       min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(requests_st, st.integers(1, 8), budget_st, st.integers(0, 3))
def test_the_batcher_serves_every_request_once_in_order_within_budget(requests, max_batch, budget, delay_every):
    """Each request is a list of items (an item is its own token length) and an order mode; the judge echoes
    its items. Calls may merge requests, never modes, and never go over budget unless one request alone is."""
    calls: list[tuple[list[tuple[int, int]], bool]] = []

    def run(items, symmetric):
        calls.append(([(it["req"], it["pos"]) for it in items], symmetric))
        return [{"req": it["req"], "pos": it["pos"], "symmetric": symmetric} for it in items]

    async def main():
        limits = Limits(budget=Budget(max_batch, budget), max_wait_ms=1, max_queue=10_000)
        batcher = Batcher(run, limits, Stats())
        batcher.start()

        async def client(r, lengths, symmetric):
            if delay_every and r % delay_every == 0:
                await asyncio.sleep(0)  # let some arrive while a call runs
            items = [{"req": r, "pos": i} for i in range(len(lengths))]
            return await batcher.submit(items, symmetric, lengths)

        got = await asyncio.gather(*(client(r, lengths, sym) for r, (lengths, sym) in enumerate(requests)))
        await batcher.drain()
        return got, batcher

    got, batcher = asyncio.run(main())
    for r, ((lengths, symmetric), results) in enumerate(zip(requests, got)):
        assert results == [{"req": r, "pos": i, "symmetric": symmetric} for i in range(len(lengths))]
    served = [key for items, _ in calls for key in items]
    assert sorted(served) == sorted((r, i) for r, (lengths, _) in enumerate(requests) for i in range(len(lengths)))
    for items, symmetric in calls:
        reqs = sorted({r for r, _ in items})
        assert all(requests[r][1] is symmetric for r in reqs)
        if len(reqs) > 1:
            assert len(items) <= max_batch
            assert budget is None or padded_tokens([requests[r][0][i] for r, i in items]) <= budget
    assert batcher.queued_items == 0 and batcher.queue == []


# -- the same policy in-process: results do not depend on how the sequences were batched -------------------

@pytest.mark.parametrize("head", ["cls3", "reward"])
def test_a_judge_gives_the_same_results_under_any_token_budget(tiny_bert_dir, tmp_path, head):
    from tiny_judges import make_judge

    from clfjudge.judges.base import Judge, as_pair

    directory = make_judge(tiny_bert_dir, tmp_path / head, head)
    judge = Judge.load(directory, batch_size=4)
    words = "the a prime number seven is odd and nine is not".split()
    pairs = [{"question": "Name a prime " + " ".join(words[:i % 5]), "answer_a": " ".join(words[:i % 11 + 1]),
              "answer_b": " ".join(words[(i * 3) % 7:])} for i in range(13)]
    unbudgeted = judge.compare_batch(pairs)
    lengths = judge.sequence_lengths([as_pair(p) for p in pairs])
    assert len(lengths) == len(pairs) and all(len(seqs) == (2 if head == "reward" else 1) for seqs in lengths)
    assert judge.truncation["records"] == len(pairs) * len(lengths[0])  # measuring does not count as encoding
    budgets = [(max(n for seqs in lengths for n in seqs), None), (None, 0.0)]  # ~ one sequence / equal lengths
    for tokens, padding in budgets:  # the budget is the caller's, given when the judge loads
        budgeted = Judge.load(directory, batch_size=4, max_batch_tokens=tokens, max_padding=padding)
        assert budgeted.budget == Budget(4, tokens, padding)
        for want, got in zip(unbudgeted, budgeted.compare_batch(pairs)):
            assert got.verdict == want.verdict
            assert (got.p_a, got.p_tie, got.p_b) == pytest.approx((want.p_a, want.p_tie, want.p_b), abs=1e-5)
