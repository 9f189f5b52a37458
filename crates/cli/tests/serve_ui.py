"""Drives `snug serve`'s page, /ui, in headless Chromium (Debian's `chromium` and
`chromium-driver`, PyPI `selenium`; scripts/test.sh installs them).

    serve_ui.py check URL KEY [SHOT.png]
        The browser test (crates/cli/tests/serve_ui.rs runs it on a server that requires KEY):
        the page asks for the key and keeps it; the memory bar's segments carry the plan's
        numbers; a chat message streams its answer; the running-requests figure moves while a
        second client streams. Prints one `ok ...` line per check; exits non-zero on the first
        failure.

    serve_ui.py screenshots SNUG MODEL.gguf DIR
        The screenshots in docs/: `snug serve` of a cold copy of MODEL.gguf (its pages dropped
        from the page cache, so the server's reads are charged to its own cgroup) started
        inside a cgroup-v1 memory cgroup of its own (root, /sys/fs/cgroup/memory), shot idle,
        under load (two streaming clients), and after the cgroup's limit is lowered under that
        load.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def browser(profile):
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1300", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(driver), options=opts)


def wait(what, cond, timeout=30.0, every=0.05):
    """cond()'s first truthy value within timeout seconds, else a failure naming `what`."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # the page may be mid-update
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last})")


def api(url, path, key, body=None):
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    return urllib.request.urlopen(req, timeout=60)


class Streamer(threading.Thread):
    """A second client: one streamed answer of up to `tokens` tokens (a chat answer to `prompt`,
    or a count continued), read chunk by chunk until it ends or `stop` is set."""

    # Without a prompt, a plain completion that continues a count: any model goes on counting
    # for hundreds of tokens, where a chat answer's length depends on the exact greedy text.
    COUNT = ", ".join(str(i) for i in range(1, 21)) + ","

    def __init__(self, url, key, tokens, prompt=None):
        super().__init__(daemon=True)
        self.url, self.key, self.tokens, self.prompt = url, key, tokens, prompt
        self.first = threading.Event()
        self.stop = threading.Event()
        self.chunks = 0
        self.error = None

    def run(self):
        body = {"stream": True, "max_tokens": self.tokens, "temperature": 0}
        if self.prompt is None:
            path, body["prompt"] = "/v1/completions", self.COUNT
        else:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": self.prompt}]
        try:
            with api(self.url, path, self.key, body) as r:
                for line in r:
                    if line.startswith(b"data: {"):
                        self.chunks += 1
                        self.first.set()
                    if self.stop.is_set():
                        break
        except Exception as e:
            self.error = e
        finally:
            self.first.set()


# The memory bar's segments as [key, bytes, width] and the RSS mark's bytes, or null.
BAR = """
const s = document.querySelector('#memory svg');
if (!s) return null;
const segs = [...s.querySelectorAll('rect.seg')].map((r) => [r.dataset.key, +r.dataset.bytes, +r.getAttribute('width')]);
const rss = s.querySelector('.rss');
return { segs, rss: rss ? rss.dataset.bytes : null };
"""


def text(d, id_):
    return d.find_element(By.ID, id_).text


