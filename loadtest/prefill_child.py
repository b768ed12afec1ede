"""One long prefill, timed, in the tree given as the first argument: `python
loadtest/prefill_child.py TREE PROMPT_LEN SEED MODEL` prints {"seconds": ..., "tokens": ...}.

Run by loadtest/prefill_bench.py in a process of its own per round, against this checkout or
another commit's worktree, so it imports only what every commit's engine has (LLM,
SamplingParams) and nothing else of the tree that runs it."""
import json
import sys
import time


def main() -> None:
    tree, prompt_len, seed, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    sys.path.insert(0, tree)
    import random

    from engine import LLM, SamplingParams
    from engine.llm import set_num_threads

    set_num_threads(None)
    llm = LLM(model=model)
    vocab = len(llm.tokenizer)
    rng = random.Random(seed)
    once = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate([[rng.randrange(vocab) for _ in range(256)]], once)  # warm-up: kernels built, caches hot
    prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
    start = time.perf_counter()
    llm.generate([prompt], once)
    print(json.dumps({"seconds": time.perf_counter() - start, "tokens": prompt_len}))


if __name__ == "__main__":
    main()
