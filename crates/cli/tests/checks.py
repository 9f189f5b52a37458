"""The client scripts' assertion counter: `check(cond, what)` raises naming `what` when `cond`
is false, and `passed()` says how many checks held (a script that checked nothing did not test
anything).

With `CHECKS_KEEP_GOING=1` (the comparison against llama-server, scripts/agents_vs_llamacpp.sh)
a failed check prints `FAIL: what` and the script goes on, so one run lists every check a server
fails; `passed()` then raises if any failed."""

import os

_count = 0
_failed = []
_keep_going = os.environ.get("CHECKS_KEEP_GOING") == "1"


def check(cond, what):
    global _count
    if not cond:
        if not _keep_going:
            raise AssertionError(what)
        _failed.append(what)
        print(f"FAIL: {str(what)[:400]}", flush=True)
        return
    _count += 1
    if _keep_going:
        print(f"ok: {str(what)[:120]}", flush=True)


def passed():
    if _failed:
        raise AssertionError(f"{len(_failed)} checks failed, {_count} held")
    if _count == 0:
        raise AssertionError("no check ran")
    return _count