def check(url, key, shot=None):
    profile = tempfile.mkdtemp(prefix="snug-ui-chromium-")
    d = browser(profile)
    try:
        d.get(url + "/ui")
        # The page holds no data: without the key its calls are refused and it asks for one.
        form = wait("the key form", lambda: d.find_element(By.ID, "keyform").is_displayed() and d.find_element(By.ID, "keyform"))
        assert "key" in text(d, "status"), text(d, "status")
        d.find_element(By.ID, "key").send_keys(key)
        form.submit()
        stored = d.execute_script("return sessionStorage.getItem('snug-api-key')")
        assert stored == key, f"the key was not kept in sessionStorage: {stored!r}"
        print("ok the page asks for the key and keeps it in sessionStorage")

        # The memory bar: one segment per term, each the plan's own number.
        mem = json.load(api(url, "/ui/memory", key))
        plan = mem["plan"]

        # Read in one script: the page replaces the picture every second.
        bar = wait("the memory bar's segments", lambda: d.execute_script(BAR))
        got = {k: (b, w) for k, b, w in bar["segs"]}
        assert len(got) == 10, f"segments: {sorted(got)}"
        by = {k: b for k, (b, _) in got.items()}
        for k in ("weights", "scratch", "process"):
            assert by[k] == plan[k], f"segment {k}: {by[k]} bytes, the plan says {plan[k]}"
        kv = by["kv_used"] + by["kv_cached"] + by["kv_free"]
        assert kv == plan["kv"], f"the KV segments sum to {kv}, the plan's KV cache is {plan['kv']}"
        planned = sum(b for k, b in by.items() if k not in ("headroom", "unused"))
        assert planned == plan["total"], f"planned segments sum to {planned}, the plan's peak is {plan['total']}"
        assert sum(by.values()) == plan["budget"], f"the bar holds {sum(by.values())} bytes, the budget is {plan['budget']}"
        # Widths to scale: each segment's share of the bar is its share of the bytes.
        scale = sum(w for _, w in got.values()) / sum(b for b, _ in got.values())
        for k, (b, w) in got.items():
            assert abs(w - b * scale) < 0.5, f"segment {k} is {w:.1f} wide for {b} bytes ({scale * 2**20:.4f} per MiB)"
        assert bar["rss"] and int(bar["rss"]) > 0, f"no RSS mark: {bar}"
        print(f"ok the memory bar has {len(got)} segments with the plan's numbers "
              f"(weights {plan['weights']}, KV {plan['kv']}, scratch {plan['scratch']}, peak {plan['total']}, budget {plan['budget']}) and an RSS mark")

        # The chat box: an answer streamed in pieces, its speed underneath.
        wait("the model list", lambda: d.find_elements(By.CSS_SELECTOR, "#model option"))
        d.find_element(By.ID, "max-tokens").clear()
        d.find_element(By.ID, "max-tokens").send_keys("40")
        d.find_element(By.ID, "prompt").send_keys("Write a short poem about memory.")
        t0 = time.monotonic()
        d.find_element(By.ID, "send").click()
        lengths = set()

        def answered():
            a = d.find_element(By.ID, "answer")
            lengths.add(len(a.text))
            return a.get_attribute("data-done") == "1" and a
        a = wait("the streamed answer", answered, timeout=60, every=0.02)
        assert "error" not in a.get_attribute("class"), f"the chat failed: {a.text}"
        assert a.text.strip(), "the answer is empty"
        partial = sorted(n for n in lengths if 0 < n < len(a.text))
        assert partial, f"the answer appeared at once, not streamed (lengths seen: {sorted(lengths)})"
        speed = text(d, "speed")
        assert "tokens/s" in speed and "first token after" in speed, speed
        print(f"ok the chat streamed {len(a.text)} characters in {len(partial) + 1} steps within {time.monotonic() - t0:.1f} s; under it: {speed!r}")

        # Load: the running figure moves while a second client streams.
        wait("no request running", lambda: text(d, "running") == "0", timeout=20)
        other = Streamer(url, key, 400)
        other.start()
        assert other.first.wait(60) and other.error is None, f"the second client failed: {other.error}"
        seen = wait("the running figure to move", lambda: text(d, "running") not in ("0", "–", "") and text(d, "running"), timeout=15)
        rate = wait("a generation rate", lambda: text(d, "gen-rate") not in ("–", "0.0") and text(d, "gen-rate"), timeout=15)
        if shot:
            d.save_screenshot(shot)
        other.stop.set()
        other.join(30)
        wait("the running figure to fall back", lambda: text(d, "running") == "0", timeout=30)
        assert text(d, "ttft") != "–" and text(d, "itl") != "–", (text(d, "ttft"), text(d, "itl"))
        print(f"ok running requests went 0 → {seen} → 0 while a second client streamed "
              f"({other.chunks} chunks, {rate} tokens/s); TTFT {text(d, 'ttft')}, ITL {text(d, 'itl')}")
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


