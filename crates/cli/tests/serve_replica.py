"""What an inference gateway's endpoint picker sees of `snug serve` replicas (driven by
crates/cli/tests/serve_replica.rs, which starts the servers; this script starts nothing).

    serve_replica.py metrics URL ADAPTER
        Scrapes URL/metrics with the Prometheus client's strict parser, checks each protocol
        metric's name, type and labels, then loads the server (started with --parallel 1) and
        checks the values move: waiting and running under load, KV use rising with a long
        prompt (by the prompt's blocks), ADAPTER listed while a request on it waits and runs,
        everything back to idle after.

    serve_replica.py route URL_A URL_B
        Plays the picker's LoRA-affinity and queue scorers over two replicas' /metrics and sends
        each request to the replica they pick; every request must land on the replica that
        has its adapter (by the replica's own /v1/models), and a base-model request on the
        replica with the shorter queue.

Exits non-zero with a message on the first failed check.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families

PROTOCOL = {
    "vllm:num_requests_waiting": set(),
    "vllm:num_requests_running": set(),
    "vllm:kv_cache_usage_perc": set(),
    "vllm:cache_config_info": {"block_size", "num_gpu_blocks"},
    "vllm:lora_requests_info": {"max_lora", "running_lora_adapters", "waiting_lora_adapters"},
}


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def scrape(url):
    """The protocol's families of URL/metrics, parsed strictly, as {name: [(labels, value)]},
    after checking each one's type and label names."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    # The body is OpenMetrics text (its content type): its own parser must read it the same.
    om = {f.name: f.type for f in openmetrics(text)}
    for name in PROTOCOL:
        check(om.get(name) == "gauge", f"the OpenMetrics parser reads {name} as {om.get(name)}")
    check("snug_queue_depth" in fams, "snug's own metrics are gone")
    out = {}
    for name, labels in PROTOCOL.items():
        f = fams.get(name)
        check(f is not None, f"{name} is missing: {sorted(fams)}")
        check(f.type == "gauge", f"{name} is a {f.type}, not a gauge")
        check(len(f.samples) == 1, f"{name} has {len(f.samples)} series, not one")
        s = f.samples[0]
        check(s.name == name, f"{name}'s sample is named {s.name}")
        check(set(s.labels) == labels, f"{name} has labels {sorted(s.labels)}, not {sorted(labels)}")
        out[name] = (s.labels, s.value)
    return out


def value(m, name):
    return m[name][1]


def lora(m):
    labels, ts = m["vllm:lora_requests_info"]
    names = lambda s: [n for n in s.split(",") if n]
    return int(labels["max_lora"]), names(labels["running_lora_adapters"]), names(labels["waiting_lora_adapters"]), ts


