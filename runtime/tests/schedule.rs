//! Golden tests of the hybrid scheduler (`tandem::schedule`) on hand-made task lists with
//! frozen costs: every expected placement, cut and makespan below is worked out by hand from
//! the cost coefficients, never copied from the scheduler's output. Plus a property test over
//! random DAGs (seeded LCG): HEFT and HEFT+split never predict worse than the best single device.

use tandem::cost::{Coeffs, FrozenCosts};
use tandem::costs::NodeCostQuery;
use tandem::schedule::{schedule, schedule_from, simulate, Choice, Policy, Task};
use tandem::{DType, Device};
use tandem_ops::Work;

fn task(
    op: &'static str,
    flops: u64,
    ins: &[(usize, u64)],
    outs: &[(usize, u64)],
) -> Task<'static> {
    Task {
        query: NodeCostQuery {
            op_type: op,
            dtype: DType::F32,
            work: Work {
                flops,
                bytes_read: 0,
                bytes_written: 0,
            },
            dispatches: 1,
            variant: "",
            gpu_pad: 1.0,
            rows: 0.0,
        },
        inputs: ins.to_vec(),
        outputs: outs.to_vec(),
        rows: 1,
        gpu_tile: 1,
        gpu_refusal: None,
        forced: None,
        row_local: Vec::new(),
    }
}

