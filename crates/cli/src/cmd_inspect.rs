//! `snug inspect MODEL`: what a GGUF file holds, read from its header only (like gguf-dump, but
//! grouped: file, hyper-parameters, tokenizer, tensors, totals per type). `--json` for tools.
//!
//! Cost: one mmap and a header parse (vocabularies included, ~50 ms for 262k tokens); tensor data
//! is never touched, so it is instant on a 5 GB file.

use std::collections::BTreeMap;

use anyhow::Context;
use gguf::{Array, GgmlType, GgufFile, TensorInfo, Value};
use serde_json::{json, Map, Value as Json};

#[derive(clap::Args)]
pub struct InspectArgs {
    /// A model alias (pulled if needed) or a path to a .gguf file.
    pub model: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Leave out the per-tensor table (totals per type are still shown).
    #[arg(long)]
    pub no_tensors: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let path = hub::resolve(&args.model)?;
    let f = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let report = Report::new(&f);
    if args.json {
        let mut j = report.json(&f, !args.no_tensors);
        j["file"] = json!(path.display().to_string());
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print!("{}", report.text(&f, &path.display().to_string(), !args.no_tensors));
    }
    Ok(())
}

/// Totals of one tensor type.
#[derive(Default)]
struct TypeTotal {
    count: usize,
    params: u64,
    bytes: u64,
}

struct Report {
    arch: String,
    totals: BTreeMap<GgmlType, TypeTotal>,
    params: u64,
    tensor_bytes: u64,
}

impl Report {
    fn new(f: &GgufFile) -> Report {
        let mut totals: BTreeMap<GgmlType, TypeTotal> = BTreeMap::new();
        for t in &f.tensors {
            let e = totals.entry(t.ggml_type).or_default();
            e.count += 1;
            e.params += t.n_elements();
            e.bytes += t.size;
        }
        Report {
            arch: f.architecture().unwrap_or("?").to_string(),
            params: totals.values().map(|t| t.params).sum(),
            tensor_bytes: totals.values().map(|t| t.bytes).sum(),
            totals,
        }
    }

    /// Keys shown under "hyper-parameters": everything under `<arch>.`.
    fn is_hparam(&self, key: &str) -> bool {
        key.strip_prefix(self.arch.as_str()).is_some_and(|r| r.starts_with('.'))
    }

    fn text(&self, f: &GgufFile, path: &str, tensors: bool) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let w = &mut s;
        let _ = writeln!(w, "file          {path}");
        let _ =
            writeln!(w, "size          {} ({})", group(f.file_len()), human_bytes(f.file_len()));
        let _ = writeln!(
            w,
            "gguf          v{}, alignment {}, {} metadata keys, {} tensors, data at byte {}",
            f.version,
            f.alignment,
            f.metadata.len(),
            f.tensors.len(),
            group(f.data_offset)
        );
        let _ = writeln!(w, "architecture  {}", self.arch);
        if let Some(name) = f.get_str("general.name") {
            let _ = writeln!(w, "name          {name}");
        }
        if let Some(ft) = f.get_u64("general.file_type") {
            let _ = writeln!(w, "file type     {ft} ({})", file_type_name(ft));
        }
        let _ = writeln!(
            w,
            "parameters    {} ({}), {:.2} bits per weight",
            group(self.params),
            human_count(self.params),
            bits_per_weight(self.tensor_bytes, self.params)
        );

        let _ = writeln!(w, "\nhyper-parameters");
        for (k, v) in f.metadata.iter().filter(|(k, _)| self.is_hparam(k)) {
            let _ = writeln!(w, "  {:40} {}", &k[self.arch.len() + 1..], show(v));
        }

        let _ = writeln!(w, "\ntokenizer");
        for (k, v) in TokSummary::new(f).lines() {
            let _ = writeln!(w, "  {k:40} {v}");
        }

        let _ = writeln!(w, "\nother metadata");
        for (k, v) in &f.metadata {
            if !self.is_hparam(k) && !k.starts_with("tokenizer.") {
                let _ = writeln!(w, "  {k:40} {}", show(v));
            }
        }

