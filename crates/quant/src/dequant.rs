//! Scalar reference dequantize: GGUF row bytes → f32, one block at a time, exactly as
//! ggml's `dequantize_row_*` (same operation order, so results are bit-identical to ggml and
//! gguf-py). Cost: one unaligned block copy plus a few flops per value; no allocation.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::blocks::{with_block, *};
use crate::{GgmlType, QuantError};

/// Dequantize one row: `src` holds `dst.len()` values of type `ty` as stored in GGUF
/// (`ty.row_bytes(dst.len())` bytes, blocks back to back); `dst` receives them as f32.
///
/// Errors if `dst.len()` is not a whole number of blocks, if `src` is not exactly one row long,
/// or if `ty` has no dequantizer here ([`QuantError::Unsupported`]).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    // Reject unsupported types before length checks so the error names the real problem.
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    QuantError::check_row(ty, dst.len(), src.len())?;
    match ty {
        F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        F16 => halves::<f16>(src, dst),
        BF16 => halves::<bf16>(src, dst),
        _ => with_block!(ty, blocks(src, dst), return Err(QuantError::Unsupported(ty))),
    }
    Ok(())
}

/// Whether [`dequantize_row`] handles `ty`.
pub const fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2K | Q3K | Q4K | Q5K
        | Q6K | Q8K | IQ4NL | IQ4XS => true,
        IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S | I8 | I16 | I32 | I64 | F64 | IQ1M
        | TQ1_0 | TQ2_0 | MXFP4 => false,
    }
}

/// 16-bit floats → f32 through `half`'s slice conversion (F16C when the CPU has it, detected
/// at run time); unaligned input goes through a small stack buffer.
fn halves<H: bytemuck::Pod>(src: &[u8], dst: &mut [f32])
where
    [H]: HalfFloatSliceExt,
{
    match bytemuck::try_cast_slice::<u8, H>(src) {
        Ok(h) => h.convert_to_f32_slice(dst),
        Err(_) => {
            let mut buf = [H::zeroed(); 256];
            for (s, d) in src.chunks(512).zip(dst.chunks_mut(256)) {
                let h = &mut buf[..d.len()];
                bytemuck::cast_slice_mut::<H, u8>(h).copy_from_slice(s);
                h.convert_to_f32_slice(d);
            }
        }
    }
}

/// A block that knows how to expand itself into `B::VALUES` floats.
pub trait Dequantize: Block {
    /// Write this block's values to `y` (`y.len() == Self::VALUES`).
    fn dequantize(&self, y: &mut [f32]);
}

/// Dequantize whole blocks; lengths were checked by the caller.
fn blocks<B: Dequantize>(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(B::BYTES).zip(dst.chunks_exact_mut(B::VALUES)) {
        B::read(b).dequantize(y);
    }
}

/// Expand 16 bytes of packed nibbles into 32 values: byte j gives value j (low nibble) and
/// value j + 16 (high nibble), each mapped through `f`.
#[inline]
fn nibbles(qs: &[u8], y: &mut [f32], f: impl Fn(u8) -> f32) {
    let (lo, hi) = y.split_at_mut(qs.len());
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = f(q & 0xF);
        *h = f(q >> 4);
    }
}

impl Dequantize for BlockQ4_0 {
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        nibbles(&self.qs, y, |q| (i32::from(q) - 8) as f32 * d);
    }
}

impl Dequantize for BlockQ4_1 {
    fn dequantize(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        nibbles(&self.qs, y, |q| f32::from(q) * d + m);
    }
}

/// The 32 5-bit values of a Q5_0/Q5_1 block: low nibbles from `qs`, bit 4 from `qh`.
#[inline]
fn q5_values(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut v = [0u8; 32];
    for (j, &q) in qs.iter().enumerate() {
        v[j] = (q & 0xF) | (((qh >> j) << 4) as u8 & 0x10);
        v[j + 16] = (q >> 4) | ((qh >> (j + 12)) as u8 & 0x10);
    }
    v
}

