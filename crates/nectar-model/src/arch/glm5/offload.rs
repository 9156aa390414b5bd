//! Where a routed expert that is in RAM but not in VRAM runs: copied to the GPU (through the
//! staging area, `copied.rs`) or computed on the CPU — decided per layer step from measured
//! costs ([`decide`]), and the counters that report it.
//!
//! The costs are exponentially weighted moving averages ([`Ewma`]) of what the runs themselves
//! measure, per bucket of rows an expert is applied to (1, 2, 3–4, 5–8, …: [`bucket`]): CPU
//! seconds per expert, GPU seconds per copied expert, and copy seconds per byte. Cold start
//! (an estimate missing for the step's bucket): a prompt-sized step (≥ [`COLD_COPY_M`] rows)
//! copies everything, a decode-sized one computes on the CPU but one expert, which measures
//! the copy route.
// Without the CUDA tier no copy is ever made: the copy side of the totals goes unused.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]
use std::sync::Mutex;

/// Row buckets: 1, 2, 3–4, 5–8, …, the last one open.
pub const BUCKETS: usize = 17;
/// Weight of a new sample in an estimate.
pub const ALPHA: f64 = 0.25;
/// A step of at least this many rows copies when the costs are not yet known: the row count
/// from which the GPU's products run on the tensor cores (`nectar_cuda::GEMM_MIN_M`), where
/// one expert's copy and product cost far less than the CPU's compute-bound product.
pub const COLD_COPY_M: usize = 9;

/// The bucket of an expert applied to `rows` rows: ⌈log₂ rows⌉, capped.
pub fn bucket(rows: usize) -> usize {
    ((usize::BITS - (rows.max(1) - 1).leading_zeros()) as usize).min(BUCKETS - 1)
}

/// An exponentially weighted moving average; empty until the first sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ewma(Option<f64>);

impl Ewma {
    /// Adds a sample (non-finite or negative samples are ignored).
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() || v < 0.0 {
            return;
        }
        self.0 = Some(match self.0 {
            None => v,
            Some(a) => a + ALPHA * (v - a),
        });
    }

    /// The estimate, once there is one.
    pub fn get(&self) -> Option<f64> {
        self.0
    }
}

/// The measured costs the decision uses.
#[derive(Debug, Clone, Default)]
pub struct Costs {
    /// CPU seconds per expert, per bucket.
    pub cpu: [Ewma; BUCKETS],
    /// GPU seconds per copied expert (its products, from staged weights), per bucket.
    pub gpu: [Ewma; BUCKETS],
    /// Seconds per byte of a copy (the slower of the host staging and the DMA).
    pub copy_s_per_byte: Ewma,
}

/// The estimate at bucket `b`, else at the nearest bucket that has one (below first).
fn near(v: &[Ewma; BUCKETS], b: usize) -> Option<f64> {
    (0..BUCKETS).find_map(|d| {
        b.checked_sub(d)
            .and_then(|i| v[i].get())
            .or_else(|| v.get(b + d).and_then(Ewma::get))
    })
}

/// One layer step as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// Rows of the step (tokens of the batch).
    pub m: usize,
    /// Rows of each routed expert in RAM, not in VRAM (the candidates).
    pub rows: &'a [usize],
    /// Bytes one expert copies.
    pub expert_bytes: u64,
    /// Rows of each product the GPU runs anyway in this step (the VRAM experts).
    pub gpu_rows: &'a [usize],
    /// Rows of each product the CPU runs anyway (the shared expert when it is on the CPU).
    pub cpu_rows: &'a [usize],
}

