//! GEMM against a B packed once: `C = A @ B` where B is a model constant (a MatMul's weight),
//! packed into panels of 32, 48 or 64 columns the first time it is used and kept.
//!
//! The `gemm` crate packs both operands on every call. For the products of transformer layers
//! (128 x 384 @ 384 x 1536 in minilm) packing B costs as much as a third of the product, and
//! onnxruntime packs such weights once at load. Here each panel holds `K x nr` floats, K-major,
//! so the micro-kernel reads two, three or four 16-float vectors per k and broadcasts 12, 8
//! or 6 rows of A read in place (any strides): 24 accumulators each. The width is the one
//! that leaves the fewest columns of the last panel empty ([`panel_width`]): 48 for most, 64
//! for n = 64, 128, 256 (tiny Llama's and magika's products, a third of whose multiply-adds
//! went to zero columns at 48), 32 for n = 160, 224, 352 (inception_v2's convs, 7-17 % of
//! whose multiply-adds went to zero columns). Without AVX-512, B is packed in panels of 16
//! columns, which AVX2 and FMA run in blocks of 6 rows (`cpu_gemm_packed_avx2.rs`); without
//! AVX2 ([`available`] false) callers keep the `gemm` crate.
//!
//! A band's rows of A are read once per panel and a panel once per block of rows: when both
//! outgrow L2 (a 512 -> 512 3x3 conv on 7x7: 49 pixels x 4608 of im2col and a 1.2 MB panel),
//! every block streams the panel from L3. `panel_band` then runs K in chunks of at most
//! [`CHUNK_BYTES`] of both, keeping each block's partial sums between chunks (2 threads, Intel
//! Xeon: that conv 4.05 -> 2.65 ms; 32 x 4096 @ 4096 x 1024 101 -> 141 GFLOP/s). A read along
//! its rows streams and is not counted (counted, 1024^3 lost a third to chunks of 61).
//! docs/bench.md, "K in chunks".
//!
//! In a model the weights are cold: resnet50's 100 MB do not stay in cache from one run to
//! the next, and a panel's first block waited on memory, its next blocks computed from L2,
//! one after the other (512 -> 2048 1x1 on 7x7, 2 threads: 0.31 ms with its 4 MB of weights
//! in cache, 0.73 from memory, onnxruntime 0.52 in its model). On AVX-512 each micro-kernel
//! call therefore fetches into L2, one line per k step, its share of what the task reads
//! next: the panel's next chunk of K, or after the last the next panel (`PackedB::ahead`),
//! so memory streams while the kernel computes. In the models, fresh processes alternated
//! (2 threads, Intel Xeon), it took resnet50's layer-4 1x1 convs 0.77-0.79x of their time and
//! its 512 -> 512 3x3 convs 0.85-0.88x (the sum of its nodes 0.87-0.995x in 8 rounds),
//! inception_v2 0.91x, squeezenet 0.89x, yolov8n 0.97x; the rest within noise
//! (docs/bench.md, "Weights fetched ahead"). A read down its columns (a 1x1 conv's input
//! planes in place: each k step one line, a plane after the last) is fetched too, into L1,
//! `A_AHEAD_STEPS` k steps ahead: resnet50's 1x1 convs on 14x14 and 28x28 took 0.66-0.86x
//! of their time in the model, densenet121's on 14x14 0.75x (docs/bench.md, "1x1 convs fetch
//! their input ahead"). `TANDEM_PREFETCH=0` turns both off; the AVX2 kernel does not fetch
//! ahead (not measured on an AVX2 machine).
//!
//! Sits between `matmul.rs` (which keeps a [`KeptPacking`] per constant-weight MatMul, set by
//! the runtime's load-time `layout` pass) and the CPU's vector units.

use crate::cpu_gemm::{MatRef, Threads};
use crate::kept::Kept;
use crate::simd::Level;
use std::mem::MaybeUninit;
use std::ops::Range;

/// Accumulators of a micro-kernel call (of the 32 vector registers): rows of A times vectors
/// of a panel, 12 x 2 for 32 columns, 8 x 3 for 48, 6 x 4 for 64.
const ACCUMULATORS: usize = 24;

/// Rows of A per block on AVX2 (`cpu_gemm_packed_avx2.rs`): 6 x 2 vectors of 8 accumulators.
const AVX2_ROWS: usize = 6;

/// Bytes of A's rows and a panel's K-chunk that `panel_band` keeps in L2 (a quarter of the
/// 1 MiB of the cores measured); it splits K only where they outgrow twice this.
pub const CHUNK_BYTES: usize = 1 << 18;

/// Products of fewer rows than this keep `sgemm` (its single-row kernels read B in place).
pub const MIN_ROWS: usize = 8;

/// The panel width for `n` columns: the one of 48, 64 and 32 whose last panel has the fewest
/// empty columns, the first of them on a tie (32's 12 broadcasts per k are the most).
pub fn panel_width(n: usize) -> usize {
    let empty = |w: usize| n.div_ceil(w) * w - n;
    [48, 64, 32]
        .into_iter()
        .min_by_key(|&w| empty(w))
        .expect("three widths")
}

/// B (`k x n`) packed into `n.div_ceil(nr)` panels of `k x nr` floats, columns past `n` zero.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedB {
    pub k: usize,
    pub n: usize,
    /// Columns per panel ([`panel_width`]).
    nr: usize,
    /// The panels, one after another, in whole cache lines: each of the kernel's 16-float loads
    /// reads one line. From an unaligned `Vec<f32>` (16-byte aligned, as the allocator gives
    /// large blocks) every load spans two lines, which an Intel core pays for: 106 -> 129
    /// GFLOP/s on one Cascade Lake thread (169 x 576 @ 576 x 256), 108 -> 127 at 3025 x 144
    /// @ 144 x 64 (docs/bench.md, "Packed panels on cache lines, convs in tiles").
    lines: Vec<Line>,
}

/// 16 floats on one 64-byte cache line.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([f32; 16]);

