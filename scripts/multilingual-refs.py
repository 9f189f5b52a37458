#!/usr/bin/env python3
"""Writes testdata/tokenizer/multilingual.llamacpp.json: llama.cpp's token ids for the
multilingual sample (testdata/tokenizer/multilingual.txt, whole and line by line) on each model
given, from llama-server's /tokenize on loopback (BOS as the model adds it; special-token
parsing off and on). crates/tokenizer/tests/multilingual.rs compares snug's with them.

Usage: scripts/multilingual-refs.py ALIAS=MODEL.gguf...   (LLAMA_BIN: llama.cpp's binaries,
default ~/.cache/llamacpp/bin, where ../shared/tools/build-llamacpp.sh puts them)."""
import hashlib, json, os, signal, subprocess, sys, time, urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SERVER = os.path.join(os.environ.get("LLAMA_BIN", os.path.expanduser("~/.cache/llamacpp/bin")),
                      "llama-server")
PORT = 18931


def texts():
    text = open(os.path.join(ROOT, "testdata/tokenizer/multilingual.txt"), encoding="utf-8").read()
    return [text] + [line for line in text.split("\n") if line]


def tokenize(s, special):
    body = {"content": s, "add_special": True, "parse_special": special}
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/tokenize", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["tokens"]


def model_refs(path):
    server = subprocess.Popen([SERVER, "-m", path, "--host", "127.0.0.1", "--port", str(PORT),
                               "-t", "1", "-c", "512", "-nr"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health")
                break
            except Exception:
                time.sleep(0.5)
        return [{"text": t, "parse_special": special, "ids": tokenize(t, special)}
                for special in (False, True) for t in texts()]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()


models = {}
for arg in sys.argv[1:]:
    alias, path = arg.split("=", 1)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    models[alias] = {"sha256": sha, "cases": model_refs(path)}
out = os.path.join(ROOT, "testdata/tokenizer/multilingual.llamacpp.json")
json.dump({"source": "llama-server /tokenize, llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)",
           "models": models}, open(out, "w"), ensure_ascii=False, indent=0)
