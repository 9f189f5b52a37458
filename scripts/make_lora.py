#!/usr/bin/env python3
"""Random LoRA adapters in llama.cpp's GGUF layout (PyPI `gguf`), for parity runs against
llama.cpp (issue 15): A ~ N(0, 1/sqrt(n_in)), B ~ N(0, B_STD), adapter.lora.alpha = ALPHA.

    make_lora.py BASE.gguf OUT.gguf --rank 16 --type f16 --targets q,k,v,o,gate,up,down [--seed 1]
    make_lora.py BASE.gguf DIR --count 100 [--prefix lora] ...
        (DIR/lora000.gguf ... lora099.gguf, seeds SEED, SEED+1, ...: for `snug serve --lora-dir
        DIR`; e.g. 8 rank-16 adapters for the throughput target, 100 for the memory check)
"""
import argparse

import numpy as np
import gguf

NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
         "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}

p = argparse.ArgumentParser()
p.add_argument("base")
p.add_argument("out")
p.add_argument("--rank", type=int, default=8)
p.add_argument("--type", choices=["f32", "f16", "q8_0"], default="f16")
p.add_argument("--targets", default="q,v")
p.add_argument("--alpha", type=float, default=16.0)
p.add_argument("--b-std", type=float, default=0.02)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--count", type=int, default=0,
               help="write this many adapters into the directory OUT instead of one file")
p.add_argument("--prefix", default="lora")
a = p.parse_args()

base = gguf.GGUFReader(a.base)
arch = bytes(base.fields["general.architecture"].parts[-1]).decode()
shapes = {t.name: [int(d) for d in t.shape] for t in base.tensors}  # ggml order: [n_in, n_out]
qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
         "q8_0": gguf.GGMLQuantizationType.Q8_0}[a.type]


def write(out, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", a.alpha)
    il = 0
    while f"blk.{il}.attn_norm.weight" in shapes:
        for t in a.targets.split(","):
            name = f"blk.{il}.{NAMES[t]}.weight"
            n_in, n_out = shapes[name]
            A = rng.normal(0, 1 / np.sqrt(n_in), (a.rank, n_in)).astype(np.float32)
            B = rng.normal(0, a.b_std, (n_out, a.rank)).astype(np.float32)
            for suffix, m in ((".lora_a", A), (".lora_b", B)):
                if a.type == "q8_0":
                    w.add_tensor(name + suffix, gguf.quantize(m, qtype), raw_dtype=qtype)
                else:
                    w.add_tensor(name + suffix,
                                 m.astype(np.float16 if a.type == "f16" else np.float32))
        il += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if a.count:
    import os
    os.makedirs(a.out, exist_ok=True)
    for i in range(a.count):
        write(os.path.join(a.out, f"{a.prefix}{i:03}.gguf"), a.seed + i)
    print(f"{a.count} adapters in {a.out}: {a.prefix}000.gguf ... {a.prefix}{a.count - 1:03}.gguf")
else:
    write(a.out, a.seed)