fn coeffs(per_flop: f64, fixed: f64) -> Coeffs {
    Coeffs {
        per_flop,
        per_byte: 0.0,
        fixed,
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

/// FrozenCosts::new(): CPU 1e-10 s/flop + 1 us, GPU 1e-11 s/flop + 20 us, links 10 us +
/// 1e-10 s/byte, sync 50 us. A 2 GFLOP matmul: CPU 0.2 s, GPU 0.02 s.
#[test]
fn gpu_ten_times_faster_takes_the_matmul() {
    let costs = FrozenCosts::new();
    let tasks = [task(
        "MatMul",
        2_000_000_000,
        &[(0, 1_000_000)],
        &[(1, 1_000_000)],
    )];
    let s = schedule(&tasks, &costs, Policy::Heft);
    assert_eq!(s.choices[0], Choice::On(Device::Gpu));
    // Upload of the CPU-resident input (10 us + 1e6 * 1e-10 s) then 0.02 s + 20 us.
    let want = 1e-5 + 1e-4 + 0.02 + 2e-5;
    assert!(close(s.makespan, want, 1e-9), "{} vs {want}", s.makespan);
    let cpu = schedule(&tasks, &costs, Policy::CpuOnly);
    assert!(close(cpu.makespan, 0.2 + 1e-6, 1e-9));
}

/// The same matmul while another session's work keeps the GPU busy: 0.15 s of waiting plus
/// 0.02 s on the GPU loses to 0.2 s on the CPU only when the wait is longer than 0.18 s.
#[test]
fn a_gpu_busy_with_other_work_is_planned_around() {
    let costs = FrozenCosts::new();
    let tasks = [task(
        "MatMul",
        2_000_000_000,
        &[(0, 1_000_000)],
        &[(1, 1_000_000)],
    )];
    let s = schedule_from(&tasks, &costs, Policy::Heft, 0.15);
    assert_eq!(s.choices[0], Choice::On(Device::Gpu));
    // Starts when the GPU frees up (the upload is done by then): 0.15 + 0.02 + 20 us.
    assert!(
        close(s.makespan, 0.15 + 0.02 + 2e-5, 1e-9),
        "{}",
        s.makespan
    );
    let s = schedule_from(&tasks, &costs, Policy::Heft, 0.25);
    assert_eq!(s.choices[0], Choice::On(Device::Cpu));
    assert!(close(s.makespan, 0.2 + 1e-6, 1e-9), "{}", s.makespan);
}

/// A cheap elementwise op after a GPU matmul is faster alone on the CPU (1 us vs 20 us), but
/// fetching its 4 MB input costs 10 us + 400 us + 50 us sync: it stays beside its producer.
/// Greedy per-op, which ignores transfers, moves it.
#[test]
fn expensive_transfer_keeps_elementwise_beside_its_producer() {
    let costs = FrozenCosts::new();
    let tasks = [
        task("MatMul", 2_000_000_000, &[(0, 4_000)], &[(1, 4_000_000)]),
        task("Relu", 1_000, &[(1, 4_000_000)], &[(2, 4_000_000)]),
    ];
    let s = schedule(&tasks, &costs, Policy::Heft);
    assert_eq!(s.choices, vec![Choice::On(Device::Gpu); 2]);
    let g = schedule(&tasks, &costs, Policy::GreedyPerOp);
    assert_eq!(g.choices[1], Choice::On(Device::Cpu));
    assert!(s.makespan < g.makespan);
}

/// A -> B -> C with A and C 10x faster on the GPU. B alone saves 200 us on the CPU, more than
/// fetching its input (10 + 100 us) plus the sync (50 us), so HEFT, which does not yet know
/// that C returns to the GPU, moves it; smoothing counts the upload back (another 110 us):
/// 270 us > 200 us, so B is put back on the GPU.
#[test]
fn isolated_node_between_gpu_nodes_is_smoothed() {
    let costs = FrozenCosts::new()
        .with_op("B", Device::Cpu, coeffs(0.0, 1e-5))
        .with_op("B", Device::Gpu, coeffs(0.0, 2.1e-4));
    let mb = 1_000_000;
    let tasks = [
        task("A", 100_000_000, &[(0, 4)], &[(1, mb)]),
        task("B", 0, &[(1, mb)], &[(2, mb)]),
        task("C", 100_000_000, &[(2, mb)], &[(3, 4)]),
    ];
    let s = schedule(&tasks, &costs, Policy::Heft);
    assert_eq!(s.choices, vec![Choice::On(Device::Gpu); 3]);
    assert!(
        s.explain[1].why.starts_with("smoothed"),
        "{}",
        s.explain[1].why
    );
    // When B saves 390 us on the CPU, more than the 270 us of moves, it stays there.
    let costs = costs.with_op("B", Device::Gpu, coeffs(0.0, 4e-4));
    let s2 = schedule(&tasks, &costs, Policy::Heft);
    let want = [Device::Gpu, Device::Cpu, Device::Gpu].map(Choice::On);
    assert_eq!(s2.choices, want, "{:?}", s2.explain[1]);
}

#[test]
fn forced_device_is_respected() {
    let costs = FrozenCosts::new();
    let mut t = task("MatMul", 2_000_000_000, &[(0, 4)], &[(1, 4)]);
    t.forced = Some(Device::Cpu);
    t.rows = 100;
    for p in Policy::ALL {
        let s = schedule(std::slice::from_ref(&t), &costs, p);
        assert_eq!(s.choices[0], Choice::On(Device::Cpu), "{}", p.name());
    }
    let s = schedule(std::slice::from_ref(&t), &costs, Policy::HeftSplit);
    assert_eq!(s.explain[0].why, "forced to cpu");
}

#[test]
fn gpu_refused_node_stays_on_cpu_with_reason() {
    let costs = FrozenCosts::new();
    let mut t = task("MatMul", 2_000_000_000, &[(0, 4)], &[(1, 4)]);
    t.gpu_refusal = Some("f64 tensors are not supported on the GPU".into());
    t.rows = 100;
    for p in Policy::ALL {
        let s = schedule(std::slice::from_ref(&t), &costs, p);
        assert_eq!(s.choices[0], Choice::On(Device::Cpu), "{}", p.name());
    }
    let s = schedule(std::slice::from_ref(&t), &costs, Policy::HeftSplit);
    assert!(
        s.explain[0].why.contains("f64 tensors"),
        "{}",
        s.explain[0].why
    );
    assert_eq!(s.explain[0].gpu, None);
}

/// CPU 0.1 s for the whole matmul, GPU 0.15 s. The host uploads the input first (10 us + 4e5 *
/// 1e-10 = 50 us), then both parts run, then it downloads the GPU share (10 us + f * 40 us)
/// after a 50 us sync. Equal parts: (1-f)*0.1 + 1e-6 = 0.15 f + 20e-6  =>  f = 0.099981 / 0.25
/// = 0.39992, cut = 1000 (1 - f) = 600.1; finish 50e-6 + (1-f)*0.1 + 1e-6 + 60e-6 + 40e-6 f.
#[test]
fn balanced_pair_splits_at_the_equal_finish_cut() {
    let costs = FrozenCosts::new()
        .with_op("MatMul", Device::Cpu, coeffs(1e-10, 1e-6))
        .with_op("MatMul", Device::Gpu, coeffs(1.5e-10, 2e-5));
    let mut t = task("MatMul", 1_000_000_000, &[(0, 400_000)], &[(1, 400_000)]);
    t.rows = 1000;
    let s = schedule(std::slice::from_ref(&t), &costs, Policy::HeftSplit);
    let Choice::Split { cut } = s.choices[0] else {
        panic!("expected a split, got {:?}", s.choices[0]);
    };
    let f = 0.099981 / 0.25;
    let want = 1000.0 * (1.0 - f);
    assert!(
        (cut as f64 - want).abs() <= 8.0,
        "cut {cut}, want ~{want:.1}"
    );
    let finish = 50e-6 + (1.0 - f) * 0.1 + 1e-6 + 60e-6 + 40e-6 * f;
    assert!(
        close(s.makespan, finish, 0.002),
        "{} vs {finish}",
        s.makespan
    );
    // HEFT without splits: the CPU alone.
    let h = schedule(std::slice::from_ref(&t), &costs, Policy::Heft);
    assert_eq!(h.choices[0], Choice::On(Device::Cpu));
}

/// The pair above with a GPU kernel 64 rows tall (16 tiles for 1000 rows, the last one
/// partial, so the whole node's 0.15 s is 16 tiles' time): the GPU part of a split is a
/// whole number of tiles. The unrounded cut leaves about 400 GPU rows; whole tiles: 384 (cut
/// 616, 6 of 16 tiles: 0.15 * 6/16 = 56.25 ms + 20 us < CPU 0.616 * 0.1 s + 1 us = 61.601 ms)
/// or 448 (cut 552, 7 tiles: 65.65 ms > CPU 55.2 ms). Best: cut 616. The host uploads the
/// input first (10 us + 40 us) and joins the 384 GPU rows after both parts (10 us + 15.36 us
/// of bytes + sync 50 us): 0.05 + 61.601 + 0.07536 = 61.72636 ms.
#[test]
fn split_cut_is_rounded_to_the_kernel_tile_height() {
    let costs = FrozenCosts::new()
        .with_op("MatMul", Device::Cpu, coeffs(1e-10, 1e-6))
        .with_op("MatMul", Device::Gpu, coeffs(1.5e-10, 2e-5));
    let mut t = task("MatMul", 1_000_000_000, &[(0, 400_000)], &[(1, 400_000)]);
    t.rows = 1000;
    t.gpu_tile = 64;
    let s = schedule(std::slice::from_ref(&t), &costs, Policy::HeftSplit);
    assert_eq!(s.choices[0], Choice::Split { cut: 616 });
    assert!(close(s.makespan, 0.06172636, 1e-6), "{}", s.makespan);
}

/// The tile height comes from the op's own launch geometry: the GPU MatMul computes 64x64
/// output tiles (one workgroup each), so 64 rows, or all of them when there are fewer; Relu
/// splits along its last axis (a row is one element) and runs 64 elements per workgroup
/// (unary.wgsl's WG), so 64 rows too.
#[test]
fn tile_height_of_real_kernels() {
    use tandem::plan::gpu_tile_rows;
    use tandem_ops::{registry, Attrs, TensorMeta};
    let mm = registry::build("MatMul", &Attrs::new(13)).unwrap();
    let b = TensorMeta::new(DType::F32, vec![128, 96]);
    for (m, tile) in [(300, 64), (40, 40)] {
        let a = TensorMeta::new(DType::F32, vec![m, 128]);
        let outs = mm.infer(&[&a, &b]).unwrap();
        assert_eq!(
            gpu_tile_rows(mm.as_ref(), &[&a, &b], &outs),
            tile,
            "M = {m}"
        );
    }
    let relu = registry::build("Relu", &Attrs::new(13)).unwrap();
    let x = TensorMeta::new(DType::F32, vec![30, 10]);
    let outs = relu.infer(&[&x]).unwrap();
    assert_eq!(gpu_tile_rows(relu.as_ref(), &[&x], &outs), 64);
}

/// Two equal, independent 0.1 s nodes and equally fast devices: one on each, both done in
/// about 0.1 s instead of 0.2 s. The GPU's node is issued first: the host uploads its 4-byte
/// input before it runs the other node's kernel.
#[test]
fn independent_branches_use_both_devices() {
    let costs = FrozenCosts::new()
        .with_op("W", Device::Cpu, coeffs(1e-10, 0.0))
        .with_op("W", Device::Gpu, coeffs(1e-10, 0.0));
    let tasks = [
        task("W", 1_000_000_000, &[(0, 4)], &[(1, 4)]),
        task("W", 1_000_000_000, &[(0, 4)], &[(2, 4)]),
    ];
    let s = schedule(&tasks, &costs, Policy::Heft);
    assert_ne!(s.choices[0], s.choices[1]);
    assert!(s.makespan < 0.101, "{}", s.makespan);
    assert_eq!(s.choices[s.order[0]], Choice::On(Device::Gpu));
    let cpu = schedule(&tasks, &costs, Policy::CpuOnly);
    assert!(close(cpu.makespan, 0.2, 1e-6));
}

/// A 0.1 s node W (10x slower on the GPU) beside an independent node S as fast on either
/// device. Moving S to the GPU saves S's time: 0.5 ms of 100.5 (0.5%) is not worth a mix
/// (MIX_MARGIN 5%): all on the CPU; 20 ms of 120 (17%) is.
#[test]
fn a_mix_must_beat_the_best_single_device_by_the_margin() {
    let costs = FrozenCosts::new()
        .with_op("W", Device::Cpu, coeffs(1e-10, 0.0))
        .with_op("W", Device::Gpu, coeffs(1e-9, 0.0))
        .with_op("S", Device::Cpu, coeffs(1e-10, 0.0))
        .with_op("S", Device::Gpu, coeffs(1e-10, 0.0));
    let plan = |s_flops: u64| {
        let tasks = [
            task("W", 1_000_000_000, &[(0, 4)], &[(1, 4)]),
            task("S", s_flops, &[(0, 4)], &[(2, 4)]),
        ];
        schedule(&tasks, &costs, Policy::Heft)
    };
    let small = plan(5_000_000);
    assert_eq!(small.choices, vec![Choice::On(Device::Cpu); 2]);
    assert!(
        small.explain[1].why.contains("within 5%"),
        "{}",
        small.explain[1].why
    );
    assert!(close(small.makespan, 0.1005, 1e-6), "{}", small.makespan);
    let big = plan(200_000_000);
    let want = [Device::Cpu, Device::Gpu].map(Choice::On);
    assert_eq!(big.choices, want, "{:?}", big.explain);
    assert!(big.makespan < 0.101, "{}", big.makespan);
    // The host uploads S's input and records S before it runs W: issued the other way round,
    // the upload would wait for W's 0.1 s.
    assert_eq!(big.order, vec![1, 0]);
}

/// The host makes every copy, so a copy cannot hide behind a CPU kernel. A (1 ms on the CPU,
/// 100x slower on the GPU) and G (0.4 ms on the CPU, 0.1 ms on the GPU) both read a 5 MB input
/// and J joins them; G's 5 MB output comes back for J. Copies: 10 us + 0.5 ms up, and 0.56 ms
/// down with the sync. G on the GPU, its upload first: upload to 0.51 ms, A to 1.51, G's
/// download after A to 2.07, J 1.1 us: 2.0711 ms. All on the CPU: 1 + 0.4 ms + J = 1.4011 ms.
/// (Were copies free to overlap A, G on the GPU would look like 0.61 + 0.56 ms, under A's
/// 1 ms.)
#[test]
fn copies_take_the_host_so_they_do_not_hide_behind_cpu_kernels() {
    let costs = FrozenCosts::new()
        .with_op("A", Device::Cpu, coeffs(1e-9, 0.0))
        .with_op("A", Device::Gpu, coeffs(1e-7, 0.0))
        .with_op("G", Device::Cpu, coeffs(4e-10, 0.0))
        .with_op("G", Device::Gpu, coeffs(1e-10, 0.0));
    let mb5 = 5_000_000;
    let tasks = [
        task("A", 1_000_000, &[(0, mb5)], &[(1, 4)]),
        task("G", 1_000_000, &[(0, mb5)], &[(2, mb5)]),
        task("J", 1000, &[(1, 4), (2, mb5)], &[(3, 4)]),
    ];
    let s = schedule(&tasks, &costs, Policy::HeftSplit);
    assert_eq!(
        s.choices,
        vec![Choice::On(Device::Cpu); 3],
        "{:?}",
        s.explain
    );
    assert!(close(s.makespan, 1.4011e-3, 1e-6), "{}", s.makespan);
    let gpu_g = [Device::Cpu, Device::Gpu, Device::Cpu].map(Choice::On);
    let (_, replayed) = simulate(&tasks, &costs, &gpu_g, &[1, 0, 2]);
    assert!(close(replayed, 2.0711e-3, 1e-6), "{replayed}");
}

/// A tiny linear congruential generator (Knuth's MMIX constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Log-uniform in [lo, hi).
    fn log_between(&mut self, lo: f64, hi: f64) -> f64 {
        let u = self.next() as f64 / (1u64 << 31) as f64;
        lo * (hi / lo).powf(u)
    }
}

const OPS: [&str; 4] = ["MatMul", "Conv", "Add", "Softmax"];

/// Random costs and a random DAG of 1-14 tasks (value 0 is the graph input; task i writes
/// value i + 1 and reads 1-2 earlier values).
fn random_case(rng: &mut Lcg) -> (FrozenCosts, Vec<Task<'static>>) {
    let mut costs = FrozenCosts::new();
    for op in OPS {
        for d in [Device::Cpu, Device::Gpu] {
            let c = coeffs(rng.log_between(1e-12, 1e-9), rng.log_between(1e-7, 1e-4));
            costs = costs.with_op(op, d, c);
        }
    }
    costs.upload.seconds_per_byte = rng.log_between(1e-12, 1e-9);
    costs.download.seconds_per_byte = rng.log_between(1e-12, 1e-9);
    costs.sync = rng.log_between(1e-6, 1e-3);
    let n = 1 + rng.below(14) as usize;
    let mut tasks = Vec::new();
    for i in 0..n {
        let reads = 1 + rng.below(2);
        let mut ins: Vec<(usize, u64)> = Vec::new();
        for _ in 0..reads {
            let v = rng.below(i as u64 + 1) as usize;
            if !ins.iter().any(|x| x.0 == v) {
                ins.push((v, 4 * (1 + rng.below(1 << 20))));
            }
        }
        let mut t = task(
            OPS[rng.below(4) as usize],
            rng.below(1 << 30),
            &ins,
            &[(i + 1, 4 * (1 + rng.below(1 << 20)))],
        );
        t.rows = 1 + rng.below(300) as usize;
        if rng.below(10) == 0 {
            t.gpu_refusal = Some("refused".into());
        }
        tasks.push(t);
    }
    (costs, tasks)
}

#[test]
fn heft_never_predicts_worse_than_the_best_single_device() {
    let mut rng = Lcg(0x5eed_1234);
    for case in 0..300 {
        let (costs, tasks) = random_case(&mut rng);
        let single = [Policy::CpuOnly, Policy::GpuOnly]
            .map(|p| schedule(&tasks, &costs, p).makespan)
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        for p in [Policy::Heft, Policy::HeftSplit] {
            let s = schedule(&tasks, &costs, p);
            assert!(
                s.makespan <= single * (1.0 + 1e-9),
                "case {case} {}: {} > best single {single}",
                p.name(),
                s.makespan
            );
            // The order is topological.
            let mut done = vec![false; tasks.len() + 1];
            done[0] = true;
            for &i in &s.order {
                assert!(tasks[i].inputs.iter().all(|(v, _)| done[*v]), "case {case}");
                done[i + 1] = true;
            }
        }
    }
}

/// `Schedule::makespan` is the timeline of `Schedule::order`, the order the executor issues
/// (it once was simulated in upward-rank order instead: 26 of these 600 schedules differed).
#[test]
fn replaying_the_issued_order_gives_the_predicted_makespan() {
    let mut rng = Lcg(0x5eed_1234);
    for case in 0..300 {
        let (costs, tasks) = random_case(&mut rng);
        for p in [Policy::Heft, Policy::HeftSplit] {
            let s = schedule(&tasks, &costs, p);
            let (_, m) = simulate(&tasks, &costs, &s.choices, &s.order);
            assert!(
                close(m, s.makespan, 1e-9),
                "case {case} {}: replay {m} vs {}",
                p.name(),
                s.makespan
            );
        }
    }
}

/// Relu -> Relu, 1000 rows, 1 MFLOP each at 1 ns/flop on both devices (1 us per row each side),
/// 4000-byte values (links 10 us + 0.1 ns/byte, sync 50 us). The host makes the copies: as a
/// chain at cut c it uploads the input (10.4 us), then both nodes' CPU rows run back to back
/// (2c us) while the GPU runs both halves (2(1000-c) us), and the host joins once after both
/// (60 us + 0.4 us * GPU share): best at c = 500, 10.4 + 1000 + 60.2 us = 1.0706 ms. Without
/// row-locality the second node must wait for a join and an upload of the first.
#[test]
fn balanced_row_local_pair_shares_one_cut_without_a_join() {
    let same = coeffs(1e-9, 0.0);
    let costs = FrozenCosts::new()
        .with_op("Relu", Device::Cpu, same)
        .with_op("Relu", Device::Gpu, same);
    let relu = |i: usize, row_local: bool| {
        let mut t = task("Relu", 1_000_000, &[(i, 4000)], &[(i + 1, 4000)]);
        t.rows = 1000;
        if row_local {
            t.row_local = vec![i];
        }
        t
    };
    let chained = [relu(0, true), relu(1, true)];
    let s = schedule(&chained, &costs, Policy::HeftSplit);
    let (Choice::Split { cut: a }, Choice::Split { cut: b }) = (s.choices[0], s.choices[1]) else {
        panic!("both nodes should be split: {:?}", s.choices);
    };
    assert_eq!(a, b, "a chain shares one cut");
    assert!((498..=502).contains(&a), "cut {a}, expected about 500");
    assert!(
        close(s.makespan, 1.0706e-3, 0.005),
        "makespan {}",
        s.makespan
    );
    // Joined: the first node alone splits at 500 (upload 10.4 us, 500 us of rows each side,
    // join 60.2 us: 570.6 us) and the second waits for that join, uploads the 4000 bytes
    // (10.4 us) and splits again: 1.1412 ms, slower than the chain.
    let joined = [relu(0, false), relu(1, false)];
    let j = schedule(&joined, &costs, Policy::HeftSplit);
    assert!(
        close(j.makespan, 1.1412e-3, 0.005),
        "joined makespan {}",
        j.makespan
    );
    assert!(s.makespan < j.makespan);
}
