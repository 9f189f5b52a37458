//! Block layouts of the ggml quantized formats, byte for byte as GGUF stores them.
//! Every struct is `#[repr(C)]`, padding-free plain data (`bytemuck::Pod`) with a compile-time
//! size assert, so a block is read with one unaligned copy (or cast in place when aligned).
//!
//! Naming follows ggml: `d` is the block (super-)scale, `dmin`/`m` the min, `qs` the packed
//! low bits, `qh` the packed high bits. f16 fields are `half::f16`; all multi-byte fields are
//! little-endian (GGUF is little-endian and so are the CPUs snug targets).

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::GgmlType;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Values per block of the legacy formats (Q4_0 .. Q8_1, IQ4_NL).
pub const QK: usize = 32;
/// Bytes of packed 6-bit scales/mins in Q3_K, Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Codebook of IQ4_NL and IQ4_XS: the 16 non-linear levels a 4-bit index selects.
pub const IQ4_NL_VALUES: [i8; 16] =
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// A block format: plain bytes of exactly `TYPE.type_size()` bytes holding `TYPE.block_size()`
/// values.
pub trait Block: Pod {
    /// The ggml type this block belongs to.
    const TYPE: GgmlType;
    /// Values per block.
    const VALUES: usize = Self::TYPE.block_size();
    /// Bytes per block (equal to `size_of::<Self>()`, checked at compile time).
    const BYTES: usize = Self::TYPE.type_size();

    /// Copy one block out of `bytes`, which must be exactly [`Block::BYTES`] long (callers slice
    /// with `chunks_exact(Self::BYTES)`).
    ///
    /// # Panics
    /// If `bytes.len() != Self::BYTES`; [`crate::dequantize_row`] checks lengths and never does.
    fn read(bytes: &[u8]) -> Self {
        bytemuck::pod_read_unaligned(bytes)
    }
}

/// Q4_0: 32 values `d * (q - 8)`, q 4-bit. `qs[j]` holds value j (low nibble) and j+16 (high).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// Q4_1: 32 values `d * q + m`, q 4-bit, nibble order as Q4_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// Q5_0: 32 values `d * (q - 16)`, q 5-bit: low nibbles as Q4_0, bit 4 of value j is bit j of
/// the little-endian u32 `qh`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: 32 values `d * q + m`, q 5-bit laid out as Q5_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: 32 values `d * q`, q i8.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// Q8_1: 32 values `d * q`, q i8, plus `s = d * sum(q)` (the dot-product partner of Q4_1/Q5_1).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// Q2_K: 256 values in 16 sub-blocks of 16; value = `d * (sc & 0xF) * q - dmin * (sc >> 4)`,
/// q 2-bit. `qs` is two 128-value halves of 32 bytes, each byte holding 4 values at bit shifts
/// 0, 2, 4, 6 (32 values apart).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// Q3_K: 256 values in 16 sub-blocks of 16; value = `d * (scale - 32) * (q - 4 * !hbit)`, q the
/// 2 low bits (packed as Q2_K), hbit bit `j / 32` of `hmask[j % 32]`; the 16 6-bit scales are
/// packed in 12 bytes (low nibbles in bytes 0..8, high 2 bits in bytes 8..12).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; K_SCALE_SIZE],
    pub d: f16,
}

/// Q4_K: 256 values in 8 sub-blocks of 32; value = `d * sc * q - dmin * m`, q 4-bit, with 6-bit
/// `sc`/`m` per sub-block packed in `scales` (see [`scale_min_k4`]). `qs` is four 64-value
/// chunks of 32 bytes: low nibbles are the first 32 values, high nibbles the next 32.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K plus a fifth bit: bit 4 of value `j` is bit `j / 32` of `qh[j % 32]`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 values in 16 sub-blocks of 16; value = `d * scales[i] * (q - 32)`, q 6-bit: low 4
/// bits in `ql`, high 2 bits in `qh`, per 128-value half (64 `ql` bytes, 32 `qh` bytes).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// Q8_K: 256 values `d * q`, q i8, f32 scale, plus `bsums[i]` = sum of q over values
/// 16i..16i+16 (used by K-quant dot products to fold in the mins).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

/// IQ4_NL: 32 values `d * IQ4_NL_VALUES[q]`, q 4-bit, nibble order as Q4_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// IQ4_XS: 256 values in 8 sub-blocks of 32; value = `d * (ls - 32) * IQ4_NL_VALUES[q]`, with the
/// 6-bit `ls` of sub-block i = nibble i of `scales_l` | bits 2i..2i+2 of `scales_h` << 4. Each
/// sub-block's 32 indices are 16 bytes, nibble order as Q4_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

macro_rules! impl_block {
    ($($block:ident => $ty:ident),* $(,)?) => {$(
        impl Block for $block {
            const TYPE: GgmlType = GgmlType::$ty;
        }
        const _: () = assert!(size_of::<$block>() == GgmlType::$ty.type_size());
    )*};
}