impl Dequantize for BlockQ5_0 {
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, q) in y.iter_mut().zip(q5_values(self.qh, &self.qs)) {
            *y = (i32::from(q) - 16) as f32 * d;
        }
    }
}

impl Dequantize for BlockQ5_1 {
    fn dequantize(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (y, q) in y.iter_mut().zip(q5_values(self.qh, &self.qs)) {
            *y = f32::from(q) * d + m;
        }
    }
}

/// `y[i] = d * qs[i]` for the 8-bit formats.
#[inline]
fn scale_i8(d: f32, qs: &[i8], y: &mut [f32]) {
    for (y, &q) in y.iter_mut().zip(qs) {
        *y = f32::from(q) * d;
    }
}

impl Dequantize for BlockQ8_0 {
    fn dequantize(&self, y: &mut [f32]) {
        scale_i8(self.d.to_f32(), &self.qs, y);
    }
}

impl Dequantize for BlockQ8_1 {
    fn dequantize(&self, y: &mut [f32]) {
        scale_i8(self.d.to_f32(), &self.qs, y);
    }
}

impl Dequantize for BlockQ8K {
    fn dequantize(&self, y: &mut [f32]) {
        scale_i8(self.d, &self.qs, y);
    }
}

impl Dequantize for BlockQ2K {
    fn dequantize(&self, y: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        // Group g of 32 values: bytes qs[32 * (g / 4)..][..32] at bit shift 2 * (g % 4); its two
        // halves of 16 are sub-blocks 2g and 2g + 1.
        for (g, y) in y.chunks_exact_mut(32).enumerate() {
            let (qs, shift) = (&self.qs[32 * (g / 4)..32 * (g / 4) + 32], 2 * (g % 4));
            for (s, (y, qs)) in y.chunks_exact_mut(16).zip(qs.chunks_exact(16)).enumerate() {
                let sc = self.scales[2 * g + s];
                let (dl, ml) = (d * f32::from(sc & 0xF), dmin * f32::from(sc >> 4));
                for (y, &q) in y.iter_mut().zip(qs) {
                    *y = dl * f32::from((q >> shift) & 3) - ml;
                }
            }
        }
    }
}

impl Dequantize for BlockQ3K {
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        let scales = scales_q3k(&self.scales);
        // Low 2 bits packed as Q2_K; the high bit of value 32g + l is bit g of hmask[l], and a
        // clear high bit means "subtract 4".
        for (g, y) in y.chunks_exact_mut(32).enumerate() {
            let (qs, shift) = (&self.qs[32 * (g / 4)..32 * (g / 4) + 32], 2 * (g % 4));
            for (s, y) in y.chunks_exact_mut(16).enumerate() {
                let dl = d * f32::from(scales[2 * g + s]);
                let (qs, hm) = (&qs[16 * s..16 * s + 16], &self.hmask[16 * s..16 * s + 16]);
                for ((y, &q), &h) in y.iter_mut().zip(qs).zip(hm) {
                    let low = ((q >> shift) & 3) as i8;
                    let sub = (((h >> g) & 1) ^ 1) as i8 * 4;
                    *y = dl * f32::from(low - sub);
                }
            }
        }
    }
}

