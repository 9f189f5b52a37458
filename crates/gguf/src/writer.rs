//! GGUF v3 writer. The header is written first (every tensor's name, shape, type and offset are
//! known up front), then tensor data is streamed in declaration order, each tensor padded to the
//! alignment. A 4 GB model can be written without holding more than one tensor in memory.

use std::io::Write;

use quant::GgmlType;

use crate::reader::{align_up, tensor_size};
use crate::value::{Array, Value};
use crate::{GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC};

/// A tensor to be written: its data arrives later through [`GgufWriter::write_tensor`].
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

/// Writes one GGUF file: [`GgufWriter::new`] → [`GgufWriter::write_header`] → one
/// [`GgufWriter::write_tensor`] per spec, in order → [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    out: W,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(TensorSpec, u64, u64)>, // spec, offset, size
    pos: u64,
    next_tensor: usize,
    header_written: bool,
}

impl<W: Write> GgufWriter<W> {
    pub fn new(out: W) -> Self {
        GgufWriter {
            out,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
            pos: 0,
            next_tensor: 0,
            header_written: false,
        }
    }

    /// Adds a metadata entry. `general.alignment` (u32) also sets the data alignment.
    pub fn add_kv(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if key == "general.alignment" {
            if let Some(a) = value.as_u64() {
                self.alignment = a;
            }
        }
        self.metadata.push((key, value));
        self
    }

