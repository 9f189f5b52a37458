"""The client scripts' assertion counter: `check(cond, what)` raises naming `what` when `cond`
is false, and `passed()` says how many checks held (a script that checked nothing did not test
anything)."""

_count = 0


def check(cond, what):
    global _count
    if not cond:
        raise AssertionError(what)
    _count += 1


def passed():
    if _count == 0:
        raise AssertionError("no check ran")
    return _count
