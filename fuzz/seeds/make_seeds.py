# Seeds for the fuzzer: small valid GGUF files made with gguf-py (llama.cpp's own writer).
import numpy as np, gguf, os, sys
out = sys.argv[1]
def mk(name, fn):
    w = gguf.GGUFWriter(os.path.join(out, name), "llama")
    fn(w)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
def a(w):
    w.add_block_count(2); w.add_context_length(128); w.add_embedding_length(32)
    w.add_tokenizer_model("gpt2"); w.add_token_list(["a", "b", "ab"]); w.add_token_merges(["a b"])
    w.add_bos_token_id(0); w.add_float32("x.f", 1.5); w.add_bool("x.b", True)
    w.add_array("x.u", [1, 2, 3]); w.add_uint64("x.u64", 7); w.add_int8("x.i8", -1)
    w.add_tensor("w", np.ones((2, 32), dtype=np.float32)); w.add_tensor("n", np.zeros(5, dtype=np.float16))
def b(w):
    w.add_custom_alignment(64); w.add_string("s", "hello")
    w.add_tensor("t", np.arange(64, dtype=np.float32).reshape(2, 32))
    q = np.zeros((3, 34), dtype=np.uint8)
    w.add_tensor("q", q, raw_shape=(3, 34), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
def c(w):
    w.add_tensor("k", np.zeros((1, 144), dtype=np.uint8), raw_shape=(1, 144), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
mk("small_llama.gguf", a); mk("aligned_64.gguf", b); mk("q4_k.gguf", c)