def post(url, path, body):
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(url, model, content, max_tokens, out, key):
    """A streamed chat; stores (status, finish_reason, prompt_tokens, done_at) in out[key]."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, text = post(url, "/v1/chat/completions", body)
    finish, usage = None, None
    for line in text.splitlines():
        if line.startswith("data: {"):
            ev = json.loads(line[6:])
            for c in ev.get("choices", []):
                finish = c.get("finish_reason") or finish
            usage = ev.get("usage") or usage
    check(text.rstrip().endswith("data: [DONE]"), f"{key}: the stream did not end with [DONE]: {text[-300:]}")
    out[key] = (status, finish, usage and usage["prompt_tokens"], time.time())


def metrics_mode(url, adapter):
    m = scrape(url)
    labels, one = m["vllm:cache_config_info"]
    check(one == 1, f"cache_config_info is {one}, not 1")
    block_size, n_blocks = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    check(block_size == 32 and n_blocks > 0, f"cache_config_info labels {labels}")
    max_lora, running, waiting, ts = lora(m)
    check(max_lora >= 1, f"max_lora {max_lora}")
    check(abs(ts - time.time()) < 60, f"lora_requests_info's value {ts} is not the time now")
    idle = {n: value(m, n) for n in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")}
    check(all(v == 0 for v in idle.values()), f"an idle server reports {idle}")
    check(waiting == [], f"an idle server has waiting adapters {waiting}")

    # Load (--parallel 1): a long prompt runs first; a request on the adapter and a short one
    # wait behind it.
    long_prompt = "Summarize this list: " + ", ".join(f"item {i} is a {'red' if i % 2 else 'blue'} box" for i in range(60))
    done = {}
    seen = {"max_waiting": 0, "max_running": 0, "kv_long": 0.0, "adapter_waiting": False, "adapter_running": False}
    threads = [threading.Thread(target=chat, args=(url, "", long_prompt, 24, done, "long"))]
    threads[0].start()
    t0 = time.time()
    started_others = False
    while len(done) < 3 and time.time() - t0 < 90:
        m = scrape(url)
        w, r, kv = (value(m, n) for n in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"))
        check(0 <= kv <= 1, f"kv_cache_usage_perc {kv} is outside 0..1")
        check(r <= 1, f"{r} running with --parallel 1")
        _, lr, lw, _ = lora(m)
        seen["max_waiting"] = max(seen["max_waiting"], w)
        seen["max_running"] = max(seen["max_running"], r)
        if "long" not in done and r == 1 and not started_others:
            for key, model, n in (("adapter", adapter, 8), ("short", "", 4)):
                t = threading.Thread(target=chat, args=(url, model, "Say hi.", n, done, key))
                t.start()
                threads.append(t)
            started_others = True
        if "long" not in done and r == 1:
            seen["kv_long"] = max(seen["kv_long"], kv)
        if "adapter" not in done and adapter in lw:
            seen["adapter_waiting"] = True
        if "adapter" not in done and adapter in lr and "long" in done:
            seen["adapter_running"] = True
        time.sleep(0.03)
    for t in threads:
        t.join(timeout=60)
    check(len(done) == 3, f"requests did not finish: {done}")
    for k, (status, finish, _, _) in done.items():
        check(status == 200 and finish in ("stop", "length"), f"{k}: {status} {finish}")
    n_prompt = done["long"][2]
    print(f"seen {seen}; long prompt {n_prompt} tokens over {n_blocks} blocks of {block_size}")
    check(seen["max_running"] == 1, f"running never reached 1: {seen}")
    check(seen["max_waiting"] >= 1, f"no request was ever seen waiting: {seen}")
    # While the long prompt runs, its sequence holds the blocks of its prompt and answer so far:
    # at least the prompt's full blocks, at most those of prompt and whole answer plus one.
    floor = (n_prompt // block_size) / n_blocks
    ceil = (-(-(n_prompt + 24) // block_size) + 1) / n_blocks
    check(0 < floor <= seen["kv_long"] <= ceil, f"KV use {seen['kv_long']} while a {n_prompt}-token prompt ran; its blocks are {floor}..{ceil}")
    check(seen["adapter_waiting"], f"{adapter} was never listed in waiting_lora_adapters while its request waited")
    check(seen["adapter_running"], f"{adapter} was never listed in running_lora_adapters while its request ran")
    m = scrape(url)
    after = {n: value(m, n) for n in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")}
    check(all(v == 0 for v in after.values()), f"after the load the server reports {after}")
    print("metrics ok")


def served_adapters(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        ids = [m["id"] for m in json.load(r)["data"]]
    return {i.split(":", 1)[1] for i in ids if ":" in i}


def pick(urls, adapter):
    """The picker's choice among urls for a request on adapter (None: the base model): the sum
    of the LoRA-affinity score (1 if the adapter is ready or waiting there, 0.5 if the replica
    has room for another adapter, else 0; 1 for a base request) and the queue score (1 for the
    shortest queue down to 0 for the longest), as the reference scorers compute them."""
    ms = [scrape(u) for u in urls]
    queues = [value(m, "vllm:num_requests_waiting") + value(m, "vllm:num_requests_running") for m in ms]
    lo, hi = min(queues), max(queues)
    scores = []
    for m, q in zip(ms, queues):
        max_lora, running, waiting, _ = lora(m)
        if adapter is None:
            affinity = 1.0
        elif adapter in running or adapter in waiting:
            affinity = 1.0
        elif len(set(running) | set(waiting)) < max_lora:
            affinity = 0.5
        else:
            affinity = 0.0
        queue = 1.0 if hi == lo else (hi - q) / (hi - lo)
        scores.append(affinity + queue)
    best = max(range(len(urls)), key=lambda i: scores[i])
    return best, scores, queues


def route_mode(url_a, url_b):
    urls = [url_a, url_b]
    have = [served_adapters(u) for u in urls]
    print(f"adapters: A {sorted(have[0])}, B {sorted(have[1])}")
    only = [sorted(have[0] - have[1]), sorted(have[1] - have[0])]
    check(only[0] and only[1], f"the replicas must serve different adapters: {have}")
    landed = []
    for adapter in [only[0][0], only[1][0]] * 3:
        i, scores, _ = pick(urls, adapter)
        status, text = post(urls[i], "/v1/chat/completions", {
            "model": adapter, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3,
        })
        check(status == 200, f"{adapter} on replica {'AB'[i]}: {status} {text[:200]}")
        check(adapter in have[i], f"{adapter} was sent to replica {'AB'[i]}, which does not have it (scores {scores})")
        landed.append((adapter, "AB"[i]))
    print(f"landed {landed}")
    # Queue: a long request holds replica A; a base-model request goes to B.
    out = {}
    t = threading.Thread(target=chat, args=(url_a, "", "Count from 1 to 100.", 60, out, "hold"))
    t.start()
    t0 = time.time()
    while time.time() - t0 < 30 and value(scrape(url_a), "vllm:num_requests_running") < 1:
        time.sleep(0.05)
    i, scores, queues = pick(urls, None)
    check(i == 1, f"a base request went to the busy replica A (queues {queues}, scores {scores})")
    status, _ = post(urls[i], "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    check(status == 200, f"base request on B: {status}")
    t.join(timeout=90)
    print("route ok")


if __name__ == "__main__":
    if sys.argv[1:2] == ["metrics"] and len(sys.argv) == 4:
        metrics_mode(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["route"] and len(sys.argv) == 4:
        route_mode(sys.argv[2], sys.argv[3])
    else:
        fail(__doc__)
