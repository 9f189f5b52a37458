#!/usr/bin/env python3
"""Generate the quant crate's reference fixtures with gguf-py (PyPI `gguf`, maintained with llama.cpp).

Writes into crates/quant/tests/fixtures/:
  blocks/<type>.bin       seeded random blocks of <type>, raw GGUF bytes (f16 scales kept finite)
  blocks/<type>.f32       what gguf-py's `gguf.quants.dequantize` makes of them, little-endian f32
  quantize/<type>.in.f32  seeded f32 rows (normal values plus edge-case blocks)
  quantize/<type>.out.bin what `gguf.quants.quantize` makes of them (types gguf-py can quantize)
  manifest.json           provenance (gguf + numpy versions, date, seed) and one entry per file pair
  ggml/<type>.in.f32, ggml/<type>.out.bin, manifest_ggml.json
                          (--ggml-lib) llama.cpp's own `quantize_row_<type>_ref`, called through
                          ctypes from a libggml-base.so, for every type snug quantizes
  models.json             (--models) per tensor of the real test models: sha256 of gguf-py's
                          dequantized f32 bytes plus sampled values

Usage: python3 scripts/gen_quant_fixtures.py [--models] [--ggml-lib PATH/libggml-base.so]
(needs `pip install gguf numpy`; libggml-base.so comes from any llama.cpp build, e.g. the one
`pip install llama-cpp-python` compiles)
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20261122
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "quant" / "tests" / "fixtures"

# Byte offsets of the f16 scale fields per block (see crates/quant/src/blocks.rs); random
# bytes there could be inf/NaN, so they are redrawn as finite f16 values.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q8_1: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
BLOCK_TYPES = list(F16_FIELDS) + [T.Q8_K]
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
QUANTIZE_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
MODELS = ["gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random finite f16 values over the whole range (subnormals, zeros, negatives included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    bad = (bits & 0x7C00) == 0x7C00
    bits[bad] &= 0xBFFF  # clear the top exponent bit: inf/NaN become ordinary numbers
    return bits.view(np.float16)


def quant_size(qtype: T) -> tuple[int, int]:
    """(values, bytes) per block. gguf-py still lists Q8_1 at 40 bytes (its old f32 d and s);
    ggml's block_q8_1 has been two f16 + 32 i8 = 36 bytes for years."""
    if qtype == T.Q8_1:
        return 32, 36
    return GGML_QUANT_SIZES[qtype]


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    block_size, type_size = quant_size(qtype)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n_blocks) * 1e-2).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    for off in F16_FIELDS.get(qtype, []):
        raw[:, off:off + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def reference_dequantize(raw: np.ndarray, qtype: T) -> tuple[np.ndarray, str]:
    """gguf-py's dequantize; for the two types it lacks (Q8_1, Q8_K: activation formats ggml
    only quantizes to), the one-line `d * q` of ggml-quants.c in numpy."""
    if qtype == T.Q8_K:
        d = raw[:, 0:4].copy().view(np.float32)
        q = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1), "numpy in this script: d * q (ggml dequantize_row_q8_K)"
    if qtype == T.Q8_1:
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = raw[:, 4:36].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1), "numpy in this script: d * q (ggml block_q8_1 layout)"
    return gguf.quants.dequantize(raw, qtype).reshape(-1), "gguf.quants.dequantize"


def float_values(rng: np.random.Generator, qtype: T, n: int) -> np.ndarray:
    """Raw bytes of n random finite values of a float type."""
    if qtype == T.F16:
        return finite_f16(rng, n).view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF
        return bits.view(np.uint8)
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    bits[(bits & 0x7F800000) == 0x7F800000] &= 0xBFFFFFFF
    return bits.view(np.uint8)


def float_dequantize(raw: np.ndarray, qtype: T) -> tuple[np.ndarray, str]:
    if qtype == T.BF16:
        return gguf.quants.dequantize(raw.reshape(-1, 2), qtype).reshape(-1), "gguf.quants.dequantize"
    return gguf.quants.dequantize(raw, qtype).reshape(-1).astype(np.float32), "gguf.quants.dequantize"


def quantize_input(rng: np.random.Generator, n_rows: int, n_cols: int) -> np.ndarray:
    """Rows of normal values with edge cases planted in the first row's blocks of 32: all zeros,
    one large outlier, all equal, tiny (f16-subnormal) values, and mixed signs of large magnitude."""
    x = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    x[0, 0:32] = 0.0
    x[0, 32:64] *= 1e-3
    x[0, 40] = 50.0
    x[0, 64:96] = 0.75
    x[0, 96:128] = rng.standard_normal(32).astype(np.float32) * 1e-6
    x[0, 128:160] = rng.standard_normal(32).astype(np.float32) * 1e3
    x[0, 160:192] = -np.abs(x[0, 160:192])
    return x