CGROUP_V1 = "/sys/fs/cgroup/memory"


def cold_copy(model):
    """A copy of `model` beside it whose pages are not in the page cache."""
    copy = os.path.join(os.path.dirname(os.path.abspath(model)), f".snug-ui-shots-{os.getpid()}.gguf")
    shutil.copyfile(model, copy)
    fd = os.open(copy, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return copy


def screenshots(snug, model, out):
    """Idle, under load and after a lowered limit, from a server in a cgroup of its own."""
    os.makedirs(out, exist_ok=True)
    copy = cold_copy(model)
    cg = os.path.join(CGROUP_V1, f"snug-ui-shots-{os.getpid()}")
    os.mkdir(cg)
    limit = 1536 << 20
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    port = 18000 + os.getpid() % 1000
    key = "screenshot-key"
    server = subprocess.Popen(
        ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(cg, "cgroup.procs"), snug, "serve", copy,
         "--name", os.path.basename(model).removesuffix(".gguf"), "--port", str(port), "--parallel", "2", "--ctx", "2048", "--threads", "2", "--api-key", key],
        stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    profile = tempfile.mkdtemp(prefix="snug-ui-chromium-")
    d = None
    try:
        wait("the server", lambda: urllib.request.urlopen(url + "/health", timeout=2).status == 200, timeout=120, every=0.3)
        d = browser(profile)
        d.set_window_size(1400, 1250)
        d.get(url + "/ui")
        d.execute_script("sessionStorage.setItem('snug-api-key', arguments[0])", key)
        d.get(url + "/ui")
        wait("the page", lambda: d.find_elements(By.CSS_SELECTOR, "#memory svg rect.seg"))
        wait("the model list", lambda: d.find_elements(By.CSS_SELECTOR, "#model option"))
        d.find_element(By.ID, "prompt").send_keys("What does a KV cache hold?")
        d.find_element(By.ID, "max-tokens").clear()
        d.find_element(By.ID, "max-tokens").send_keys("60")
        d.find_element(By.ID, "send").click()
        wait("the answer", lambda: d.find_element(By.ID, "answer").get_attribute("data-done") == "1", timeout=90)
        time.sleep(3)
        d.save_screenshot(os.path.join(out, "ui-idle.png"))
        print("shot idle")
        clients = [Streamer(url, key, 600, p) for p in ("Write a long story about a lighthouse keeper.", "List every prime below 500 with a remark on each.")]
        for c in clients:
            c.start()
        for c in clients:
            c.first.wait(60)
        time.sleep(8)
        d.save_screenshot(os.path.join(out, "ui-load.png"))
        print("shot under load")
        usage = int(open(os.path.join(cg, "memory.usage_in_bytes")).read())
        lowered = max(usage - (96 << 20), 420 << 20)
        for _ in range(20):
            try:
                with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
                    f.write(str(lowered))
                break
            except OSError:
                time.sleep(0.2)
        print(f"limit lowered from {limit} to {lowered} (usage was {usage})")
        wait("a pressure mark", lambda: d.find_elements(By.CSS_SELECTOR, "#timeline .pressure-mark"), timeout=30)
        time.sleep(4)
        d.save_screenshot(os.path.join(out, "ui-pressure.png"))
        print("shot after the lowered limit")
        for c in clients:
            c.stop.set()
    finally:
        if d:
            d.quit()
        server.kill()
        server.wait()
        err = server.stderr.read().decode(errors="replace")
        print(err[-3000:], file=sys.stderr)
        shutil.rmtree(profile, ignore_errors=True)
        os.unlink(copy)
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    elif len(sys.argv) == 5 and sys.argv[1] == "screenshots":
        screenshots(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