impl PackedB {
    /// Pack `b` (`k x n`, any strides), panels in parallel on the current pool: the packed
    /// copy is fresh memory, whose first touch (the kernel zeroing each page) took most of
    /// resnet50's first run when one thread packed its conv weights (0.37 s here, against
    /// 0.05 s unpacked; 0.07-0.15 s on two threads).
    pub fn pack(b: MatRef, k: usize, n: usize) -> PackedB {
        assert!(b.fits(k, n), "PackedB: B view {k}x{n} out of bounds");
        let nr = if wide() { panel_width(n) } else { 16 };
        let panels = n.div_ceil(nr);
        // `nr` is a multiple of 16: whole lines.
        let mut lines = vec![Line([0.0; 16]); panels * k * nr / 16];
        let data: &mut [f32] = bytemuck::cast_slice_mut(&mut lines);
        crate::parallel::for_each_chunk_mut(data, k * nr, |p, panel| {
            let cols = (n - p * nr).min(nr);
            for (kk, row) in panel.chunks_mut(nr).enumerate() {
                let at = b.offset + kk * b.rs + p * nr * b.cs;
                for (j, v) in row[..cols].iter_mut().enumerate() {
                    *v = b.data[at + j * b.cs];
                }
            }
        });
        PackedB { k, n, nr, lines }
    }

    /// Columns per panel: 32, 48 or 64 ([`panel_width`]).
    pub fn panel_width(&self) -> usize {
        self.nr
    }

    /// Rows of A per micro-kernel block: 12, 8 or 6 for panels of 32, 48 or 64 columns on
    /// AVX-512, 6 on AVX2.
    pub fn block_rows(&self) -> usize {
        match runs_wide(self.nr) {
            true => ACCUMULATORS / (self.nr / 16),
            false => AVX2_ROWS,
        }
    }

    /// Panels: `n / nr` rounded up.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(self.nr)
    }

    fn panel(&self, p: usize) -> &[f32] {
        let data: &[f32] = bytemuck::cast_slice(&self.lines);
        &data[p * self.k * self.nr..][..self.k * self.nr]
    }

    /// What block `blk` of a run over rows `ks` (k steps) of panel `p` fetches ahead: the
    /// `blk`-th stretch, one line per k step, of what the task reads next: the panel's next
    /// chunk of as many rows, or after its last the first of panel `p + 1`; nothing past
    /// that or where prefetching is off (module docs).
    fn ahead(&self, p: usize, ks: Range<usize>, blk: usize) -> Ahead {
        let (q, start) = match ks.end < self.k {
            true => (p, ks.end),
            false => (p + 1, 0),
        };
        if q >= self.panels() || !prefetch_on() {
            return NOTHING_AHEAD;
        }
        let end = (start + ks.len()).min(self.k);
        let next = &self.panel(q)[start * self.nr..end * self.nr];
        let first = blk * ks.len() * 16;
        let lines = (next.len().saturating_sub(first) / 16).min(ks.len());
        (next.as_ptr().wrapping_add(first), lines)
    }
}

/// A packed B kept across calls (shared by clones of the op that holds it): packed by the
/// first call, reused by every later one. Only for a B that cannot change between runs.
#[derive(Clone, Default, Debug)]
pub struct KeptPacking(Kept<PackedB>);

impl KeptPacking {
    /// The packing of `b` (`k x n`): made on the first call (racing first calls each pack,
    /// one result is kept), then the kept one.
    pub fn get(&self, b: MatRef, k: usize, n: usize) -> &PackedB {
        let p = self.0.get_or_make(|| PackedB::pack(b, k, n));
        assert!(
            p.k == k && p.n == n,
            "KeptPacking: B was packed as {}x{}, now read as {k}x{n}",
            p.k,
            p.n
        );
        p
    }
}

/// Whether this CPU runs a packed kernel: AVX-512 or AVX2 + FMA, as [`crate::simd::level`]
/// reports it (`TANDEM_SIMD=avx2` runs the AVX2 kernel on an AVX-512 CPU).
pub fn available() -> bool {
    crate::simd::level() >= Level::Avx2
}

/// Whether panels are packed for the AVX-512 kernel (32, 48 or 64 columns; else 16).
fn wide() -> bool {
    crate::simd::level() == Level::Avx512
}

/// Whether a panel of `nr` columns runs the AVX-512 kernel: at that level, and wider than 16
/// (a 16-column panel was packed at the AVX2 level; only the AVX2 kernel runs it).
fn runs_wide(nr: usize) -> bool {
    wide() && nr > 16
}

/// `C[m x n] = A[m x k] @ B` (B packed), C row-major with row stride `ldc` in `c`.
///
/// Panics without AVX2 or AVX-512 ([`available`]) or a view does not lie inside its slice.
pub fn sgemm_packed(m: usize, a: MatRef, b: &PackedB, c: &mut [f32], ldc: usize, threads: Threads) {
    let c = (CPtr(c.as_mut_ptr()), c.len());
    // SAFETY: `c` is a live exclusive slice of that length, and `after` touches nothing.
    unsafe { run::<false>(m, a, b, c, ldc, threads, &|_, _| {}) };
}

/// [`sgemm_packed`] storing C transposed: element `(i, j)` of the product goes to
/// `c[j * ldc + i]`. A Conv's `C^T = col^T @ W^T` (pixels x output channels, W packed once)
/// lands in its NCHW output this way: `ldc` is the output plane. Each task then calls
/// `after(columns, rows)` for the block it stored, on its thread while the block is in its
/// cache (a conv's bias and epilogue).
///
/// # Safety
/// `c` is valid for `len` floats, touched by no one else during the call but `after`, which
/// may touch only the block it is given.
///
/// Panics without AVX2 or AVX-512 ([`available`]), A's view does not lie inside its slice or C's
/// does not lie inside the `len` floats.
pub unsafe fn sgemm_packed_t(
    (m, a): (usize, MatRef),
    b: &PackedB,
    (c, len, ldc): (*mut f32, usize, usize),
    threads: Threads,
    after: &(dyn Fn(Range<usize>, Range<usize>) + Sync),
) {
    // SAFETY: the caller's contract.
    unsafe { run::<true>(m, a, b, (CPtr(c), len), ldc, threads, after) };
}

/// [`sgemm_packed_t`] on the calling thread, for the columns of `panels` only (a conv task's
/// output channels: `panel * nr ..`, below `n`), into C at `c` (element `(i, j)` at
/// `c + j * ldc + i`, `j` counted from column 0).
///
/// # Safety
/// For every column `j` of those panels below `n`, the `m` floats from `c + j * ldc` are valid
/// and written by no one else during the call.
///
/// Panics without AVX2 or AVX-512 ([`available`]) or A's view does not lie inside its slice.
pub unsafe fn sgemm_packed_t_panels(
    m: usize,
    a: MatRef,
    b: &PackedB,
    panels: Range<usize>,
    c: *mut f32,
    ldc: usize,
) {
    assert!(available(), "sgemm_packed without AVX2 or AVX-512");
    assert!(
        a.fits(m, b.k),
        "sgemm_packed: A view {m}x{} out of bounds",
        b.k
    );
    for p in panels.start..panels.end.min(b.panels()) {
        // SAFETY: AVX2 or AVX-512 checked; A checked; C's columns forwarded from the caller.
        unsafe { panel_band::<true>(a, b, p, 0..m, CPtr(c), ldc) };
    }
}