/// Which candidates of `step` to copy (`true`) rather than compute on the CPU.
///
/// With every estimate known: the candidates sorted by rows (most first: the CPU's cost grows
/// with rows, the GPU's hardly), the first k are copied, for the k that minimises the later of
/// the two sides — the CPU's Σ cost of the rest and its own work, and the GPU's own work plus
/// one copy (the pipeline's fill) plus Σ max(product, copy) of the k (a copy overlaps the
/// previous expert's product). Ties go to fewer copies.
pub fn decide(step: &Step<'_>, costs: &Costs) -> Vec<bool> {
    let n = step.rows.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| step.rows[b].cmp(&step.rows[a]).then(a.cmp(&b)));
    let mean = step.rows.iter().sum::<usize>().div_ceil(n.max(1));
    let b = bucket(mean);
    let copy = costs
        .copy_s_per_byte
        .get()
        .map(|s| s * step.expert_bytes as f64);
    let (Some(copy), Some(_), Some(_)) = (copy, costs.cpu[b].get(), costs.gpu[b].get()) else {
        // Cold start: prompt-sized copies, decode-sized stays, and one decode-sized expert
        // measures the copy route. A prompt never measures the CPU: one expert of hundreds of
        // rows on the CPU took seconds while the GPU finished the rest of the layer in
        // milliseconds, and the wave waited for it.
        let prompt = step.m >= COLD_COPY_M;
        let mut out = vec![prompt; n];
        if n >= 2 && !prompt && (copy.is_none() || costs.gpu[b].get().is_none()) {
            out[order[0]] = true;
        }
        return out;
    };
    let c = |r: usize| near(&costs.cpu, bucket(r)).unwrap_or(0.0);
    let g = |r: usize| near(&costs.gpu, bucket(r)).unwrap_or(0.0);
    let gpu_base: f64 = step.gpu_rows.iter().map(|&r| g(r)).sum();
    let cpu_base: f64 = step.cpu_rows.iter().map(|&r| c(r)).sum();
    let mut cpu_side: f64 = cpu_base + order.iter().map(|&i| c(step.rows[i])).sum::<f64>();
    let mut gpu_side = gpu_base;
    let (mut best, mut best_k) = (cpu_side.max(gpu_side), 0);
    for (k, &i) in order.iter().enumerate() {
        let r = step.rows[i];
        cpu_side -= c(r);
        gpu_side += g(r).max(copy) + if k == 0 { copy } else { 0.0 };
        let t = cpu_side.max(gpu_side);
        if t < best {
            (best, best_k) = (t, k + 1);
        }
    }
    let mut out = vec![false; n];
    for &i in &order[..best_k] {
        out[i] = true;
    }
    out
}

/// Totals of the copies since load.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CopyStats {
    /// Experts copied.
    pub experts: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds from each copy's first DMA queued to its last done (CUDA events on the copy
    /// stream; includes waits for the host's staging between its chunks).
    pub dma_s: f64,
    /// Bytes and seconds of the DMAs alone, each chunk timed by its own events: the link's rate.
    pub link_bytes: u64,
    /// See `link_bytes`.
    pub link_s: f64,
    /// Host seconds staging into the pinned ring.
    pub stage_s: f64,
    /// Seconds the copies took, each the slower of its staging and its DMA.
    pub copy_s: f64,
    /// Seconds the GPU side waited for a copy (not hidden behind compute).
    pub exposed_s: f64,
    /// Pinned host→device bandwidth measured at load on the same copy stream, bytes/s.
    pub pinned_bps: f64,
    /// Experts copied by DMA straight from their registered RAM slot (the rest went through
    /// the pinned ring).
    pub direct: u64,
    /// RAM slots registered with the driver for those copies (each on its first copy, and
    /// again after the RSS guard released it), and the host seconds that took.
    pub registrations: u64,
    /// See `registrations`.
    pub register_s: f64,
    /// Experts of streamed layers computed on the CPU instead, and the CPU side's busy seconds
    /// for them (what the decision weighs against the copies).
    pub cpu_experts: u64,
    /// See `cpu_experts`.
    pub cpu_s: f64,
    /// Seconds of the copied experts' products on the GPU (each from its staged weights, with
    /// its input's upload and its output's download).
    pub gpu_s: f64,
}

impl CopyStats {
    /// H2D GB/s of the expert copies' DMAs (the link while they run).
    pub fn h2d_gbps(&self) -> f64 {
        self.link_bytes as f64 / self.link_s.max(1e-12) / 1e9
    }

    /// GB/s of the copies end to end: bytes over the time each took, the slower of its host
    /// staging and its DMA span.
    pub fn copy_gbps(&self) -> f64 {
        self.bytes as f64 / self.copy_s.max(1e-12) / 1e9
    }

    /// The copies' H2D bandwidth ÷ the pinned reference.
    pub fn ratio(&self) -> f64 {
        self.h2d_gbps() * 1e9 / self.pinned_bps.max(1e-12)
    }

    /// Fraction of the copy time hidden behind compute.
    pub fn hidden(&self) -> f64 {
        if self.copy_s <= 0.0 {
            return 0.0;
        }
        (1.0 - self.exposed_s / self.copy_s).clamp(0.0, 1.0)
    }

    /// The `copy` object of `/stats` and the `--json` outputs.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "experts": self.experts,
            "bytes": self.bytes,
            "h2d_gbps": self.h2d_gbps(),
            "copy_gbps": self.copy_gbps(),
            "stage_gbps": self.bytes as f64 / self.stage_s.max(1e-12) / 1e9,
            "pinned_gbps": self.pinned_bps / 1e9,
            "h2d_over_pinned": self.ratio(),
            "hidden_fraction": self.hidden(),
            "direct": self.direct,
            "registrations": self.registrations,
            "register_s": self.register_s,
            "gpu_s": self.gpu_s,
            "cpu_experts": self.cpu_experts,
            "cpu_s": self.cpu_s,
        })
    }
}

