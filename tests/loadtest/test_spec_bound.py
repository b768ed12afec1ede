"""The speculation bound spec_bench prints (loadtest.spec_bound): the oracle's accepted
tokens, the cheapest path through an output, and that no proposer of continuations beats
the bound."""
import random
import re
import subprocess
import sys

from engine.speculative import NgramProposer
from engine.speculative.ngram import find_continuation
from loadtest.spec_bound import (
    fewest_ms,
    oracle_accepted,
    oracle_positions,
    proposer_ms,
    step_costs,
)


def test_the_oracle_takes_the_occurrence_the_output_follows_furthest():
    context = [1, 2, 3, 7, 8, 9, 5, 1, 2, 3, 7, 4, 6, 1, 2, 3]
    assert find_continuation(context, 3, 3, 16) == [7, 4, 6]  # the latest occurrence
    assert oracle_accepted(context, [7, 8, 9, 0], 3, 3) == 3
    assert oracle_accepted(context, [7, 4, 0], 3, 3) == 2
    assert oracle_accepted(context, [5], 3, 3) == 0
    assert oracle_accepted([9, 1, 2, 3], [7, 8], 3, 3) == 0  # [1, 2, 3] met only at the end
    assert oracle_accepted([9, 1, 2, 3], [7, 8], 3, 3, history=[[1, 2, 3, 7]]) == 1
    assert oracle_accepted([2, 3, 7, 8, 5, 2, 3], [7, 8], 3, 3) == 0  # only 2 tokens match


def test_fewest_ms_finds_the_cheapest_way_through_an_output():
    accepted = [3, 0, 0, 0, 1, 0]
    # verify 3 at 0 (tokens 0-3), verify 1 at 4 (tokens 4-5): 2.0 + 1.6
    assert fewest_ms(accepted, [1.0, 1.6, 1.8, 2.0]) == 3.6
    # a verification dearer than the plain steps it saves: plain steps only
    assert fewest_ms(accepted, [1.0, 2.5, 3.5, 4.5]) == 6.0
    # proposing fewer than the oracle allows when that is cheaper: 2 at 0 then plain
    assert fewest_ms([3, 0, 0], [1.0, 1.6, 1.8, 9.0]) == 1.8


def copying_request(rng: random.Random, earlier: list[list[int]]) -> tuple[list, list]:
    """A prompt of a few ids and an output that copies runs of the prompt or of an earlier
    output, with new ids between them."""
    prompt = [rng.randrange(12) for _ in range(rng.randrange(10, 40))]
    output = [rng.randrange(12)]
    while len(output) < 40:
        source = rng.choice([prompt, *earlier[-2:]])
        if rng.random() < 0.6 and len(source) > 8:
            start = rng.randrange(len(source) - 8)
            output += source[start:start + rng.randrange(3, 9)]
        else:
            output.append(rng.randrange(12, 20))
    return prompt, output


def test_no_proposer_of_continuations_beats_the_bound():
    """Over random copying requests (quoting their prompts and earlier outputs): the shipped
    proposer, modeled at several step costs, never takes less time than the oracle's bound,
    which a perfect draft's never exceeds; and the bound is below the proposer's often,
    so the comparison has teeth."""
    rng = random.Random(0)
    below = cases = 0
    for _ in range(40):
        prompts, outputs = [], []
        for _ in range(3):
            prompt, output = copying_request(rng, outputs)
            prompts.append(prompt)
            outputs.append(output)
        for costs in ([1.0, 1.2, 1.3, 1.4], [1.0, 1.5, 1.7, 1.9], [1.0, 2.0, 2.4, 2.8]):
            shipped = proposer_ms(lambda: NgramProposer(3, min_n=3, max_n=16,
                                                        history_tokens=1000),
                                  prompts, outputs, 3, costs)
            bound = perfect = 0.0
            for n, (prompt, output) in enumerate(zip(prompts, outputs)):
                accepted = oracle_positions(prompt, output, 3, 3, outputs[:n])
                bound += fewest_ms(accepted, costs)
                perfect += fewest_ms([3] * len(accepted), costs)
            assert perfect <= bound <= shipped + 1e-9
            below += bound < 0.9 * shipped
            cases += 1
    assert cases // 4 < below < cases


def test_step_costs_fill_gaps_from_below_and_never_fall_as_k_grows():
    assert step_costs({0: [5.0, 7.0], 1: [8.0], 3: [10.0]}, 3) == [6.0, 8.0, 8.0, 10.0]
    assert step_costs({0: [5.0], 1: [9.8], 2: [7.7], 3: [9.0]}, 3) == [5.0, 7.7, 7.7, 9.0]


def test_spec_bench_prints_each_datasets_bounds_in_order():
    """`python -m loadtest.spec_bench` on the default model, a few tokens a request: per
    dataset the shipped proposer's modeled ratios, the oracle's and the perfect draft's,
    each no lower than the one before (submit-to-last and decode)."""
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest.spec_bench", "--copy-prompts", "1",
         "--max-tokens", "12"], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("perfect draft")[-1].splitlines()[1:]
    assert [line.split()[0] for line in table] == ["copy-heavy", "short", "chat"]
    for line in table:
        ratios = [float(x.rstrip("x")) for x in re.findall(r"[\d.]+x", line)]
        assert len(ratios) == 6
        shipped, oracle, perfect = ratios[0:2], ratios[2:4], ratios[4:6]
        assert shipped[0] <= oracle[0] <= perfect[0] and shipped[1] <= oracle[1] <= perfect[1]
        assert perfect[1] > 1.0
