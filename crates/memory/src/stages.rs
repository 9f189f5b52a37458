//! How a layer's weights are cut into the stages that layer streaming reads ahead and drops.
//!
//! A layer's matrices fall into four groups, in the order the forward pass multiplies by them:
//! q/k/v, the attention output, gate/up, down. A streamed layer's group is computed in blocks of
//! rows, each block one stage, so that at most one block of the matrices in use has to be held
//! whole: the readers' window is one stage plus the read-ahead past it, not a whole layer
//! (7B shape: gate/up is 76 MB, five blocks of 15 MB). Every layer is cut the same way, into as
//! many blocks per group as the model's biggest such group needs.

/// Matrix groups per layer: q/k/v, attention output, gate/up, down.
pub const GROUPS: usize = 4;

/// Most bytes of one stage (a block of rows of one group's matrices).
pub const STAGE_BYTES: u64 = 16 << 20;

/// Blocks a group is cut into, given the bytes of the biggest such group in the model.
pub fn blocks(max_group_bytes: u64) -> usize {
    max_group_bytes.div_ceil(STAGE_BYTES).max(1) as usize
}

/// Rows `[r0, r1)` of block `b` of `nb` for a matrix of `rows` rows (every matrix of a group is
/// cut at the same fractions of its rows).
pub fn block_rows(rows: usize, nb: usize, b: usize) -> (usize, usize) {
    (rows * b / nb, rows * (b + 1) / nb)
}

/// Bytes of the biggest stage when the biggest group of each kind has `max_group_bytes` (a block
/// holds at most one row per matrix more than its share).
pub fn biggest_stage(max_group_bytes: [u64; GROUPS], max_row_bytes: u64) -> u64 {
    max_group_bytes
        .iter()
        .map(|&g| g.div_ceil(blocks(g) as u64) + 3 * max_row_bytes)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_every_row_once_and_stay_under_the_stage_size() {
        // 7B shape: gate+up 2 × 38.2 MB, down 55.7 MB, q/k/v 9.8 MB, output 7.2 MB.
        let groups = [9_762_816, 7_225_344, 76_382_208, 55_695_360];
        let biggest = biggest_stage(groups, 15_232);
        assert_eq!(groups.map(blocks), [1, 1, 5, 4]);
        assert!(biggest <= STAGE_BYTES && biggest > 76_382_208 / 5, "{biggest}");
        for rows in [1, 7, 512, 18944] {
            for nb in 1..9 {
                let mut next = 0;
                for b in 0..nb {
                    let (r0, r1) = block_rows(rows, nb, b);
                    assert_eq!(r0, next);
                    assert!(r1 - r0 <= rows.div_ceil(nb));
                    next = r1;
                }
                assert_eq!(next, rows);
            }
        }
    }
}