        if tensors {
            let name_w = f.tensors.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
            let _ = writeln!(w, "\ntensors");
            let _ = writeln!(
                w,
                "  {:name_w$}  {:6}  {:>22}  {:>14}  {:>14}",
                "name", "type", "shape", "bytes", "offset"
            );
            for t in &f.tensors {
                let _ = writeln!(
                    w,
                    "  {:name_w$}  {:6}  {:>22}  {:>14}  {:>14}",
                    t.name,
                    t.ggml_type.name(),
                    shape(t),
                    group(t.size),
                    group(t.offset)
                );
            }
        }

        let _ = writeln!(w, "\ntotals per type");
        let _ = writeln!(
            w,
            "  {:6}  {:>7}  {:>16}  {:>10}  {:>6}",
            "type", "tensors", "parameters", "bytes", "share"
        );
        for (ty, t) in &self.totals {
            let _ = writeln!(
                w,
                "  {:6}  {:>7}  {:>16}  {:>10}  {:>5.1}%",
                ty.name(),
                t.count,
                group(t.params),
                human_bytes(t.bytes),
                100.0 * t.bytes as f64 / self.tensor_bytes.max(1) as f64
            );
        }
        let _ = writeln!(
            w,
            "  {:6}  {:>7}  {:>16}  {:>10}",
            "all",
            f.tensors.len(),
            group(self.params),
            human_bytes(self.tensor_bytes)
        );
        s
    }

    fn json(&self, f: &GgufFile, tensors: bool) -> Json {
        let meta: Map<String, Json> =
            f.metadata.iter().map(|(k, v)| (k.clone(), value_json(v))).collect();
        let totals: Vec<Json> = self
            .totals
            .iter()
            .map(|(ty, t)| json!({"type": ty.name(), "tensors": t.count, "params": t.params, "bytes": t.bytes}))
            .collect();
        let mut j = json!({
            "file_size": f.file_len(),
            "version": f.version,
            "alignment": f.alignment,
            "data_offset": f.data_offset,
            "architecture": self.arch,
            "file_type": f.get_u64("general.file_type").map(file_type_name),
            "params": self.params,
            "tensor_bytes": self.tensor_bytes,
            "bits_per_weight": bits_per_weight(self.tensor_bytes, self.params),
            "n_tensors": f.tensors.len(),
            "metadata": meta,
            "tokenizer": TokSummary::new(f).json(),
            "totals": totals,
        });
        if tensors {
            j["tensors"] = f
                .tensors
                .iter()
                .map(|t| json!({"name": t.name, "type": t.ggml_type.name(), "shape": t.dims, "bytes": t.size, "offset": t.offset}))
                .collect();
        }
        j
    }
}

