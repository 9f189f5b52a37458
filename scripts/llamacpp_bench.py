"""llama.cpp's prompt and generation speed, measured the way `llama-bench` measures it.

Usage: python3 scripts/llamacpp_bench.py MODEL.gguf [--threads 2] [-p 512] [-n 128] [--reps 3]
                                          [--ubatch 512] [--json]

Needs PyPI `llama-cpp-python` (which vendors llama.cpp; not a dependency of snug — install it by
hand for comparisons). Like llama-bench: one warm-up of each test, then `--reps` timed runs, each
starting from an empty KV cache; pp = one `llama_decode` of P random tokens (split into ubatches
by llama.cpp), tg = N single-token decodes. Reports median and spread, same keys as `snug bench
--json` (`pp_tok_s`, `tg_tok_s`) so the two can be put side by side.
"""
import argparse
import json
import random
import statistics
import sys
import time

import llama_cpp
from llama_cpp import Llama

from llamacpp_util import disable_repack


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", "-r", type=int, default=3)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--no-repack", action="store_true", help="disable load-time weight repacking")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    kwargs = dict(
        model_path=args.model,
        n_ctx=args.p + args.n + 16,
        n_batch=max(args.p, 1),
        n_ubatch=args.ubatch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
        logits_all=False,
    )
    if args.no_repack:
        disable_repack()
    t0 = time.perf_counter()
    llm = Llama(**kwargs)
    load_s = time.perf_counter() - t0
    ctx = llm._ctx.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    n_vocab = llm.n_vocab()
    rng = random.Random(0)

    def decode(tokens):
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def run_pp() -> float:
        llama_cpp.llama_memory_clear(mem, True)
        toks = [rng.randrange(n_vocab) for _ in range(args.p)]
        t = time.perf_counter()
        decode(toks)
        llama_cpp.llama_synchronize(ctx)
        return args.p / (time.perf_counter() - t)

    def run_tg() -> float:
        llama_cpp.llama_memory_clear(mem, True)
        tok = rng.randrange(n_vocab)
        t = time.perf_counter()
        for _ in range(args.n):
            decode([tok])
            tok = rng.randrange(n_vocab)
        llama_cpp.llama_synchronize(ctx)
        return args.n / (time.perf_counter() - t)

    out = {"model": args.model, "threads": args.threads, "load_s": load_s,
           "llama_cpp_python": llama_cpp.__version__}
    for name, fn, count in (("pp", run_pp, args.p), ("tg", run_tg, args.n)):
        if count == 0:
            continue
        fn()  # warm-up
        runs = [fn() for _ in range(args.reps)]
        out[f"{name}_tok_s"] = statistics.median(runs)
        out[f"{name}_runs"] = runs
        if not args.json:
            print(f"{name}{count}: median {statistics.median(runs):.2f} tok/s "
                  f"(min {min(runs):.2f}, max {max(runs):.2f})", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
