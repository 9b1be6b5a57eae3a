//! Shape arithmetic shared by the operators: broadcasting, strides, axes, row ranges.

use crate::{OpError, Result};

/// `out`, rows `rows` of `row_len` elements each, cut where each block of `block` rows ends:
/// per block the range touches, its index, the rows of it in the range (counted from the
/// block's first row) and their elements. MatMul's batches, depthwise Conv's planes.
pub fn rows_by_block<T>(
    out: &mut [T],
    rows: std::ops::Range<usize>,
    block: usize,
    row_len: usize,
) -> Vec<(usize, std::ops::Range<usize>, &mut [T])> {
    let mut pieces = Vec::new();
    let mut rest = out;
    let mut r = rows.start;
    while r < rows.end {
        let bi = r / block;
        let end = ((bi + 1) * block).min(rows.end);
        let (head, tail) = std::mem::take(&mut rest).split_at_mut((end - r) * row_len);
        pieces.push((bi, r - bi * block..end - bi * block, head));
        rest = tail;
        r = end;
    }
    pieces
}

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Whether every entry of `axes` is an axis below `rank` and none repeats (with
/// `axes.len() == rank`, a permutation of `0..rank`).
pub fn distinct_axes(axes: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    axes.iter()
        .all(|&d| d < rank && !std::mem::replace(&mut seen[d], true))
}

/// Row-major strides, in elements.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Numpy-style multidirectional broadcast of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(OpError::Invalid(format!(
                    "shapes {:?} cannot be broadcast together",
                    shapes
                )));
            }
        }
    }
    Ok(out)
}

/// Strides to read an input of shape `shape` broadcast to `out` (0 on broadcast dimensions),
/// with `out.len()` entries.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let off = out.len() - shape.len();
    let st = strides(shape);
    let mut r = vec![0; out.len()];
    for i in 0..shape.len() {
        r[off + i] = if shape[i] == 1 && out[off + i] != 1 {
            0
        } else {
            st[i]
        };
    }
    r
}

/// An ONNX axis (negative counts from the end) as an index in `0..rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(OpError::Invalid(format!(
            "axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(a as usize)
}

/// The number of rows of an output of `shape` split on `axis`: the product of the dimensions up
/// to and including `axis` (1 when the op cannot be split). A row range is one contiguous block
/// of the output: rows `r` cover elements `r.start * row_len .. r.end * row_len`.
pub fn row_count(shape: &[usize], axis: Option<usize>) -> usize {
    match axis {
        Some(a) => shape[..=a].iter().product(),
        None => 1,
    }
}

/// Elements per row of an output of `shape` split on `axis` (see [`row_count`]).
pub fn row_len(shape: &[usize], axis: Option<usize>) -> usize {
    match axis {
        Some(a) => shape[a + 1..].iter().product(),
        None => shape.iter().product(),
    }
}

/// Workgroup counts for `threads` invocations of a `wg`-wide 1-D kernel, spread over x and y so
/// no dimension exceeds 65535 (the shader recovers `i = gid.x + gid.y * nwg.x * WG`).
pub fn grid_1d(threads: u64, wg: u32) -> [u32; 3] {
    let groups = threads.div_ceil(wg as u64).max(1);
    if groups <= 65535 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(65535);
        [65535, y as u32, 1]
    }
}

/// The shape an operand of `op` stored as `stored` has when read through `perm` (a folded
/// Transpose), and the element stride in storage of each of its dimensions.
pub fn permuted(
    stored: &[usize],
    perm: Option<&[usize]>,
    op: &str,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let st = strides(stored);
    let Some(perm) = perm else {
        return Ok((stored.to_vec(), st));
    };
    if perm.len() != stored.len() || !distinct_axes(perm, stored.len()) {
        return Err(OpError::Invalid(format!(
            "{op} operand of shape {stored:?} read through permutation {perm:?}: not a \
             permutation of its axes"
        )));
    }
    Ok((
        perm.iter().map(|&d| stored[d]).collect(),
        perm.iter().map(|&d| st[d]).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes(&[&[2, 1, 4], &[3, 1]]).unwrap(),
            vec![2, 3, 4]
        );
        assert_eq!(broadcast_shapes(&[&[], &[5]]).unwrap(), vec![5]);
        assert!(broadcast_shapes(&[&[2, 3], &[4, 3]]).is_err());
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
    }

    #[test]
    fn axes_and_rows() {
        assert_eq!(normalize_axis(-1, 3).unwrap(), 2);
        assert!(normalize_axis(3, 3).is_err());
        assert!(normalize_axis(-4, 3).is_err());
        assert_eq!(row_count(&[2, 3, 4], Some(1)), 6);
        assert_eq!(row_len(&[2, 3, 4], Some(1)), 4);
        assert_eq!(grid_1d(64 * 70000, 64), [65535, 2, 1]);
        assert_eq!(grid_1d(0, 64), [1, 1, 1]);
    }
}