/// The measured costs and totals shared by every MoE layer (one shape of expert).
#[derive(Debug, Default)]
pub struct Offload {
    costs: Mutex<Costs>,
    stats: Mutex<CopyStats>,
}

impl Offload {
    /// Starts cold, with the pinned reference bandwidth (bytes/s).
    pub fn new(pinned_bps: f64) -> Offload {
        Offload {
            stats: Mutex::new(CopyStats {
                pinned_bps,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// [`decide`] on the current estimates.
    pub fn decide(&self, step: &Step<'_>) -> Vec<bool> {
        decide(step, &self.costs.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// `experts` computed on the CPU took `secs` in all, at `rows` rows each (on average).
    pub fn cpu_sample(&self, rows: usize, experts: usize, secs: f64) {
        if experts > 0 {
            let mut c = self.costs.lock().unwrap_or_else(|p| p.into_inner());
            c.cpu[bucket(rows)].add(secs / experts as f64);
            drop(c);
            let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            s.cpu_experts += experts as u64;
            s.cpu_s += secs.max(0.0);
        }
    }

    /// One copied expert: its products took `gpu_s` at `rows` rows; its copy of `bytes` took
    /// `stage_s` on the host and `dma_s` on the link; the GPU side waited `exposed_s` for it.
    pub fn copy_sample(
        &self,
        rows: usize,
        bytes: u64,
        gpu_s: f64,
        stage_s: f64,
        dma_s: f64,
        exposed_s: f64,
    ) {
        let copy_s = stage_s.max(dma_s);
        {
            let mut c = self.costs.lock().unwrap_or_else(|p| p.into_inner());
            c.gpu[bucket(rows)].add(gpu_s);
            if bytes > 0 {
                c.copy_s_per_byte.add(copy_s / bytes as f64);
            }
        }
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.experts += 1;
        s.bytes += bytes;
        s.dma_s += dma_s;
        s.stage_s += stage_s;
        s.copy_s += copy_s;
        s.exposed_s += exposed_s.min(copy_s);
        s.gpu_s += gpu_s;
    }

    /// One copy went by DMA straight from its registered RAM slot; `registered_s`: the slot
    /// was registered for it, taking that long.
    pub fn direct_sample(&self, registered_s: Option<f64>) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.direct += 1;
        if let Some(t) = registered_s {
            s.registrations += 1;
            s.register_s += t;
        }
    }

    /// Totals since load.
    pub fn stats(&self) -> CopyStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current estimates.
    #[cfg(test)]
    pub fn costs(&self) -> Costs {
        self.costs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(cpu: f64, gpu: f64, copy_s_per_byte: f64) -> Costs {
        let mut c = Costs::default();
        for b in 0..BUCKETS {
            c.cpu[b].add(cpu * (1 << b) as f64);
            c.gpu[b].add(gpu);
        }
        c.copy_s_per_byte.add(copy_s_per_byte);
        c
    }

    fn step<'a>(m: usize, rows: &'a [usize]) -> Step<'a> {
        Step {
            m,
            rows,
            expert_bytes: 1000,
            gpu_rows: &[],
            cpu_rows: &[],
        }
    }

    #[test]
    fn buckets_are_powers_of_two() {
        let b: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 1 << 20]
            .iter()
            .map(|&r| bucket(r))
            .collect();
        assert_eq!(b, [0, 1, 2, 2, 3, 3, 4, 4, 5, BUCKETS - 1]);
        assert_eq!(bucket(0), 0);
    }

    #[test]
    fn ewma_starts_at_the_first_sample_and_ignores_garbage() {
        let mut e = Ewma::default();
        assert_eq!(e.get(), None);
        e.add(f64::NAN);
        e.add(-1.0);
        assert_eq!(e.get(), None);
        e.add(4.0);
        assert_eq!(e.get(), Some(4.0));
        e.add(8.0);
        assert_eq!(e.get(), Some(5.0));
    }

    #[test]
    fn cold_start_copies_prompts_and_keeps_decode_on_the_cpu_measuring_the_other_way() {
        let c = Costs::default();
        // Prompt: all copied (the CPU is not measured on prompt-sized experts).
        assert_eq!(decide(&step(512, &[3, 40, 12]), &c), [true, true, true]);
        let mut cpu_small = Costs::default();
        cpu_small.cpu[0].add(1e-3);
        assert_eq!(decide(&step(512, &[3, 40, 12]), &cpu_small), [true; 3]);
        // Decode: all on the CPU but one, which measures the copy route.
        assert_eq!(decide(&step(1, &[1, 1, 1]), &c), [true, false, false]);
        // A lone candidate just follows the rule.
        assert_eq!(decide(&step(1, &[1]), &c), [false]);
        assert_eq!(decide(&step(64, &[64]), &c), [true]);
        // CPU known, GPU not: decode still explores the copy.
        let mut cpu_only = Costs::default();
        cpu_only.cpu[0].add(1e-3);
        assert_eq!(decide(&step(1, &[1, 1]), &cpu_only), [true, false]);
    }

    #[test]
    fn a_slow_link_keeps_everything_on_the_cpu() {
        // CPU 1 ms per expert-row, copies 1 s per expert: never worth it.
        let c = known(1e-3, 1e-4, 1e-3);
        assert_eq!(decide(&step(1, &[1, 1, 1, 1]), &c), [false; 4]);
    }

    #[test]
    fn a_fast_gpu_takes_the_experts_with_the_most_rows() {
        // CPU: 1 ms per expert at one row, doubling per bucket; copy 0.5 ms, GPU 0.1 ms.
        let c = known(1e-3, 1e-4, 5e-7);
        let d = decide(&step(64, &[1, 32, 2, 16]), &c);
        // The three largest move (GPU side 2 ms: one fill and three copies of 0.5 ms); the
        // single-row one stays (1 ms on the CPU, where moving it would make the GPU side 2.5).
        assert_eq!(d, [false, true, true, true]);
        // Everything moves when the CPU is far slower.
        let slow_cpu = known(1.0, 1e-4, 5e-7);
        assert_eq!(decide(&step(64, &[1, 32, 2, 16]), &slow_cpu), [true; 4]);
    }

    #[test]
    fn work_already_on_each_side_shifts_the_split() {
        let c = known(1e-3, 1e-3, 1e-6);
        let rows = [1usize; 4];
        // Balanced costs: half and half (copy 1 ms, GPU 1 ms: 2 ms for the first, 1 ms after).
        let even = decide(&step(4, &rows), &c);
        let busy_gpu = decide(
            &Step {
                gpu_rows: &[1, 1, 1, 1, 1, 1],
                ..step(4, &rows)
            },
            &c,
        );
        let busy_cpu = decide(
            &Step {
                cpu_rows: &[1, 1, 1, 1, 1, 1],
                ..step(4, &rows)
            },
            &c,
        );
        let count = |v: &[bool]| v.iter().filter(|&&x| x).count();
        assert!(count(&busy_gpu) < count(&even), "{busy_gpu:?} vs {even:?}");
        assert!(count(&busy_cpu) > count(&even), "{busy_cpu:?} vs {even:?}");
    }

    #[test]
    fn estimates_fall_back_to_the_nearest_bucket() {
        let mut v = [Ewma::default(); BUCKETS];
        v[3].add(2.0);
        v[6].add(5.0);
        assert_eq!(near(&v, 0), Some(2.0));
        assert_eq!(near(&v, 4), Some(2.0));
        assert_eq!(near(&v, 5), Some(5.0));
        assert_eq!(near(&v, 16), Some(5.0));
    }

    #[test]
    fn stats_ratio_and_hidden_fraction() {
        let o = Offload::new(50e9);
        o.copy_sample(16, 20_000_000, 1e-4, 5e-4, 4e-4, 1e-4);
        o.copy_sample(16, 20_000_000, 1e-4, 3e-4, 4e-4, 0.0);
        let mut s = o.stats();
        assert_eq!(s.experts, 2);
        assert_eq!(s.bytes, 40_000_000);
        // End to end: 40 MB over 0.5 + 0.4 ms.
        assert!((s.copy_gbps() - 40e6 / 9e-4 / 1e9).abs() < 1e-6);
        (s.link_bytes, s.link_s) = (40_000_000, 8e-4);
        assert!((s.h2d_gbps() - 50.0).abs() < 1e-9);
        assert!((s.ratio() - 1.0).abs() < 1e-9);
        // 0.1 ms waited of 0.9 ms of copies.
        assert!((s.hidden() - (1.0 - 1.0 / 9.0)).abs() < 1e-9);
        let c = o.costs();
        assert!(c.gpu[bucket(16)].get().is_some() && c.copy_s_per_byte.get().is_some());
        assert_eq!(CopyStats::default().hidden(), 0.0);
        o.direct_sample(Some(0.25));
        o.direct_sample(None);
        let s = o.stats();
        assert_eq!((s.direct, s.registrations, s.register_s), (2, 1, 0.25));
        assert_eq!(s.json()["direct"], 2);
    }
}
