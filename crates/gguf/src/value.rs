//! GGUF metadata values. Arrays are stored typed (a `Vec<u32>`, a [`StrArray`], ...): a
//! 262,144-entry vocabulary is one text buffer and one span per string (8 bytes), not an enum,
//! a `String` and a heap allocation per element (≈ 56 bytes each with malloc's rounding).

/// The value type ids GGUF stores before each value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of one scalar of this type; `None` for strings and arrays (variable).
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The smallest number of bytes one element of this type can take in a file (strings take
    /// at least their 8-byte length, arrays their 12-byte header). Used to reject absurd counts
    /// before allocating.
    pub fn min_encoded_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed array value; arrays of arrays nest.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StrArray),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value that fits in u64 (GGUF writers are loose about integer widths).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            Value::Bool(v) => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => self.as_u64().map(|v| v != 0),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The strings of a string array.
    pub fn as_str_array(&self) -> Option<&StrArray> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// Where each string of a string array lies; `len()` of each is its byte length. The text is
    /// in [`Array::as_str_array`].
    pub fn as_strings(&self) -> Option<&[StrSpan]> {
        self.as_str_array().map(StrArray::spans)
    }

    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            Array::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Integer elements widened to i64 (token types are i32, some writers use u32 or i8...);
    /// `None` for other arrays and for a u64 array holding a value past `i64::MAX` (never
    /// wrapped to a negative number).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        self.iter_i64s().map(Iterator::collect)
    }

    /// [`Array::to_i64s`] without collecting: for reading a vocabulary-sized array once.
    pub fn iter_i64s(&self) -> Option<Box<dyn ExactSizeIterator<Item = i64> + '_>> {
        Some(match self {
            Array::U8(v) => Box::new(v.iter().map(|&x| x as i64)),
            Array::I8(v) => Box::new(v.iter().map(|&x| x as i64)),
            Array::U16(v) => Box::new(v.iter().map(|&x| x as i64)),
            Array::I16(v) => Box::new(v.iter().map(|&x| x as i64)),
            Array::U32(v) => Box::new(v.iter().map(|&x| x as i64)),
            Array::I32(v) => Box::new(v.iter().map(|&x| x as i64)),
            Array::U64(v) if v.iter().all(|&x| i64::try_from(x).is_ok()) => {
                Box::new(v.iter().map(|&x| x as i64))
            }
            Array::I64(v) => Box::new(v.iter().copied()),
            Array::Bool(v) => Box::new(v.iter().map(|&x| x as i64)),
            _ => return None,
        })
    }
}

/// Where one string of a [`StrArray`] lies in its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrSpan {
    start: u32,
    len: u32,
}

impl StrSpan {
    /// Byte length of the string.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// An array of strings: all their text back to back in one `String`, and a `[len]` span per
/// string into it. Text is at most 4 GiB (u32 offsets), which GGUF readers check.
#[derive(Clone, Debug, Default)]
pub struct StrArray {
    text: String,
    spans: Vec<StrSpan>,
}

impl StrArray {
    pub fn with_capacity(n: usize, text_bytes: usize) -> StrArray {
        StrArray { text: String::with_capacity(text_bytes), spans: Vec::with_capacity(n) }
    }

    /// Appends `s`; `None` (nothing appended) when the text would pass 4 GiB.
    pub fn try_push(&mut self, s: &str) -> Option<()> {
        let start = u32::try_from(self.text.len()).ok()?;
        let len = u32::try_from(s.len()).ok()?;
        start.checked_add(len)?;
        self.text.push_str(s);
        self.spans.push(StrSpan { start, len });
        Some(())
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        self.spans.get(i).map(|s| &self.text[s.range()])
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.spans.iter().map(|s| &self.text[s.range()])
    }

    pub fn spans(&self) -> &[StrSpan] {
        &self.spans
    }

    /// Bytes of text of all the strings together.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }
}

/// Equal when the strings are (how the text is laid out does not matter).
impl PartialEq for StrArray {
    fn eq(&self, o: &Self) -> bool {
        self.len() == o.len() && self.iter().eq(o.iter())
    }
}

impl<S: AsRef<str>> FromIterator<S> for StrArray {
    /// Panics past 4 GiB of text, which no metadata array a writer builds comes near.
    fn from_iter<I: IntoIterator<Item = S>>(it: I) -> StrArray {
        let mut a = StrArray::default();
        for s in it {
            a.try_push(s.as_ref()).expect("a string array holds at most 4 GiB of text");
        }
        a
    }
}

impl<S: AsRef<str>> From<Vec<S>> for StrArray {
    fn from(v: Vec<S>) -> StrArray {
        v.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_array_gives_back_each_string_and_its_length() {
        let words = ["<s>", "", "héllo", "▁a b"];
        let a: StrArray = words.iter().collect();
        assert_eq!(a.len(), 4);
        assert!(a.iter().eq(words));
        assert_eq!(a.get(2), Some("héllo"));
        assert_eq!(a.get(4), None);
        let lens: Vec<usize> = a.spans().iter().map(StrSpan::len).collect();
        assert_eq!(lens, [3, 0, 6, 6]);
        assert_eq!(a.text_len(), 15);
        let arr = Array::String(a.clone());
        assert_eq!(arr.as_strings().map(<[StrSpan]>::len), Some(4));
        assert_eq!(arr.as_str_array(), Some(&a));
    }

    #[test]
    fn string_arrays_are_equal_by_their_strings_not_their_layout() {
        let mut a = StrArray::with_capacity(2, 100);
        a.try_push("ab").unwrap();
        a.try_push("c").unwrap();
        let b: StrArray = vec!["ab", "c"].into();
        let c: StrArray = vec!["a", "bc"].into();
        assert_eq!(a, b);
        assert_ne!(a, c, "same text, other boundaries");
    }
}
