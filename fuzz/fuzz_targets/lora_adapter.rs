//! Fuzz the LoRA adapter loader: arbitrary bytes as an adapter GGUF through `Lora::from_gguf`
//! against the tiny qwen2 model's shapes (`testdata/refdata/tiny/tiny-qwen2.gguf`). Any input
//! must load or give a `LoraError`; an adapter that loads must fit the model, report a rank and
//! a size that agree with its matrices, and run through a decode of two tokens (the BGMV delta
//! on every matrix it adapts) without panicking.
//!
//! Seeds are small adapters for that model (`scripts/make_lora.py`: f32, f16, q8_0; the seven
//! projections or some).

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use gguf::GgufFile;
use libfuzzer_sys::fuzz_target;
use model::{Batch, Context, ContextParams, Lora, Model};

fn context() -> &'static Mutex<Context> {
    static CTX: OnceLock<Mutex<Context>> = OnceLock::new();
    CTX.get_or_init(|| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/refdata/tiny/tiny-qwen2.gguf");
        let m = Arc::new(Model::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())));
        let params = ContextParams {
            n_ctx: 8,
            n_ubatch: 8,
            n_outputs_max: 2,
            n_threads: 1,
            ..ContextParams::default()
        };
        Mutex::new(Context::new(m, params))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let mut ctx = context().lock().unwrap_or_else(|e| e.into_inner());
    let Ok(lora) = Lora::from_gguf(&f, ctx.config(), "fuzz".into()) else { return };
    assert!(lora.fits(ctx.config()));
    assert!(lora.n_matrices() > 0 && lora.max_rank() > 0);
    assert!(lora.bytes() >= 4 * lora.max_rank(), "{} bytes for rank {}", lora.bytes(), lora.max_rank());
    ctx.set_adapters(0, &[(Arc::new(lora), 0.5)]).expect("an adapter loaded for this model");
    ctx.kv.seq_clear(0);
    let mut b = Batch::default();
    b.push(1, 0, 0, false);
    b.push(2, 1, 0, true);
    ctx.decode(&b).expect("decode with the adapter");
    ctx.set_adapters(0, &[]).expect("clear");
});