/// The tokenizer at a glance: model, pre-tokenizer, sizes, special ids with their text.
#[derive(Default)]
struct TokSummary {
    model: Option<String>,
    pre: Option<String>,
    vocab: Option<usize>,
    merges: Option<usize>,
    scores: Option<usize>,
    /// `(label, id, token text if the id is in the vocabulary)`.
    specials: Vec<(&'static str, u64, Option<String>)>,
    flags: Vec<(&'static str, bool)>,
    chat_template_chars: Option<usize>,
}

impl TokSummary {
    fn new(f: &GgufFile) -> TokSummary {
        let tokens = f.get_array("tokenizer.ggml.tokens").and_then(Array::as_str_array);
        let len = |k: &str| f.get_array(k).map(Array::len);
        let specials = [
            ("bos", "bos_token_id"),
            ("eos", "eos_token_id"),
            ("eot", "eot_token_id"),
            ("eom", "eom_token_id"),
            ("unk", "unknown_token_id"),
            ("pad", "padding_token_id"),
            ("sep", "separator_token_id"),
        ]
        .into_iter()
        .filter_map(|(label, key)| {
            let id = f.get_u64(&format!("tokenizer.ggml.{key}"))?;
            Some((label, id, tokens.and_then(|t| t.get(id as usize)).map(String::from)))
        })
        .collect();
        let flags = [("add_bos", "add_bos_token"), ("add_eos", "add_eos_token")]
            .into_iter()
            .filter_map(|(label, key)| Some((label, f.get_bool(&format!("tokenizer.ggml.{key}"))?)))
            .collect();
        TokSummary {
            model: f.get_str("tokenizer.ggml.model").map(String::from),
            pre: f.get_str("tokenizer.ggml.pre").map(String::from),
            vocab: tokens.map(gguf::StrArray::len),
            merges: len("tokenizer.ggml.merges"),
            scores: len("tokenizer.ggml.scores"),
            specials,
            flags,
            chat_template_chars: f.get_str("tokenizer.chat_template").map(|t| t.chars().count()),
        }
    }

    fn lines(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut put = |k: &str, v: String| out.push((k.to_string(), v));
        put(
            "model",
            self.model.clone().unwrap_or_else(|| "none (no tokenizer.ggml.model key)".into()),
        );
        if let Some(p) = &self.pre {
            put("pre", p.clone());
        }
        put("vocab", self.vocab.map_or("missing".into(), |n| group(n as u64)));
        for (k, v) in [("merges", self.merges), ("scores", self.scores)] {
            if let Some(n) = v {
                put(k, group(n as u64));
            }
        }
        for (label, id, text) in &self.specials {
            put(
                label,
                format!(
                    "{id} {}",
                    text.as_ref().map_or("<out of range>".into(), |t| format!("{t:?}"))
                ),
            );
        }
        for (label, b) in &self.flags {
            put(&label.replace('_', " "), b.to_string());
        }
        if let Some(n) = self.chat_template_chars {
            put("chat template", format!("{n} chars"));
        }
        out
    }

    fn json(&self) -> Json {
        let specials: Map<String, Json> = self
            .specials
            .iter()
            .map(|(label, id, text)| (label.to_string(), json!({"id": id, "text": text})))
            .collect();
        let mut j = json!({
            "model": self.model, "pre": self.pre, "vocab": self.vocab, "merges": self.merges,
            "scores": self.scores, "special": specials, "chat_template_chars": self.chat_template_chars,
        });
        for (label, b) in &self.flags {
            j[*label] = json!(b);
        }
        j
    }
}

/// `1536 × 151936` (ggml order: row length first).
fn shape(t: &TensorInfo) -> String {
    t.dims.iter().map(u64::to_string).collect::<Vec<_>>().join(" × ")
}

/// A metadata value on one line: long strings and arrays are summarised.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => short_str(s),
        Value::Array(a) => show_array(a),
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        other => other.as_i64().map_or_else(|| format!("{other:?}"), |i| i.to_string()),
    }
}

fn short_str(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}… ({} chars)", s.chars().count())
    }
}

fn show_array(a: &Array) -> String {
    const HEAD: usize = 6;
    let head: Vec<String> = match a {
        Array::String(v) => v.iter().take(HEAD).map(short_str).collect(),
        Array::F32(v) => v.iter().take(HEAD).map(f32::to_string).collect(),
        Array::F64(v) => v.iter().take(HEAD).map(f64::to_string).collect(),
        Array::Array(v) => v.iter().take(HEAD).map(show_array).collect(),
        other => {
            other.to_i64s().unwrap_or_default().iter().take(HEAD).map(i64::to_string).collect()
        }
    };
    let more = if a.len() > HEAD { ", …" } else { "" };
    format!("[{} × {:?}] [{}{more}]", group(a.len() as u64), a.elem_type(), head.join(", "))
}

/// JSON for one value; arrays longer than 64 become `{type, len, head}` so a 262k vocabulary
/// does not flood the output.
fn value_json(v: &Value) -> Json {
    match v {
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) => array_json(a),
        other => other.as_i64().map_or(Json::Null, |i| json!(i)),
    }
}

fn array_json(a: &Array) -> Json {
    const FULL: usize = 64;
    let items: Vec<Json> = match a {
        Array::String(v) => v.iter().take(FULL).map(|s| json!(s)).collect(),
        Array::F32(v) => v.iter().take(FULL).map(|x| json!(x)).collect(),
        Array::F64(v) => v.iter().take(FULL).map(|x| json!(x)).collect(),
        Array::Bool(v) => v.iter().take(FULL).map(|x| json!(x)).collect(),
        Array::Array(v) => v.iter().take(FULL).map(array_json).collect(),
        other => {
            other.to_i64s().unwrap_or_default().into_iter().take(FULL).map(|x| json!(x)).collect()
        }
    };
    if a.len() <= FULL {
        Json::Array(items)
    } else {
        json!({"type": format!("{:?}", a.elem_type()), "len": a.len(), "head": items})
    }
}

