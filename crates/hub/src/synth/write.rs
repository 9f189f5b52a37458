//! The file writer: header, then each tensor's data as it is made (one tensor buffer at a time),
//! to `NAME.gguf.partial`, renamed into place when complete.

use std::path::Path;

use gguf::{GgmlType, GgufError, GgufWriter, TensorSpec, Value};
use indicatif::{ProgressBar, ProgressStyle};

use super::rng::mix;
use super::values::{one_d_values, quantize_all, tile, Pools};
use super::{Kind, PlannedTensor, SynthError, SynthOptions};

/// Writes `meta` and `tensors` to `out` atomically (`out.gguf.partial`, then a rename); a full
/// disk is reported with the bytes the file needs, and the partial file removed.
pub(super) fn write_file(
    opts: &SynthOptions,
    tensors: &[PlannedTensor],
    meta: Vec<(String, Value)>,
    out: &Path,
) -> Result<(), SynthError> {
    let partial = out.with_extension("gguf.partial");
    let io = |what, e: std::io::Error| SynthError::Io { what, path: partial.clone(), source: e };
    let file = std::fs::File::create(&partial).map_err(|e| io("cannot create", e))?;
    let sink = std::io::BufWriter::with_capacity(8 << 20, file);
    let mut fw = GgufWriter::new(sink);
    for (k, v) in meta {
        fw.add_kv(k, v);
    }
    let mut total: u64 = 0;
    for t in tensors {
        let spec =
            TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type };
        total += gguf::tensor_size(&t.name, &t.dims, t.ggml_type)?;
        fw.add_tensor(spec)?;
    }
    let result = write_data(opts, tensors, fw, total, &partial);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(match e {
            SynthError::Gguf(GgufError::Write(io))
                if io.kind() == std::io::ErrorKind::StorageFull =>
            {
                SynthError::DiskFull { path: out.to_path_buf(), need: total }
            }
            e => e,
        });
    }
    std::fs::rename(&partial, out).map_err(|e| SynthError::Io {
        what: "cannot rename to",
        path: out.to_path_buf(),
        source: e,
    })?;
    Ok(())
}

fn write_data(
    opts: &SynthOptions,
    tensors: &[PlannedTensor],
    mut fw: GgufWriter<std::io::BufWriter<std::fs::File>>,
    total: u64,
    path: &Path,
) -> Result<(), SynthError> {
    fw.write_header()?;
    let bar = if opts.quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    let mut pools = Pools::default();
    let mut buf: Vec<u8> = Vec::new();
    for (idx, t) in tensors.iter().enumerate() {
        bar.set_message(t.name.clone());
        let (rows, cols) = (t.dims[1..].iter().product::<u64>() as usize, t.dims[0] as usize);
        let row_bytes = t.ggml_type.row_bytes(cols).unwrap_or(0);
        buf.clear();
        buf.resize(rows * row_bytes, 0);
        let seed = mix(opts.seed, idx as u64);
        match t.kind {
            Kind::Norm
            | Kind::Bias
            | Kind::RopeFreqs
            | Kind::RopeFactorsLong
            | Kind::RopeFactorsShort => {
                let vals = one_d_values(t.kind, cols, seed, &opts.shape);
                quant::quantize_row(GgmlType::F32, &vals, &mut buf)
                    .map_err(|e| SynthError::Quant { tensor: t.name.clone(), source: e })?;
            }
            _ if opts.exact || opts.makes_logits(t) => {
                quantize_all(t, &mut buf, row_bytes, seed, opts.std_of(t), opts.threads)?
            }
            _ => {
                let pool = pools.get(t, opts, row_bytes)?;
                tile(&mut buf, tile_bytes(t.ggml_type, row_bytes), pool, seed, opts.threads);
            }
        }
        fw.write_tensor(&buf)?;
        bar.inc(buf.len() as u64);
    }
    let sink = fw.finish()?;
    let file = sink.into_inner().map_err(|e| SynthError::Io {
        what: "cannot write",
        path: path.to_path_buf(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(|e| SynthError::Io {
        what: "cannot sync",
        path: path.to_path_buf(),
        source: e,
    })?;
    bar.finish_and_clear();
    Ok(())
}

/// Bytes of the unit a tiled matrix of rows of `row_bytes` is drawn in: one quantization block,
/// or 32 values of an unquantized type (a whole row if its rows are not whole such units).
fn tile_bytes(t: GgmlType, row_bytes: usize) -> usize {
    let unit = if t.block_size() == 1 { 32 * t.type_size() } else { t.type_size() };
    if row_bytes.is_multiple_of(unit) {
        unit
    } else {
        row_bytes
    }
}