impl_block! {
    BlockQ4_0 => Q4_0, BlockQ4_1 => Q4_1, BlockQ5_0 => Q5_0, BlockQ5_1 => Q5_1,
    BlockQ8_0 => Q8_0, BlockQ8_1 => Q8_1, BlockQ2K => Q2K, BlockQ3K => Q3K, BlockQ4K => Q4K,
    BlockQ5K => Q5K, BlockQ6K => Q6K, BlockQ8K => Q8K, BlockIQ4NL => IQ4NL, BlockIQ4XS => IQ4XS,
}

/// `with_block!(ty, f(args..), otherwise)`: call `f::<B>(args..)` with `B` the block struct of
/// `ty`, or evaluate `otherwise` for types that have none here (floats, integers, the grid IQ
/// formats, ternary, MXFP4). The one table from ggml type to block struct.
macro_rules! with_block {
    ($ty:expr, $f:ident($($arg:expr),*), $otherwise:expr) => {{
        use $crate::blocks::*;
        match $ty {
            GgmlType::Q4_0 => $f::<BlockQ4_0>($($arg),*),
            GgmlType::Q4_1 => $f::<BlockQ4_1>($($arg),*),
            GgmlType::Q5_0 => $f::<BlockQ5_0>($($arg),*),
            GgmlType::Q5_1 => $f::<BlockQ5_1>($($arg),*),
            GgmlType::Q8_0 => $f::<BlockQ8_0>($($arg),*),
            GgmlType::Q8_1 => $f::<BlockQ8_1>($($arg),*),
            GgmlType::Q2K => $f::<BlockQ2K>($($arg),*),
            GgmlType::Q3K => $f::<BlockQ3K>($($arg),*),
            GgmlType::Q4K => $f::<BlockQ4K>($($arg),*),
            GgmlType::Q5K => $f::<BlockQ5K>($($arg),*),
            GgmlType::Q6K => $f::<BlockQ6K>($($arg),*),
            GgmlType::Q8K => $f::<BlockQ8K>($($arg),*),
            GgmlType::IQ4NL => $f::<BlockIQ4NL>($($arg),*),
            GgmlType::IQ4XS => $f::<BlockIQ4XS>($($arg),*),
            _ => $otherwise,
        }
    }};
}
pub(crate) use with_block;

// The byte sizes ggml's `static_assert`s pin, written out so a wrong type table fails here too.
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ2K>() == 84);
const _: () = assert!(size_of::<BlockQ3K>() == 110);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

/// The 6-bit (scale, min) of sub-block `j` (0..8) of Q4_K/Q5_K, unpacked from 12 bytes:
/// bytes 0..4 hold scales 0..4 (low 6 bits) and the top 2 bits of scales 4..8; bytes 4..8 the
/// same for mins; bytes 8..12 the low nibbles of scales 4..8 (low) and mins 4..8 (high).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 16 signed scales of a Q3_K block (each 6-bit value minus 32).
#[inline]
pub fn scales_q3k(q: &[u8; K_SCALE_SIZE]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { q[i] & 0xF } else { q[i - 8] >> 4 };
        let high = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// The signed 6-bit scale of sub-block `ib` (0..8) of an IQ4_XS block (value minus 32).
#[inline]
pub fn scale_iq4xs(b: &BlockIQ4XS, ib: usize) -> i32 {
    let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = ((b.scales_h >> (2 * ib)) & 3) as u8;
    i32::from(low | (high << 4)) - 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_constants_match_the_type_table() {
        assert_eq!(BlockQ6K::BYTES, 210);
        assert_eq!(BlockQ6K::VALUES, 256);
        assert_eq!(BlockQ8_0::VALUES, 32);
    }

    #[test]
    fn read_copies_fields_at_their_ggml_offsets() {
        let mut bytes = [0u8; 144];
        bytes[0..2].copy_from_slice(&f16::from_f32(1.5).to_le_bytes());
        bytes[2..4].copy_from_slice(&f16::from_f32(-2.0).to_le_bytes());
        bytes[4] = 7;
        bytes[16] = 0xAB;
        bytes[143] = 0xCD;
        let b = BlockQ4K::read(&bytes);
        assert_eq!(b.d.to_f32(), 1.5);
        assert_eq!(b.dmin.to_f32(), -2.0);
        assert_eq!(b.scales[0], 7);
        assert_eq!(b.qs[0], 0xAB);
        assert_eq!(b.qs[127], 0xCD);
    }

    #[test]
    fn scale_min_k4_unpacks_high_sub_blocks() {
        // sub-block 5: scale = low nibble of byte 9 | top 2 bits of byte 1 << 4;
        //              min   = high nibble of byte 9 | top 2 bits of byte 5 << 4.
        let mut q = [0u8; 12];
        q[9] = 0xA3;
        q[1] = 0b1100_0000;
        q[5] = 0b0100_0000;
        assert_eq!(scale_min_k4(5, &q), (0x3 | (3 << 4), 0xA | (1 << 4)));
    }

    #[test]
    fn q3k_scales_are_offset_by_32() {
        let q = [0u8; 12];
        assert_eq!(scales_q3k(&q), [-32; 16]);
        let mut q = [0u8; 12];
        q[0] = 0xFF; // scale 0 low = 15, scale 8 low = 15
        q[8] = 0b0000_0011; // scale 0 high = 3
        let s = scales_q3k(&q);
        assert_eq!(s[0], 63 - 32);
        assert_eq!(s[8], 15 - 32);
    }
}