/// llama.cpp's `llama_ftype` names for `general.file_type`.
fn file_type_name(ft: u64) -> &'static str {
    match ft {
        0 => "all F32",
        1 => "mostly F16",
        2 => "mostly Q4_0",
        3 => "mostly Q4_1",
        7 => "mostly Q8_0",
        8 => "mostly Q5_0",
        9 => "mostly Q5_1",
        10 => "mostly Q2_K",
        11 => "mostly Q3_K_S",
        12 => "mostly Q3_K_M",
        13 => "mostly Q3_K_L",
        14 => "mostly Q4_K_S",
        15 => "mostly Q4_K_M",
        16 => "mostly Q5_K_S",
        17 => "mostly Q5_K_M",
        18 => "mostly Q6_K",
        19 => "mostly IQ2_XXS",
        20 => "mostly IQ2_XS",
        21 => "mostly Q2_K_S",
        22 => "mostly IQ3_XS",
        23 => "mostly IQ3_XXS",
        24 => "mostly IQ1_S",
        25 => "mostly IQ4_NL",
        26 => "mostly IQ3_S",
        27 => "mostly IQ3_M",
        28 => "mostly IQ2_S",
        29 => "mostly IQ2_M",
        30 => "mostly IQ4_XS",
        31 => "mostly IQ1_M",
        32 => "mostly BF16",
        36 => "mostly TQ1_0",
        37 => "mostly TQ2_0",
        38 => "mostly MXFP4 (MoE)",
        _ => "unknown",
    }
}

fn bits_per_weight(bytes: u64, params: u64) -> f64 {
    if params == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / params as f64
    }
}

/// `1117320768` → `1,117,320,768`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.2} {}", UNITS[u])
    }
}

fn human_count(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=9_999_999 => format!("{:.1} K", n as f64 / 1e3),
        10_000_000..=999_999_999 => format!("{:.1} M", n as f64 / 1e6),
        _ => format!("{:.2} B", n as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::{GgufWriter, TensorSpec};

    fn small_file() -> GgufFile {
        let mut w = GgufWriter::new(Vec::new());
        w.add_kv("general.architecture", Value::String("llama".into()));
        w.add_kv("llama.block_count", Value::U32(2));
        w.add_kv("tokenizer.ggml.model", Value::String("gpt2".into()));
        w.add_kv("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["a", "b"].into())));
        w.add_kv("tokenizer.ggml.bos_token_id", Value::U32(1));
        w.add_kv("tokenizer.ggml.eos_token_id", Value::U32(7));
        let spec = |name: &str, dims: Vec<u64>, ggml_type| TensorSpec {
            name: name.into(),
            dims,
            ggml_type,
        };
        w.add_tensor(spec("a", vec![256, 2], GgmlType::Q4K)).unwrap();
        w.add_tensor(spec("b", vec![4], GgmlType::F32)).unwrap();
        w.write_header().unwrap();
        w.write_tensor(&[0u8; 288]).unwrap();
        w.write_tensor(&[0u8; 16]).unwrap();
        GgufFile::from_bytes(w.finish().unwrap()).unwrap()
    }

    #[test]
    fn text_report_has_every_section_and_totals() {
        let f = small_file();
        let r = Report::new(&f);
        assert_eq!(r.params, 516);
        assert_eq!(r.tensor_bytes, 304);
        let t = r.text(&f, "x.gguf", true);
        for needle in [
            "hyper-parameters",
            "block_count",
            "vocab",
            "bos",
            "1 \"b\"",
            "7 <out of range>",
            "q4_K",
            "256 × 2",
            "totals per type",
        ] {
            assert!(t.contains(needle), "missing {needle:?} in\n{t}");
        }
    }

    #[test]
    fn json_report_summarises_long_arrays() {
        let f = small_file();
        let j = Report::new(&f).json(&f, true);
        assert_eq!(j["tensors"][0]["shape"], json!([256, 2]));
        assert_eq!(j["metadata"]["llama.block_count"], json!(2));
        let long = Array::U32((0..100).collect());
        assert_eq!(array_json(&long)["len"], json!(100));
    }

    #[test]
    fn numbers_are_grouped_and_humanised() {
        assert_eq!(group(1117320768), "1,117,320,768");
        assert_eq!(group(999), "999");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_count(1_540_000_000), "1.54 B");
    }
}