/// Shared body of Q4_K and Q5_K: chunk c of 64 values uses qs[32c..32c+32], low nibbles for
/// sub-block 2c and high nibbles for 2c + 1; bit 4 of value v is bit v / 32 of qh[v % 32]
/// (all zero for Q4_K). value = d * sc * q - dmin * m.
#[inline]
fn k4_dequantize(
    d: f16,
    dmin: f16,
    scales: &[u8; K_SCALE_SIZE],
    qs: &[u8],
    qh: &[u8; 32],
    y: &mut [f32],
) {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    let sm: [(f32, f32); 8] = std::array::from_fn(|j| {
        let (sc, m) = scale_min_k4(j, scales);
        (d * f32::from(sc), dmin * f32::from(m))
    });
    for (c, (qs, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let ((d1, m1), (d2, m2)) = (sm[2 * c], sm[2 * c + 1]);
        let (lo, hi) = y.split_at_mut(32);
        for ((&q, &h), (yl, yh)) in qs.iter().zip(qh).zip(lo.iter_mut().zip(hi)) {
            let bl = ((h >> (2 * c)) & 1) << 4;
            let bh = ((h >> (2 * c + 1)) & 1) << 4;
            *yl = d1 * f32::from((q & 0xF) | bl) - m1;
            *yh = d2 * f32::from((q >> 4) | bh) - m2;
        }
    }
}

impl Dequantize for BlockQ4K {
    fn dequantize(&self, y: &mut [f32]) {
        k4_dequantize(self.d, self.dmin, &self.scales, &self.qs, &[0; 32], y);
    }
}

impl Dequantize for BlockQ5K {
    fn dequantize(&self, y: &mut [f32]) {
        k4_dequantize(self.d, self.dmin, &self.scales, &self.qs, &self.qh, y);
    }
}

impl Dequantize for BlockQ6K {
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        // Half n (128 values): ql[64n..][..64], qh[32n..][..32], scales[8n..][..8]. Within a half,
        // value 32k + l takes its low nibble from ql[32 * (k % 2) + l] (k < 2: low nibble, else
        // high), its top 2 bits from qh[l] >> 2k, and scale 2k + l / 16. ggml's d * sc * q is
        // (d * sc) * q, so the product per 16 values is hoisted without changing any bit.
        for (n, y) in y.chunks_exact_mut(128).enumerate() {
            let (qh, sc) = (&self.qh[32 * n..32 * n + 32], &self.scales[8 * n..8 * n + 8]);
            for (k, y) in y.chunks_exact_mut(32).enumerate() {
                let ql = &self.ql[64 * n + 32 * (k % 2)..64 * n + 32 * (k % 2) + 32];
                for (s, y) in y.chunks_exact_mut(16).enumerate() {
                    let dl = d * f32::from(sc[2 * k + s]);
                    let (ql, qh) = (&ql[16 * s..16 * s + 16], &qh[16 * s..16 * s + 16]);
                    for ((y, &lo), &hi) in y.iter_mut().zip(ql).zip(qh) {
                        let low = (lo >> (4 * (k / 2))) & 0xF;
                        let high = (hi >> (2 * k)) & 3;
                        *y = dl * f32::from((low | (high << 4)) as i8 - 32);
                    }
                }
            }
        }
    }
}

impl Dequantize for BlockIQ4NL {
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        nibbles(&self.qs, y, |q| d * f32::from(IQ4_NL_VALUES[usize::from(q)]));
    }
}