def write_pair(dirname: str, name: str, a: np.ndarray, b: np.ndarray, exts: tuple[str, str]) -> list[str]:
    d = OUT / dirname
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for arr, ext in zip((a, b), exts):
        p = d / f"{name}{ext}"
        p.write_bytes(np.ascontiguousarray(arr).tobytes())
        files.append(str(p.relative_to(OUT)))
    return files


def gen_blocks(rng: np.random.Generator) -> list[dict]:
    entries = []
    for qtype in FLOAT_TYPES + BLOCK_TYPES:
        block_size, type_size = quant_size(qtype)
        if qtype in FLOAT_TYPES:
            n = 1024
            raw = float_values(rng, qtype, n)
            expected, source = float_dequantize(raw, qtype)
        else:
            n_blocks = 8 if block_size == 256 else 32
            n = n_blocks * block_size
            raw = random_blocks(rng, qtype, n_blocks)
            expected, source = reference_dequantize(raw, qtype)
        assert expected.dtype == np.float32 and expected.size == n, qtype
        name = qtype.name.lower()
        files = write_pair("blocks", name, raw, expected.astype("<f4"), (".bin", ".f32"))
        entries.append({"type": qtype.name, "id": int(qtype), "n_values": n,
                        "source": source, "files": files})
        print(f"blocks   {qtype.name:8} {n:5} values  ({source})")
    return entries


def gen_quantize(rng: np.random.Generator) -> list[dict]:
    entries = []
    for qtype in QUANTIZE_TYPES:
        x = quantize_input(rng, 4, 256)
        q = gguf.quants.quantize(x, qtype)
        raw = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
        name = qtype.name.lower()
        files = write_pair("quantize", name, x.astype("<f4"), raw, (".in.f32", ".out.bin"))
        entries.append({"type": qtype.name, "id": int(qtype), "n_values": int(x.size),
                        "source": "gguf.quants.quantize", "files": files})
        print(f"quantize {qtype.name:8} {x.size:5} values")
    return entries


GGML_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
              T.Q6_K, T.Q8_K, T.IQ4_NL, T.IQ4_XS]


# Real weights appended to the ggml quantizer inputs: heavy tails and per-channel scales that
# seeded normals lack. (alias, tensor, rows): first 256 values of each row, as gguf-py dequantizes
# them.
REAL_ROWS = ("qwen2.5-coder-0.5b", "blk.0.ffn_down.weight", 4)


def real_rows() -> np.ndarray:
    alias, name, n_rows = REAL_ROWS
    path = model_path(alias)
    if not path.exists():
        sys.exit(f"{path} is missing: run `snug pull {alias}` first (needed for --ggml-lib)")
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    rows = t.data.reshape(-1, t.data.shape[-1])[:n_rows]
    return gguf.quants.dequantize(rows, T(t.tensor_type)).reshape(n_rows, -1)[:, :256].astype(np.float32)


def gen_ggml(rng: np.random.Generator, lib_path: Path) -> dict:
    """Quantize seeded rows with llama.cpp's reference quantizers (`quantize_row_*_ref`, the
    path llama-quantize takes without an importance matrix). IQ4_NL is the exception: its
    `_ref` skips the scale search, so it is taken from `quantize_iq4_nl` (imatrix NULL), which is
    what llama-quantize writes."""
    import ctypes

    lib = ctypes.CDLL(str(lib_path))
    real = real_rows()
    entries = []
    for qtype in GGML_TYPES:
        block_size, type_size = quant_size(qtype)
        x = quantize_input(rng, 8, 256)
        x[1] *= 1e-4  # a row of small weights, as in late layers
        x[2] *= 30.0  # and one of large ones
        x = np.ascontiguousarray(np.vstack([x, real]), dtype=np.float32)
        out = np.zeros(x.size // block_size * type_size, dtype=np.uint8)
        name = qtype.name.lower()
        if qtype == T.IQ4_NL:
            source = "quantize_iq4_nl"
            fn = lib.quantize_iq4_nl
            fn.restype = ctypes.c_size_t
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            fn(x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1], None)
        else:
            source = f"quantize_row_{name.replace('_k', '_K')}_ref"
            fn = getattr(lib, source)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn(x.ctypes.data, out.ctypes.data, x.size)
        if qtype == T.Q8_K:
            # ggml leaves bsums unwritten for an all-zero block; none of these rows has one.
            assert all(np.any(b != 0) for b in x.reshape(-1, 256)), "all-zero Q8_K block"
        files = write_pair("ggml", name, x.astype("<f4"), out, (".in.f32", ".out.bin"))
        entries.append({"type": qtype.name, "id": int(qtype), "n_values": int(x.size),
                        "source": source, "files": files})
        print(f"ggml     {qtype.name:8} {x.size:5} values")
    alias, name, n_rows = REAL_ROWS
    return {"lib": lib_path.name, "lib_sha256": hashlib.sha256(lib_path.read_bytes()).hexdigest(),
            "inputs": f"rows 0-7 seeded normals with edge cases; rows 8-{7 + n_rows}: first 256 values "
                      f"of rows 0-{n_rows - 1} of {name} in {alias}, dequantized by gguf-py",
            "quantize": entries}