/// [`sgemm_packed`] (`T` false) and [`sgemm_packed_t`] (`T` true): views checked, then the
/// tasks, each calling `after` with its block's columns and rows.
///
/// # Safety
/// As [`sgemm_packed_t`], `c` the pointer and its length.
unsafe fn run<const T: bool>(
    m: usize,
    a: MatRef,
    b: &PackedB,
    (cptr, c_len): (CPtr, usize),
    ldc: usize,
    threads: Threads,
    after: &(dyn Fn(Range<usize>, Range<usize>) + Sync),
) {
    if m == 0 || b.n == 0 {
        return;
    }
    // C as stored: `lines` lines of `len` elements at stride `ldc`.
    let (lines, len) = if T { (b.n, m) } else { (m, b.n) };
    assert!(
        ldc >= len && (lines - 1) * ldc + len <= c_len,
        "sgemm_packed: C {m}x{} ({}, stride {ldc}) out of bounds of {c_len}",
        b.n,
        if T { "transposed" } else { "row-major" },
    );
    let (k, n) = (b.k, b.n);
    assert!(available(), "sgemm_packed without AVX2 or AVX-512");
    assert!(a.fits(m, k), "sgemm_packed: A view {m}x{k} out of bounds");
    // Tasks: a panel of columns x a band of rows; bands only where panels are too few to keep
    // every thread busy for several tasks.
    let (nr, mr) = (b.nr, b.block_rows());
    let panels = n.div_ceil(nr);
    let workers = match threads {
        Threads::Pool => rayon::current_num_threads().max(1),
        Threads::Single => 1,
    };
    let band = band_blocks(m.div_ceil(mr), panels, workers) * mr;
    let bands = m.div_ceil(band);
    // A thread runs a range of consecutive tasks (rayon splits the range), so they share what
    // the order repeats: in panel-major order a panel of B, which then stays in its L2 (when
    // the rows are fewer than the columns: B is the larger operand; a deep conv's 49 pixels
    // against 224 channels 342 -> 293 us), else a band of A.
    let panel_major = m < n;
    let task = |t: usize| {
        let (p, r0) = match panel_major {
            true => (t / bands, (t % bands) * band),
            false => (t % panels, (t / panels) * band),
        };
        // SAFETY: AVX2 or AVX-512 checked above; A and the panel are in bounds (checked views); C's
        // block (rows r0.., columns p*nr.., or transposed) is in bounds (checked) and written
        // by this task only (tasks are distinct (panel, band) pairs).
        let rows = r0..(r0 + band).min(m);
        unsafe { panel_band::<T>(a, b, p, rows.clone(), cptr, ldc) };
        after(p * nr..(p * nr + nr).min(n), rows);
    };
    let tasks = panels * bands;
    if workers > 1 && tasks > 1 {
        crate::parallel::for_each_index(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Blocks of rows per band of a product of `blocks` blocks of rows and `panels` panels on
/// `workers` threads: bands enough for four tasks (a panel x a band) a worker, or the fewest
/// more (up to one a block) that make the tasks a multiple of the workers, so that none runs a
/// task more than the others (where no count of bands does, the first). Squeezenet's last
/// conv (169 pixels x 21 panels of 48 channels, 2 threads) ran as 21 tasks, 11 on one thread
/// and 10 on the other; as 42, 0.869 -> 0.800 ms in the model (AMD Zen 4, the two alternated
/// process by process, medians of 10 rounds), the other models' products within noise
/// (resnet50, densenet121, inception_v2, magika, minilm, prefill).
fn band_blocks(blocks: usize, panels: usize, workers: usize) -> usize {
    let first = (4 * workers).div_ceil(panels).clamp(1, blocks);
    (first..=blocks)
        .map(|wanted| blocks.div_ceil(wanted))
        .find(|&per| (panels * blocks.div_ceil(per)).is_multiple_of(workers))
        .unwrap_or(blocks.div_ceil(first))
}

/// Rows `rows` of A times panel `p` into C (`T`: transposed) at `c`, in blocks of at most the
/// panel's rows per micro-kernel call; where those rows of A and the panel outgrow L2, over K
/// in chunks, each block's sums kept row-major in `partial` for the next chunk to start from.
///
/// # Safety
/// AVX2 or AVX-512 present; `a` covers rows `rows` x `b.k`; C's block of those rows and the panel's
/// columns below `b.n` is valid (transposed: `rows.len()` floats from `c + j * ldc +
/// rows.start` for each such column `j`) and written by no one else during the call.
unsafe fn panel_band<const T: bool>(
    a: MatRef,
    b: &PackedB,
    p: usize,
    rows: Range<usize>,
    c: CPtr,
    ldc: usize,
) {
    let (nr, mr) = (b.nr, b.block_rows());
    let cols = (b.n - p * nr).min(nr);
    let panel = b.panel(p);
    let (r0, end) = (rows.start, rows.end);
    let len = end - r0;
    // The rows in blocks of equal size (to a row): a tail block of one or two rows runs its
    // few accumulators' dependency chains at a fraction of the FMA rate (49 pixels as
    // 4 x 12 + 1 rows: 102 GF/s on one thread; as 4 x 10 + 9: 116).
    let blocks = len.div_ceil(mr).max(1);
    // K in chunks where the panel, and A's rows where read down their columns (a conv's
    // im2col block: each k step a new cache line, which the next blocks read again), outgrow
    // half an L2 (module docs). A read along its rows streams through once.
    let a_down = if a.cs == 1 { 0 } else { len };
    let set = (a_down + nr) * b.k * size_of::<f32>();
    let chunks = match blocks > 1 && set > 2 * CHUNK_BYTES {
        true => set.div_ceil(CHUNK_BYTES),
        false => 1,
    };
    let kc = b.k.div_ceil(chunks).max(1);
    // Room for the partial sums, never read before a chunk writes them (so not zeroed).
    let mut partial = Vec::<MaybeUninit<f32>>::with_capacity(if chunks > 1 { len * nr } else { 0 });
    let mut k0 = 0;
    loop {
        let k1 = (k0 + kc).min(b.k);
        let chunk = &panel[k0 * nr..k1 * nr];
        let ahead = |blk: usize| b.ahead(p, k0..k1, blk);
        let mut i = r0;
        for blk in 0..blocks {
            let n_rows = len / blocks + usize::from(blk < len % blocks);
            let ai = MatRef {
                offset: a.offset + i * a.rs + k0 * a.cs,
                ..a
            };
            // The block's partial sums (read only after the first chunk wrote them).
            let sums = partial
                .as_mut_ptr()
                .cast::<f32>()
                .wrapping_add((i - r0) * nr);
            let init = (k0 > 0).then_some(sums.cast_const());
            let at = match T {
                false => i * ldc + p * nr,
                true => p * nr * ldc + i,
            };
            // SAFETY: forwarded from the caller: A's rows i..i+n_rows and the panel are in
            // bounds; C's block is the caller's and, transposed, up to `end - i` rows from
            // `i`. `partial` has room for `len x nr` floats whenever a chunk ends before K.
            unsafe {
                match k1 == b.k {
                    true => block::<T>(
                        n_rows,
                        Lhs::plain(ai),
                        (chunk, nr),
                        c.at(at),
                        ldc,
                        (cols, end - i),
                        init,
                        ahead(blk),
                    ),
                    false => block::<false>(
                        n_rows,
                        Lhs::plain(ai),
                        (chunk, nr),
                        sums,
                        nr,
                        (nr, n_rows),
                        init,
                        ahead(blk),
                    ),
                }
            }
            i += n_rows;
        }
        if k1 == b.k {
            return;
        }
        k0 = k1;
    }
}

/// Lines for a micro-kernel call to fetch into L2, one per k step: from where, and how many
/// (a prefetch reads nothing and cannot fault; [`PackedB::ahead`] keeps them inside B).
type Ahead = (*const f32, usize);

/// No lines to fetch.
const NOTHING_AHEAD: Ahead = (std::ptr::null(), 0);

/// Whether `TANDEM_PREFETCH=0` turned fetching ahead off (read once).
fn prefetch_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_PREFETCH").as_deref() != Ok("0"))
}

/// A as the micro-kernel reads it: k step `kk` reads the column `steps[kk]` floats from
/// `view`'s first, or where `steps` is empty (a plain matrix) column `kk` of `view`. A conv
/// read in place (`conv_implicit.rs`) has one step per (input channel, kernel position),
/// from [`TapSteps`]. `down` is how far past each k step's read the kernel fetches A:
/// [`A_AHEAD_STEPS`] k steps for a plain A read down its columns, else 0 (the line the step
/// reads).
#[derive(Clone, Copy)]
struct Lhs<'a> {
    view: MatRef<'a>,
    steps: &'a [usize],
    down: usize,
}

/// K steps ahead of its reads at which the AVX-512 kernel fetches a plain A read down its
/// columns (a 1x1 conv's input planes in place: each k step reads a line one plane after
/// the last, a stride no prefetcher follows from memory) into L1. From memory (256 MB
/// written between calls, 2 threads, Intel Xeon, the product alone, fetch on / off
/// alternated in one process) resnet50's 1024 -> 256 1x1 on 14x14 took 0.80x the time, its
/// 512 -> 128 on 28x28 0.78x, 2048 -> 512 on 7x7 0.92x, squeezenet's 512 -> 1000 on 13x13
/// 0.95x; 8 steps ahead 0.83, 0.79, 0.98, 0.94; 32 steps 0.72, 0.78, 0.98, 0.91 but 128 ->
/// 512 on 28x28 1.08. An implicit conv's padded planes (just copied, in cache) gained
/// nothing (0.99-1.03x on 3x3 convs of 16 to 256 channels), so reads with taps fetch
/// nothing. With 32-column panels (12 rows a block) inception_v2's 576 -> 224 on 14x14
/// took 0.76x, 576 -> 160 0.83x (docs/bench.md, "1x1 convs fetch their input ahead").
const A_AHEAD_STEPS: usize = 16;

/// Where each k step of an A read with taps starts: column `k` of the im2col of a conv read
/// in place is its column `k / taps` (an input plane, `cs` floats after the last) shifted by
/// `taps[k % taps]`, `offsets[k]` floats from the first plane. One table for every block: a
/// kernel that counted taps and planes itself (a tap index wrapping to the next plane each
/// step) kept two of the 6-row kernel's accumulators on the stack: from the table magika's
/// 256 -> 512 5x1 conv takes 0.88-0.89x the time (docs/bench.md, "Taps read from a table").
pub struct TapSteps {
    offsets: Vec<usize>,
    taps: usize,
    cs: usize,
    reach: usize,
}

impl TapSteps {
    /// The steps of `columns` columns `cs` floats apart, each shifted by every one of `taps`.
    pub fn new(taps: &[usize], columns: usize, cs: usize) -> TapSteps {
        let offsets = (0..columns)
            .flat_map(|c| taps.iter().map(move |&t| c * cs + t))
            .collect();
        let reach = taps.iter().copied().max().unwrap_or(0);
        TapSteps {
            offsets,
            taps: taps.len(),
            cs,
            reach,
        }
    }

    /// Taps per column.
    pub fn taps(&self) -> usize {
        self.taps
    }
}

impl<'a> Lhs<'a> {
    /// A plain matrix: no steps; fetched ahead where read down its columns and prefetching
    /// is on.
    fn plain(view: MatRef<'a>) -> Lhs<'a> {
        let down = match view.cs > 1 && prefetch_on() {
            true => A_AHEAD_STEPS * view.cs,
            false => 0,
        };
        Lhs {
            view,
            steps: &[],
            down,
        }
    }
}

/// Where [`taps_block`] puts its block: stored transposed at `c` (element `(i, j)` at
/// `c + j * ldc + i`, `j` counted from the panel's first column; `room` rows from the first
/// may be written, at least the block's: an 8-row store runs into the next block's), or as
/// partial sums (`rows x` the panel width, row-major) for the next chunk of K.
#[derive(Clone, Copy)]
pub enum BlockOut {
    Transposed {
        c: *mut f32,
        ldc: usize,
        room: usize,
    },
    Partial(*mut f32),
}

/// One block of `rows` rows of `A @ B` for panel `p` of B over columns `chunk` of `a`, each
/// read at every one of `steps`'s taps ([`TapSteps`]: column `c * taps + t` of A is column `c`
/// of `a` shifted by tap `t`): a conv's im2col read in place from its padded input planes
/// (`conv_implicit.rs`), K in chunks of input channels. The sums start from `init`'s partial
/// sums where given, else zero. `blk` counts the blocks over this chunk of the panel: the
/// `blk`-th fetches the `blk`-th stretch of what the task reads next into L2
/// (`PackedB::ahead`).
///
/// Panics without AVX2 or AVX-512, `rows` exceeds [`PackedB::block_rows`], `steps` have no
/// taps, are not B's K or not `a`'s columns, `chunk` is empty or past K, or a read of A would
/// leave `a.data`.
///
/// # Safety
/// `init` (where given) and a partial `out` cover `rows x b.panel_width()` floats (they may
/// be the same); a transposed `out` covers, for every column `j` of panel `p` below `b.n`,
/// the `room` floats from `c + j * ldc`; what `out` covers is written by no one else during
/// the call.
pub unsafe fn taps_block(
    rows: usize,
    (a, steps): (MatRef, &TapSteps),
    (b, p, chunk, blk): (&PackedB, usize, Range<usize>, usize),
    init: Option<*const f32>,
    out: BlockOut,
) {
    assert!(available(), "sgemm_packed without AVX2 or AVX-512");
    let taps = steps.taps;
    assert!(
        steps.offsets.len() == b.k && steps.cs == a.cs,
        "taps_block: {} steps of columns {} apart for K {} of columns {} apart",
        steps.offsets.len(),
        steps.cs,
        b.k,
        a.cs
    );
    assert!(
        taps > 0 && !chunk.is_empty() && chunk.end * taps <= b.k,
        "taps_block: columns {chunk:?} of {taps} taps for K {}",
        b.k
    );
    assert!(
        (1..=b.block_rows()).contains(&rows),
        "taps_block: {rows} rows for blocks of at most {}",
        b.block_rows()
    );
    // The chunk's last column at its farthest tap, from its last row.
    let last = (chunk.end - 1) * a.cs + steps.reach + (rows - 1) * a.rs;
    assert!(
        a.offset + last < a.data.len(),
        "taps_block: A read out of bounds"
    );
    let nr = b.nr;
    let cols = (b.n - p * nr).min(nr);
    let ks = chunk.start * taps..chunk.end * taps;
    let lhs = Lhs {
        view: a,
        steps: &steps.offsets[ks.clone()],
        down: 0,
    };
    let panel = &b.panel(p)[ks.start * nr..ks.end * nr];
    let ahead = b.ahead(p, ks, blk);
    // SAFETY: AVX2 or AVX-512 and A's reads checked (every offset of the chunk's steps is at
    // most its last column's at the farthest tap); the rest forwarded from the caller.
    unsafe {
        match out {
            BlockOut::Transposed { c, ldc, room } => {
                assert!(room >= rows, "taps_block: room {room} for {rows} rows");
                block::<true>(rows, lhs, (panel, nr), c, ldc, (cols, room), init, ahead)
            }
            BlockOut::Partial(c) => {
                block::<false>(rows, lhs, (panel, nr), c, nr, (nr, rows), init, ahead)
            }
        }
    }
}

/// C's pointer, shared by tasks that write disjoint blocks.
#[derive(Clone, Copy)]
struct CPtr(*mut f32);
// SAFETY: only used to hand disjoint output blocks to rayon tasks (see `sgemm_packed`).
unsafe impl Send for CPtr {}
unsafe impl Sync for CPtr {}

impl CPtr {
    /// The pointer `off` elements in (a method, so closures capture the whole wrapper).
    fn at(self, off: usize) -> *mut f32 {
        self.0.wrapping_add(off)
    }
}

/// One block of `rows` rows ([`PackedB::block_rows`] at most: on AVX-512 12 for a 32-column
/// panel, 8 for a 48-column one, 6 for a 64-column one; 6 on AVX2) by `cols <= nr` columns;
/// transposed (`T`), `room` rows from the first may be written (a store of 8 rows runs into
/// the next block's, which overwrites them after).
///
/// The sums start from `init`'s (`rows` rows of `nr`, row-major) where given, else zero.
/// Meanwhile the AVX-512 kernel fetches the lines of `ahead` into L2.
///
/// # Safety
/// AVX2 or AVX-512 present; `a` covers `rows x panel.len() / nr`; `c` covers `rows` rows of `cols`
/// at stride `ldc` (transposed: `cols` columns of `room` rows at stride `ldc`), written by no
/// one else during the call; `init`, where given, covers `rows x nr` floats (it may be `c`).
#[allow(clippy::too_many_arguments)]
unsafe fn block<const T: bool>(
    rows: usize,
    a: Lhs,
    (panel, nr): (&[f32], usize),
    c: *mut f32,
    ldc: usize,
    cols: (usize, usize),
    init: Option<*const f32>,
    ahead: Ahead,
) {
    // Kernels apart for a start from zero: with the start a run-time choice, LLVM spilled
    // the 48-column kernel's accumulators (169 x 512 @ 512 x 1000 at half the rate).
    // SAFETY: forwarded from the caller.
    unsafe {
        let null = std::ptr::null();
        match (init, !a.steps.is_empty()) {
            (None, false) => {
                by_shape::<T, false, false>(rows, a, (panel, nr), c, ldc, cols, null, ahead)
            }
            (None, true) => {
                by_shape::<T, false, true>(rows, a, (panel, nr), c, ldc, cols, null, ahead)
            }
            (Some(i), false) => {
                by_shape::<T, true, false>(rows, a, (panel, nr), c, ldc, cols, i, ahead)
            }
            (Some(i), true) => {
                by_shape::<T, true, true>(rows, a, (panel, nr), c, ldc, cols, i, ahead)
            }
        }
    }
}

/// [`block`] for a start from zero (`I` false) or from `init` (`I` true).
///
/// # Safety
/// As [`block`].
#[allow(clippy::too_many_arguments)]
unsafe fn by_shape<const T: bool, const I: bool, const S: bool>(
    rows: usize,
    a: Lhs,
    (panel, nr): (&[f32], usize),
    c: *mut f32,
    ldc: usize,
    cols: (usize, usize),
    init: *const f32,
    ahead: Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    if !runs_wide(nr) {
        // The AVX2 kernel fetches nothing ahead (module docs).
        let _ = ahead;
        // SAFETY: forwarded from the caller (AVX2 present where AVX-512 is not).
        return unsafe { avx2_block::<T, I, S>(rows, a, (panel, nr), c, ldc, cols, init) };
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        use avx512::kernel as k;
        match (nr, rows) {
            (32, 12) => k::<2, 12, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 11) => k::<2, 11, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 10) => k::<2, 10, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 9) => k::<2, 9, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 8) => k::<2, 8, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 7) => k::<2, 7, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 6) => k::<2, 6, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 5) => k::<2, 5, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 4) => k::<2, 4, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 3) => k::<2, 3, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, 2) => k::<2, 2, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (32, _) => k::<2, 1, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (64, 6) => k::<4, 6, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (64, 5) => k::<4, 5, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (64, 4) => k::<4, 4, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (64, 3) => k::<4, 3, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (64, 2) => k::<4, 2, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (64, _) => k::<4, 1, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 8) => k::<3, 8, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 7) => k::<3, 7, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 6) => k::<3, 6, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 5) => k::<3, 5, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 4) => k::<3, 4, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 3) => k::<3, 3, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            (_, 2) => k::<3, 2, T, I, S>(a, panel, c, ldc, cols, init, ahead),
            _ => k::<3, 1, T, I, S>(a, panel, c, ldc, cols, init, ahead),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (
        rows, a.view, a.steps, a.down, panel, nr, c, ldc, cols, init, ahead,
    );
}