    /// Declares a tensor; its data must be written later, in declaration order.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<&mut Self, GgufError> {
        if spec.dims.is_empty() || spec.dims.len() > crate::MAX_DIMS {
            return Err(GgufError::Writer(format!(
                "tensor {:?}: {} dimensions",
                spec.name,
                spec.dims.len()
            )));
        }
        let size = tensor_size(&spec.name, &spec.dims, spec.ggml_type)?;
        let offset = match self.tensors.last() {
            None => 0,
            Some((_, off, sz)) => off
                .checked_add(*sz)
                .and_then(|end| align_up(end, self.alignment))
                .ok_or_else(|| {
                    GgufError::Writer(format!(
                        "tensor {:?}: the tensors before it fill the 64-bit offset range \
                             (or general.alignment {} is 0)",
                        spec.name, self.alignment
                    ))
                })?,
        };
        self.tensors.push((spec, offset, size));
        Ok(self)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.out.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn put_str(&mut self, s: &str) -> Result<(), GgufError> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn pad_to_alignment(&mut self) -> Result<(), GgufError> {
        let target = align_up(self.pos, self.alignment)
            .ok_or_else(|| GgufError::BadAlignment(self.alignment.to_string()))?;
        // From a fixed block: a large alignment (up to 2^30) is no large allocation.
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.pos < target {
            let n = (target - self.pos).min(ZEROS.len() as u64) as usize;
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }

    pub fn write_header(&mut self) -> Result<(), GgufError> {
        if !self.alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment(self.alignment.to_string()));
        }
        self.put(&GGUF_MAGIC)?;
        self.put(&3u32.to_le_bytes())?;
        self.put(&(self.tensors.len() as u64).to_le_bytes())?;
        self.put(&(self.metadata.len() as u64).to_le_bytes())?;
        let metadata = std::mem::take(&mut self.metadata);
        for (k, v) in &metadata {
            self.put_str(k)?;
            self.put(&(v.value_type() as u32).to_le_bytes())?;
            self.put_value(v)?;
        }
        self.metadata = metadata;
        let tensors = std::mem::take(&mut self.tensors);
        for (spec, offset, _) in &tensors {
            self.put_str(&spec.name)?;
            self.put(&(spec.dims.len() as u32).to_le_bytes())?;
            for d in &spec.dims {
                self.put(&d.to_le_bytes())?;
            }
            self.put(&spec.ggml_type.id().to_le_bytes())?;
            self.put(&offset.to_le_bytes())?;
        }
        self.tensors = tensors;
        self.pad_to_alignment()?;
        self.pos = 0; // from here on, positions are relative to the data section
        self.header_written = true;
        Ok(())
    }

    /// Writes the data of the next declared tensor; `data` must be exactly its size.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), GgufError> {
        if !self.header_written {
            return Err(GgufError::Writer("write_header must come before tensor data".into()));
        }
        let Some((spec, offset, size)) = self.tensors.get(self.next_tensor).cloned() else {
            return Err(GgufError::Writer("more tensor data than declared tensors".into()));
        };
        if data.len() as u64 != size {
            return Err(GgufError::Writer(format!(
                "tensor {:?} needs {size} bytes, got {}",
                spec.name,
                data.len()
            )));
        }
        self.pad_to_alignment()?;
        debug_assert_eq!(self.pos, offset);
        self.put(data)?;
        self.next_tensor += 1;
        Ok(())
    }

    /// Checks every declared tensor was written, pads the end, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if self.next_tensor != self.tensors.len() {
            return Err(GgufError::Writer(format!(
                "{} of {} tensors written",
                self.next_tensor,
                self.tensors.len()
            )));
        }
        if !self.header_written {
            self.write_header()?;
        }
        self.pad_to_alignment()?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn put_value(&mut self, v: &Value) -> Result<(), GgufError> {
        match v {
            Value::U8(x) => self.put(&[*x]),
            Value::I8(x) => self.put(&[*x as u8]),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::Bool(x) => self.put(&[*x as u8]),
            Value::String(s) => self.put_str(s),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
            Value::Array(a) => self.put_array(a),
        }
    }

    fn put_array(&mut self, a: &Array) -> Result<(), GgufError> {
        self.put(&(a.elem_type() as u32).to_le_bytes())?;
        self.put(&(a.len() as u64).to_le_bytes())?;
        macro_rules! each {
            ($v:expr, $f:expr) => {{
                for x in $v {
                    let b = $f(x);
                    self.put(&b)?;
                }
                Ok(())
            }};
        }
        match a {
            Array::U8(v) => self.put(v),
            Array::I8(v) => each!(v, |x: &i8| [*x as u8]),
            Array::U16(v) => each!(v, |x: &u16| x.to_le_bytes()),
            Array::I16(v) => each!(v, |x: &i16| x.to_le_bytes()),
            Array::U32(v) => each!(v, |x: &u32| x.to_le_bytes()),
            Array::I32(v) => each!(v, |x: &i32| x.to_le_bytes()),
            Array::F32(v) => each!(v, |x: &f32| x.to_le_bytes()),
            Array::Bool(v) => each!(v, |x: &bool| [*x as u8]),
            Array::U64(v) => each!(v, |x: &u64| x.to_le_bytes()),
            Array::I64(v) => each!(v, |x: &i64| x.to_le_bytes()),
            Array::F64(v) => each!(v, |x: &f64| x.to_le_bytes()),
            Array::String(v) => {
                for s in v.iter() {
                    self.put_str(s)?;
                }
                Ok(())
            }
            Array::Array(v) => {
                for inner in v {
                    self.put_array(inner)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufFile;

    #[test]
    fn write_then_read_round_trips_bit_for_bit() {
        let mut w = GgufWriter::new(Vec::new());
        w.add_kv("general.architecture", Value::String("llama".into()));
        w.add_kv("x.f", Value::F32(1.5));
        w.add_kv(
            "x.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::String(vec!["a"].into()),
            ])),
        );
        w.add_tensor(TensorSpec { name: "a".into(), dims: vec![32, 2], ggml_type: GgmlType::Q8_0 })
            .unwrap();
        w.add_tensor(TensorSpec { name: "b".into(), dims: vec![3], ggml_type: GgmlType::F32 })
            .unwrap();
        w.write_header().unwrap();
        let a: Vec<u8> = (0..68).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..12).map(|i| 200 - i as u8).collect();
        w.write_tensor(&a).unwrap();
        w.write_tensor(&b).unwrap();
        let bytes = w.finish().unwrap();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(f.get_str("general.architecture"), Some("llama"));
        assert_eq!(f.get("x.f"), Some(&Value::F32(1.5)));
        assert_eq!(f.tensor_data(f.tensor("a").unwrap()), &a[..]);
        assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &b[..]);
        // Re-writing what we read gives the same bytes.
        let mut w2 = GgufWriter::new(Vec::new());
        for (k, v) in &f.metadata {
            w2.add_kv(k.clone(), v.clone());
        }
        for t in &f.tensors {
            w2.add_tensor(TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ggml_type: t.ggml_type,
            })
            .unwrap();
        }
        w2.write_header().unwrap();
        for t in &f.tensors {
            w2.write_tensor(f.tensor_data(t)).unwrap();
        }
        assert_eq!(w2.finish().unwrap(), bytes);
    }
}