def model_path(alias: str) -> Path:
    home = Path(os.environ.get("SNUG_HOME", Path.home() / ".cache" / "snug"))
    return home / "models" / f"{alias}.gguf"


N_SAMPLES = 8


def tensor_digest(t) -> dict:
    """sha256 of gguf-py's dequantized f32 (little-endian, row-major as stored) and a few
    sampled values, dequantizing a bounded number of rows at a time."""
    qtype = T(t.tensor_type)
    data = t.data  # (rows, row_bytes) for quantized types, (rows, cols) for float types
    rows = data.reshape(-1, data.shape[-1])
    n_rows = rows.shape[0]
    n = int(t.n_elements)
    sha = hashlib.sha256()
    sample_idx = sorted({(i * 2654435761 + 12345) % n for i in range(N_SAMPLES)} | {0, n - 1})
    samples = {}
    step = max(1, (1 << 24) // max(1, rows.nbytes // n_rows))  # ~16 MiB of input per chunk
    offset = 0
    for r in range(0, n_rows, step):
        out = gguf.quants.dequantize(rows[r:r + step], qtype).astype("<f4", copy=False).reshape(-1)
        sha.update(out.tobytes())
        for i in sample_idx:
            if offset <= i < offset + out.size:
                samples[i] = float(out[i - offset])
        offset += out.size
    assert offset == n, (t.name, offset, n)
    return {"name": t.name, "type": qtype.name, "dims": [int(d) for d in t.shape],
            "n_values": n, "sha256": sha.hexdigest(),
            "samples": [[i, samples[i]] for i in sample_idx]}


def gen_models() -> dict:
    result = {}
    for alias in MODELS:
        path = model_path(alias)
        if not path.exists():
            sys.exit(f"{path} is missing: run `snug pull {alias}` first")
        reader = gguf.GGUFReader(path)
        tensors = [tensor_digest(t) for t in reader.tensors]
        result[alias] = {"file_bytes": path.stat().st_size, "tensors": tensors}
        print(f"model    {alias}: {len(tensors)} tensors")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", action="store_true", help="also digest every tensor of the real test models")
    ap.add_argument("--ggml-lib", type=Path, help="libggml-base.so to take reference quantizers from")
    ap.add_argument("--ggml-version", default="", help="what that library is, for the provenance record")
    args = ap.parse_args()

    rng = np.random.default_rng(SEED)
    provenance = {
        "generator": "scripts/gen_quant_fixtures.py",
        "gguf_version": gguf.__version__ if hasattr(gguf, "__version__") else _pkg_version("gguf"),
        "numpy_version": np.__version__,
        "python_version": sys.version.split()[0],
        "date": datetime.date.today().isoformat(),
        "seed": SEED,
    }
    manifest = {"provenance": provenance, "blocks": gen_blocks(rng), "quantize": gen_quantize(rng)}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if args.ggml_lib:
        ggml = gen_ggml(np.random.default_rng(SEED + 1), args.ggml_lib)
        ggml = {"provenance": {**provenance, "ggml": args.ggml_version,
                               **{k: ggml[k] for k in ("lib", "lib_sha256", "inputs")}},
                "quantize": ggml["quantize"]}
        (OUT / "manifest_ggml.json").write_text(json.dumps(ggml, indent=1) + "\n")
    if args.models:
        models = {"provenance": provenance, "digest": "sha256 of dequantized little-endian f32",
                  "models": gen_models()}
        (OUT / "models.json").write_text(dump_models(models))


def dump_models(models: dict) -> str:
    """JSON with one tensor per line (diffs stay readable, the file stays small)."""
    head = {k: v for k, v in models.items() if k != "models"}
    lines = ["{", *[f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()], ' "models": {']
    for i, (alias, m) in enumerate(models["models"].items()):
        lines.append(f"  {json.dumps(alias)}: {{\"file_bytes\": {m['file_bytes']}, \"tensors\": [")
        lines += [f"   {json.dumps(t, separators=(',', ':'))}," for t in m["tensors"]]
        lines[-1] = lines[-1].rstrip(",")
        lines.append("  ]}" + ("," if i + 1 < len(models["models"]) else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def _pkg_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


if __name__ == "__main__":
    main()