impl Dequantize for BlockIQ4XS {
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib, (qs, y)) in self.qs.chunks_exact(16).zip(y.chunks_exact_mut(32)).enumerate() {
            let dl = d * scale_iq4xs(self, ib) as f32;
            nibbles(qs, y, |q| dl * f32::from(IQ4_NL_VALUES[usize::from(q)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_source_length_is_an_error_not_a_panic() {
        let mut dst = [0f32; 256];
        let err = dequantize_row(GgmlType::Q4K, &[0u8; 143], &mut dst).unwrap_err();
        assert_eq!(err, QuantError::ByteLen { ty: GgmlType::Q4K, n: 256, expected: 144, got: 143 });
        assert!(err.to_string().contains("144 bytes"), "{err}");
    }

    #[test]
    fn partial_block_is_an_error() {
        let mut dst = [0f32; 100];
        let err = dequantize_row(GgmlType::Q8_0, &[0u8; 34 * 4], &mut dst).unwrap_err();
        assert!(matches!(err, QuantError::PartialBlock { n: 100, block: 32, .. }), "{err}");
    }

    #[test]
    fn unsupported_types_are_named() {
        let mut dst = [0f32; 256];
        let err = dequantize_row(GgmlType::IQ2XXS, &[0u8; 66], &mut dst).unwrap_err();
        assert_eq!(err, QuantError::Unsupported(GgmlType::IQ2XXS));
        assert!(err.to_string().contains("iq2_xxs"), "{err}");
    }

    #[test]
    fn every_type_is_either_dequantized_or_rejected() {
        for ty in GgmlType::ALL {
            let n = ty.block_size() * 2;
            let src = vec![0u8; ty.row_bytes(n).unwrap()];
            let mut dst = vec![1f32; n];
            let r = dequantize_row(ty, &src, &mut dst);
            assert_eq!(r.is_ok(), can_dequantize(ty), "{ty}: {r:?}");
            if r.is_ok() {
                assert!(dst.iter().all(|&v| v == 0.0), "{ty}: zero bytes must give zeros");
            }
        }
    }

    #[test]
    fn random_bytes_of_any_length_never_panic() {
        // Arbitrary bytes (NaN/inf scales included) and lengths: a value or an error, no panic.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for ty in GgmlType::ALL {
            for _ in 0..20 {
                let n = (next() % 600) as usize;
                let len = (next() % 700) as usize;
                let src: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let mut dst = vec![0f32; n];
                let r = dequantize_row(ty, &src, &mut dst);
                let fits = ty.row_bytes(n) == Some(len) && can_dequantize(ty);
                assert_eq!(r.is_ok(), fits, "{ty} n={n} len={len}: {r:?}");
            }
            // And whole rows of random blocks, which always decode.
            if can_dequantize(ty) {
                let n = ty.block_size() * 3;
                let src: Vec<u8> = (0..ty.row_bytes(n).unwrap()).map(|_| next() as u8).collect();
                dequantize_row(ty, &src, &mut vec![0f32; n]).unwrap();
            }
        }
    }

    #[test]
    fn f16_and_bf16_decode_the_same_from_unaligned_bytes() {
        // 600 values: more than one 256-value chunk of the unaligned path, plus a tail.
        let n = 600;
        let mut buf = vec![0u8; 2 * n + 1];
        for (i, b) in buf[1..].chunks_exact_mut(2).enumerate() {
            b.copy_from_slice(&((i as u16).wrapping_mul(40503) & 0x7bff).to_le_bytes());
        }
        for ty in [GgmlType::F16, GgmlType::BF16] {
            let unaligned = &buf[1..];
            let aligned = unaligned.to_vec();
            let (mut a, mut u) = (vec![0f32; n], vec![0f32; n]);
            dequantize_row(ty, &aligned, &mut a).unwrap();
            dequantize_row(ty, unaligned, &mut u).unwrap();
            for (i, b) in aligned.chunks_exact(2).enumerate() {
                let want = match ty {
                    GgmlType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
                    _ => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                };
                assert_eq!(a[i].to_bits(), want.to_bits(), "{ty} aligned value {i}");
                assert_eq!(u[i].to_bits(), want.to_bits(), "{ty} unaligned value {i}");
            }
        }
    }

    #[test]
    fn q8_0_is_scale_times_value() {
        let mut src = vec![0u8; 34];
        src[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for i in 0..32 {
            src[2 + i] = (i as i8 - 16) as u8;
        }
        let mut dst = [0f32; 32];
        dequantize_row(GgmlType::Q8_0, &src, &mut dst).unwrap();
        for (i, v) in dst.iter().enumerate() {
            assert_eq!(*v, (i as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn q4_0_nibble_order_is_low_half_then_high_half() {
        let mut src = vec![0u8; 18];
        src[0..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        src[2] = 0x9A; // value 0 = 0xA - 8 = 2, value 16 = 0x9 - 8 = 1
        let mut dst = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &src, &mut dst).unwrap();
        assert_eq!((dst[0], dst[16], dst[1]), (2.0, 1.0, -8.0));
    }
}
