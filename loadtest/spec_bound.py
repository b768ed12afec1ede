"""How much faster exact n-gram speculation could make a request at best, at measured step
costs: the bound `spec_bench` prints beside its measured ratios.

Greedy speculation leaves the output as it is, so the tokens a request will produce are
known from a run without it. At each output position an oracle looks at every earlier
occurrence of the last `min_n` tokens, in the request's own tokens and in the outputs of
the requests before it (every match an n-gram proposer with that shortest n can make: a
longer match holds the shorter one), and takes the continuation that the output follows
furthest, up to k tokens: no proposer of continuations can have more of its proposal
accepted there. `fewest_ms` then finds, by dynamic programming over the output, the
cheapest way through it when each step may verify any number of proposed tokens up to
that (a step verifying j tokens costing `costs[j]`, a plain step `costs[0]`): a lower
bound on the decode time of any such proposer, with adaptive k and rests chosen in
hindsight. `proposer_ms` models the shipped proposer over the same output at the same
costs, so the model can be checked against the measured ratio.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from types import SimpleNamespace


def oracle_accepted(context: Sequence[int], upcoming: Sequence[int], k: int, min_n: int,
                    history: Sequence[Sequence[int]] = ()) -> int:
    """The most leading tokens of upcoming[:k] that follow an earlier occurrence of the
    context's last min_n tokens, in the context or in one of the history's outputs."""
    if len(context) <= min_n:
        return 0
    suffix = list(context[-min_n:])
    want = list(upcoming[:k])
    best = 0
    for tokens, end in [(context, len(context) - 1), *((h, len(h)) for h in history)]:
        for start in range(end - min_n + 1):
            if tokens[start:start + min_n] == suffix:
                best = max(best, common_prefix(tokens[start + min_n:start + min_n + k], want))
                if best == len(want):
                    return best
    return best


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def fewest_ms(accepted: Sequence[int], costs: Sequence[float]) -> float:
    """The least time to produce len(accepted) tokens when the step at position i may
    verify up to accepted[i] proposed tokens, all accepted, and a step verifying j tokens
    produces j + 1 of them for costs[j] ms (costs[0]: a plain decode step)."""
    best = [0.0] * (len(accepted) + 1)  # best[i]: the least time from position i to the end
    for i in range(len(accepted) - 1, -1, -1):
        best[i] = min(costs[j] + best[min(len(accepted), i + j + 1)]
                      for j in range(min(accepted[i], len(costs) - 1) + 1))
    return best[0]


def oracle_positions(prompt: Sequence[int], output: Sequence[int], k: int, min_n: int,
                     history: Sequence[Sequence[int]]) -> list[int]:
    """accepted[i] for each output token after the first (the prefill's), as
    `fewest_ms` takes it."""
    prompt = list(prompt)
    return [oracle_accepted(prompt + list(output[:i]), output[i:], k, min_n, history)
            for i in range(1, len(output))]


def proposer_ms(make_proposer: Callable, prompts: Sequence[Sequence[int]],
                outputs: Sequence[Sequence[int]], k: int, costs: Sequence[float],
                history: Sequence[Sequence[int]] = ()) -> float:
    """The modeled decode time of one proposer (a fresh one from make_proposer, its history
    holding `history`'s outputs, shared by the requests in turn as in an engine) over the
    outputs after their first tokens: each step proposes, the output's next tokens accept
    the leading ones that match, and the step costs costs[proposed]."""
    proposer, total = make_proposer(), 0.0
    for output in history:
        if proposer.history is not None:
            proposer.history.add(list(output))
    for n, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        request = SimpleNamespace(request_id=f"model-{n}", all_token_ids=[*prompt, output[0]],
                                  output_token_ids=[output[0]])
        i = 1
        while i < len(output):
            drafts = proposer.propose(request, min(k, len(output) - i))
            accepted = common_prefix(drafts, output[i:])
            if drafts:
                proposer.record(request, len(drafts), accepted)
            total += costs[len(drafts)]
            emitted = list(output[i:i + accepted + 1])
            request.all_token_ids += emitted
            request.output_token_ids += emitted
            i += len(emitted)
        proposer.forget(request)
    return total


def step_costs(step_ms: dict[int, list[float]], k: int) -> list[float]:
    """costs[j] for j in 0..k: the mean of the step times measured by proposed tokens
    verified (the mean, as the bound is on total time), lowered to the least of those for
    j or more tokens, so that costs never fall as j grows: `fewest_ms` charges a step
    that accepts m tokens costs[m], which must not exceed what a step that proposed more
    cost (a rare count's noisy mean can sit above a larger one's). A count never measured
    takes the cost of the largest one below it that was."""
    costs: list[float] = []
    for j in range(k + 1):
        times = step_ms.get(j)
        costs.append(statistics.fmean(times) if times else costs[-1])
    for j in range(k - 1, -1, -1):
        costs[j] = min(costs[j], costs[j + 1])
    return costs