/// [`by_shape`] on AVX2 (or for panels of 16 columns, packed where AVX2 ran): blocks of at
/// most [`AVX2_ROWS`] rows, as [`PackedB::block_rows`] cuts them for such panels or CPUs.
///
/// # Safety
/// As [`block`], AVX2 and FMA present.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_block<const T: bool, const I: bool, const S: bool>(
    rows: usize,
    a: Lhs,
    panel: (&[f32], usize),
    c: *mut f32,
    ldc: usize,
    cols: (usize, usize),
    init: *const f32,
) {
    use avx2::kernel as k;
    assert!(rows <= AVX2_ROWS, "packed AVX2 block of {rows} rows");
    // SAFETY: forwarded from the caller.
    unsafe {
        match rows {
            6 => k::<6, T, I, S>(a, panel, c, ldc, cols, init),
            5 => k::<5, T, I, S>(a, panel, c, ldc, cols, init),
            4 => k::<4, T, I, S>(a, panel, c, ldc, cols, init),
            3 => k::<3, T, I, S>(a, panel, c, ldc, cols, init),
            2 => k::<2, T, I, S>(a, panel, c, ldc, cols, init),
            _ => k::<1, T, I, S>(a, panel, c, ldc, cols, init),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "cpu_gemm_packed_avx2.rs"]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Lhs;
    use std::arch::x86_64::*;

    /// `R` rows of A times one panel of `V` vectors into C: `V x R` accumulators (from zero, or
    /// with `I` from `init`'s row-major sums at stride `16 * V`) over the panel's K, then
    /// masked stores of the first `cols` columns, or (`T`) transposed stores. The first
    /// `ahead_lines` k steps each fetch one line from `ahead` on into L2 ([`super::Ahead`]).
    ///
    /// # Safety
    /// As [`super::block`], with `R` rows.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn kernel<
        const V: usize,
        const R: usize,
        const T: bool,
        const I: bool,
        const S: bool,
    >(
        a: Lhs,
        panel: &[f32],
        c: *mut f32,
        ldc: usize,
        (cols, room): (usize, usize),
        init: *const f32,
        (ahead, ahead_lines): (*const f32, usize),
    ) {
        let nr = 16 * V;
        let k = panel.len() / nr;
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        if I {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_loadu_ps(init.add(i * nr + 16 * v));
                }
            }
        }
        let (v, steps) = (a.view, a.steps);
        let (ap, bp) = (v.data.as_ptr().add(v.offset), panel.as_ptr());
        // The line of the block's last row `A_AHEAD_STEPS` k steps on (the next block reads
        // its first row's line again); past K it fetches whatever follows, never read. With
        // `down` 0 that is the line this step reads, in L1: a branch on `down` left the
        // accumulators of the 12-row kernel of 32-column panels stored to the stack every
        // step (inception_v2's 576 -> 160 1x1 on 14x14 1.4x the time in the model, 576 ->
        // 224 alone 1.5x), and with taps, whose 12-row kernel has no register left, the
        // code alone cost resnet50's strided 3x3 convs 10-15 %: reads with taps fetch nothing.
        let fetched = ap.wrapping_add(a.down + (R - 1) * v.rs);
        for kk in 0..k {
            if kk < ahead_lines {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(16 * kk).cast::<i8>());
            }
            if !S {
                _mm_prefetch::<_MM_HINT_T0>(fetched.wrapping_add(kk * v.cs).cast::<i8>());
            }
            let mut b = [_mm512_setzero_ps(); V];
            for (v, b) in b.iter_mut().enumerate() {
                *b = _mm512_loadu_ps(bp.add(kk * nr + 16 * v));
            }
            // With taps (`S`), the step's column from the table ([`super::TapSteps`]): one
            // loop over K (nested loops over columns and taps left the accumulators stored
            // to the stack every step, a tap index wrapping to the next column two of them).
            let col = match S {
                true => ap.add(*steps.get_unchecked(kk)),
                false => ap.add(kk * v.cs),
            };
            for (i, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*col.add(i * v.rs));
                for (acc, &b) in acc.iter_mut().zip(&b) {
                    *acc = _mm512_fmadd_ps(av, b, *acc);
                }
            }
        }
        if T {
            // 8 rows a transpose (12-row blocks of 32-column panels take two).
            for v in 0..V.min(cols.div_ceil(16)) {
                for h in (0..R).step_by(8) {
                    let rows: [__m512; 8] = std::array::from_fn(|i| {
                        acc.get(h + i).map_or(_mm512_setzero_ps(), |r| r[v])
                    });
                    let at = c.add(16 * v * ldc + h);
                    store_transposed(&rows, (R - h).min(8), at, ldc, (cols - 16 * v, room - h));
                }
            }
            return;
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                let first = 16 * v;
                if first >= cols {
                    break;
                }
                let mask = match cols - first {
                    16.. => 0xffff,
                    r => (1u16 << r) - 1,
                };
                _mm512_mask_storeu_ps(c.add(i * ldc + first), mask, *acc);
            }
        }
    }

    /// Rows `rows[..r]` (16 columns each) stored transposed: column `l < cols` (at most 16) to
    /// `c[l * ldc..][..r]`. An 8x16 transpose in registers, then 8 floats per column where
    /// `room` allows (the rows past `r` are the next block's, stored after), else `r`.
    ///
    /// # Safety
    /// AVX-512F present; `c` covers `cols.min(16)` columns of `room.max(r)` floats at stride
    /// `ldc`, written by no one else during the call.
    #[inline(always)]
    unsafe fn store_transposed(
        rows: &[__m512; 8],
        r: usize,
        c: *mut f32,
        ldc: usize,
        (cols, room): (usize, usize),
    ) {
        let pd = _mm512_castps_pd;
        // Pairs of rows interleaved, then pairs of pairs: q[k] holds, in its 128-bit lane j,
        // column 4j + k of rows 0..4 (k < 4) or rows 4..8 (k >= 4).
        let mut q = [_mm512_setzero_ps(); 8];
        for half in 0..2 {
            let x = &rows[4 * half..];
            let (t0, t1) = (
                _mm512_unpacklo_ps(x[0], x[1]),
                _mm512_unpackhi_ps(x[0], x[1]),
            );
            let (t2, t3) = (
                _mm512_unpacklo_ps(x[2], x[3]),
                _mm512_unpackhi_ps(x[2], x[3]),
            );
            q[4 * half] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t0), pd(t2)));
            q[4 * half + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t0), pd(t2)));
            q[4 * half + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t1), pd(t3)));
            q[4 * half + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t1), pd(t3)));
        }
        // Lanes (j of rows 0..4, j of rows 4..8) side by side: column 4j + k's 8 rows.
        let lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        let whole = room >= 8;
        let mut tail = [0.0f32; 16];
        for k in 0..4 {
            for (idx, j0) in [(lo, 0), (hi, 2)] {
                let both = _mm512_permutex2var_ps(q[k], idx, q[4 + k]);
                for (j, col) in [(j0, 4 * j0 + k), (j0 + 1, 4 * (j0 + 1) + k)] {
                    if col >= cols {
                        continue;
                    }
                    let dst = c.add(col * ldc);
                    let v = match j - j0 {
                        0 => _mm512_castps512_ps256(both),
                        _ => _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(pd(both))),
                    };
                    if whole {
                        _mm256_storeu_ps(dst, v);
                    } else {
                        _mm256_storeu_ps(tail.as_mut_ptr(), v);
                        std::ptr::copy_nonoverlapping(tail.as_ptr(), dst, r);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 37 + seed * 101) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    /// `A @ B` by the definition, in f64.
    fn naive(a: MatRef, b: MatRef, m: usize, k: usize, n: usize) -> Vec<f64> {
        let at = |x: MatRef, i: usize, j: usize| x.data[x.offset + i * x.rs + j * x.cs] as f64;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| at(a, i, l) * at(b, l, j)).sum();
            }
        }
        c
    }

    #[test]
    fn packing_keeps_every_element_on_cache_lines_and_zeroes_the_last_panel_past_n() {
        // On AVX-512 90 columns: two panels of 48 (the second holds 42); 120: two of 64 (the
        // second 56). On AVX2 panels of 16: six (the last holds 10) and eight (the last 8).
        for level in packed_levels() {
            for (n, wide_nr) in [(90, 48), (120, 64)] {
                let k = 3;
                let b = fill(k * n, 1);
                let p = crate::simd::with_level(level, || {
                    PackedB::pack(MatRef::row_major(&b, 0, n), k, n)
                });
                let nr = if level == Level::Avx512 { wide_nr } else { 16 };
                let panels = n.div_ceil(nr);
                assert_eq!(
                    (p.nr, 16 * p.lines.len()),
                    (nr, panels * k * nr),
                    "{level:?}"
                );
                // Every panel starts on a cache line (module docs: split loads).
                assert!((0..panels).all(|q| (p.panel(q).as_ptr() as usize).is_multiple_of(64)));
                let last = n - (panels - 1) * nr;
                for kk in 0..k {
                    for j in 0..n {
                        assert_eq!(p.panel(j / nr)[kk * nr + j % nr], b[kk * n + j]);
                    }
                    assert!(p.panel(panels - 1)[kk * nr + last..(kk + 1) * nr]
                        .iter()
                        .all(|&v| v == 0.0));
                }
            }
        }
    }

    /// The lines the blocks of a run fetch ahead: together exactly the stretch the task reads
    /// next (the same panel's next chunk of as many rows, or after its last chunk the first
    /// of the next panel), one line per k step, none before or after it, none past the last
    /// panel; nothing with `TANDEM_PREFETCH=0`.
    #[test]
    fn blocks_fetch_ahead_exactly_the_stretch_the_task_reads_next() {
        for level in packed_levels() {
            let (k, n) = (10, 150);
            let b = fill(k * n, 2);
            let p =
                crate::simd::with_level(level, || PackedB::pack(MatRef::row_major(&b, 0, n), k, n));
            let (nr, panels) = (p.panel_width(), p.panels());
            let base = p.panel(0).as_ptr() as usize;
            // (panel, rows of the run) -> (panel, rows) read next, or none.
            let cases = [
                (0, 0..10, Some((1, 0..10))),
                (0, 0..4, Some((0, 4..8))),
                (0, 8..10, Some((1, 0..2))),
                (0, 4..8, Some((0, 8..10))),
                (panels - 1, 0..10, None),
                (panels - 1, 0..4, Some((panels - 1, 4..8))),
            ];
            for (q, ks, next) in cases {
                let mut fetched = Vec::new();
                for blk in 0..2 * nr / 16 {
                    let (at, lines) = p.ahead(q, ks.clone(), blk);
                    assert!(lines <= ks.len(), "{level:?} one line per k step at most");
                    let first = (at as usize).wrapping_sub(base) / 64;
                    fetched.extend(first..first + lines);
                }
                let want: Vec<usize> = match next.filter(|_| prefetch_on()) {
                    Some((r, rows)) => {
                        let line = |kk: usize| (r * k * nr + kk * nr) / 16;
                        (line(rows.start)..line(rows.end)).collect()
                    }
                    None => Vec::new(),
                };
                assert_eq!(fetched, want, "{level:?} panel {q} rows {ks:?}");
            }
        }
    }

    #[test]
    fn the_panel_width_leaves_the_fewest_empty_columns() {
        for n in 1..600 {
            let w = panel_width(n);
            let empty = |w: usize| n.div_ceil(w) * w - n;
            assert!(
                [32, 48, 64].iter().all(|&o| empty(w) <= empty(o)),
                "n {n}: {w}"
            );
        }
        assert_eq!(
            [64, 128, 256, 48, 96, 192, 384, 160, 224, 352, 30].map(panel_width),
            [64, 64, 64, 48, 48, 48, 48, 32, 32, 32, 32]
        );
    }

    /// The levels this CPU runs a packed kernel at: AVX2, and AVX-512 where it has it. A test
    /// forces each on its own thread ([`crate::simd::with_level`]); pools run the detected one.
    fn packed_levels() -> Vec<Level> {
        let levels: Vec<Level> = crate::simd::cpu_levels()
            .into_iter()
            .filter(|&l| l >= Level::Avx2)
            .collect();
        if levels.is_empty() {
            eprintln!("no AVX2 here: the packed kernel cannot run (callers keep the gemm crate)");
        }
        levels
    }

    #[test]
    fn packed_products_match_the_definition_at_every_tail() {
        // Each level's kernel: on AVX2 6-row blocks of 16-column strips, so also the strips
        // past a panel's first and a strip's second vector.
        for level in packed_levels() {
            crate::simd::with_level(level, || products_match_the_definition(level));
        }
    }

    fn products_match_the_definition(level: Level) {
        // Row tails of each width's blocks (12, 8 and 6 rows), column tails inside each vector
        // of 32-, 48- and 64-column panels, K of 1 and odd K, A read in place with row-major and
        // transposed strides, one thread and the pool; K long enough to run in chunks whose
        // sums the next chunk adds to (20 x 3000 on one thread).
        for &(m, k, n) in &[
            (20, 3000, 70),
            (1, 1, 1),
            (3, 7, 17),
            (8, 16, 48),
            (13, 33, 95),
            (37, 64, 130),
            (128, 96, 200),
            (13, 5, 64),
            (23, 40, 120),
            (37, 17, 250),
            (128, 128, 256),
            (29, 19, 160),
            (12, 8, 30),
        ] {
            let (a, bv) = (fill(m * k, m), fill(k * n, n));
            let b = MatRef::row_major(&bv, 0, n);
            let packed = PackedB::pack(b, k, n);
            for a_view in [MatRef::row_major(&a, 0, k), MatRef::row_major(&a, 0, m).t()] {
                let want = naive(a_view, b, m, k, n);
                for threads in [Threads::Single, Threads::Pool] {
                    let ldc = n + 3;
                    let mut c = vec![f32::NAN; m * ldc];
                    sgemm_packed(m, a_view, &packed, &mut c, ldc, threads);
                    for i in 0..m {
                        for j in 0..n {
                            let (got, w) = (c[i * ldc + j] as f64, want[i * n + j]);
                            assert!(
                                (got - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                "{m}x{k}x{n} {level:?} ({threads:?}) C[{i}][{j}] = {got}, want {w}"
                            );
                        }
                        // The padding between rows is never written.
                        assert!(c[i * ldc + n..][..(ldc - n).min(c.len() - i * ldc - n)]
                            .iter()
                            .all(|v| v.is_nan()));
                    }
                }
            }
        }
    }

    #[test]
    fn transposed_products_match_the_definition_at_every_tail() {
        for level in packed_levels() {
            crate::simd::with_level(level, || transposed_products_match_the_definition(level));
        }
    }

    fn transposed_products_match_the_definition(level: Level) {
        // C^T = A @ B stored column by column (`c[j * ldc + i]`): rows past 8 and row tails of
        // each panel width (12, 8 and 6 rows a block: the 8-float stores that run into the next
        // block's rows, and a band's last block stored row by row), column tails inside a
        // vector, A read in place transposed (a conv's im2col block) and row-major; one thread
        // and pools of 2, 3, 8 and 16 (their bands end at other rows, cutting blocks short); K
        // long enough to run in chunks (49 x 2600: a deep conv's 7x7 plane).
        let pools: Vec<rayon::ThreadPool> = [2, 3, 8, 16]
            .map(|t| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap()
            })
            .into();
        for &(m, k, n) in &[
            (1, 3, 5),
            (7, 9, 48),
            (9, 16, 100),
            (29, 33, 130),
            (200, 40, 64),
            (27, 21, 160),
            (100, 12, 224),
            (49, 2600, 64),
        ] {
            let (a, bv) = (fill(m * k, m + 1), fill(k * n, n + 2));
            let b = MatRef::row_major(&bv, 0, n);
            let packed = PackedB::pack(b, k, n);
            for a_view in [MatRef::row_major(&a, 0, m).t(), MatRef::row_major(&a, 0, k)] {
                let want = naive(a_view, b, m, k, n);
                let runs = std::iter::once((Threads::Single, None))
                    .chain(pools.iter().map(|p| (Threads::Pool, Some(p))));
                for (threads, pool) in runs {
                    let ldc = m + 5;
                    let mut c = vec![f32::NAN; (n - 1) * ldc + m];
                    let mut product = || {
                        let c_at = (c.as_mut_ptr(), c.len(), ldc);
                        // SAFETY: `c` is live, exclusive and that long; `after` does nothing.
                        unsafe { sgemm_packed_t((m, a_view), &packed, c_at, threads, &|_, _| {}) }
                    };
                    match pool {
                        Some(p) => p.install(product),
                        None => product(),
                    }
                    let threads = pool.map_or(1, |p| p.current_num_threads());
                    for j in 0..n {
                        for i in 0..m {
                            let (got, w) = (c[j * ldc + i] as f64, want[i * n + j]);
                            assert!(
                                (got - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                "{m}x{k}x{n} {level:?} ({threads} threads) C^T[{j}][{i}] = {got}, \
                                 want {w}"
                            );
                        }
                        // The gap between columns is never written.
                        let gap = &c[(j * ldc + m).min(c.len())..((j + 1) * ldc).min(c.len())];
                        assert!(
                            gap.iter().all(|v| v.is_nan()),
                            "column {j} gap written ({threads})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bands_make_the_tasks_a_multiple_of_the_workers_where_the_blocks_allow() {
        // (blocks, panels, workers) -> blocks per band.
        for (blocks, panels, workers, want) in [
            (22, 21, 2, 11), // squeezenet's last conv: 2 bands, 42 tasks
            (10, 21, 2, 5),  // 2 bands of 5
            (22, 16, 2, 22), // 16 panels: one band
            (10, 7, 2, 5),   // 2 bands for 8 tasks: 14
            (12, 5, 3, 4),   // 3 bands for 12 tasks: 15
            (9, 3, 2, 3),    // 3 bands for 8 tasks: 9, and no count of bands of 9 blocks is even
            (1, 21, 2, 1),   // one block: 21 tasks
        ] {
            let per = band_blocks(blocks, panels, workers);
            let bands = blocks.div_ceil(per);
            assert_eq!(
                per, want,
                "{blocks} blocks, {panels} panels, {workers} workers"
            );
            assert!(
                bands * panels >= 4 * workers || bands == blocks,
                "{bands} bands"
            );
        }
    }

    #[test]
    fn a_kept_packing_refuses_another_shape() {
        let b = fill(12, 0);
        let kept = KeptPacking::default();
        kept.get(MatRef::row_major(&b, 0, 4), 3, 4);
        let again = std::panic::catch_unwind(|| {
            kept.get(MatRef::row_major(&b, 0, 3), 4, 3);
        });
        assert!(again.is_err());
    }
}
