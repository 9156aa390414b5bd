//! The memory equation: what a budget buys after everything that must stay resident.
//!
//! ```text
//! budget ≥ spine + working·slot + pinned·slot + MTP working·mtp_slot + KV(ctx)
//!          + prefill transients + runtime reserve + safety margin
//!          + LRU·(sparse_layers·slot + mtp_slot)
//! ```
//! The LRU capacity is what remains, divided evenly over the sparse layers — and the MTP layer,
//! whose tier has the same capacity at its own slot size (Colibri's int8 MTP experts are ~1.8×
//! the int4 main ones; sizing every slot for them would waste ~44 % of each main slot). What is
//! left after the last whole row of slots becomes one more slot on as many sparse layers as it
//! holds, spread evenly: a row of GLM-5.2's slots is 1.4 GB, so left unused it would waste up
//! to 5 % of a 32 GB machine (1.0 GB at 29 GiB). A budget that cannot hold one LRU slot per
//! sparse layer is refused with the whole equation.
//!
//! A server plans KV and activations for every sequence it may decode together, but a
//! sequence that is not decoding holds neither: [`PlanInputs::lent_to`] is the equation with
//! only `k` of them in use, the others' share lent to the LRU (a server with `--parallel 4`
//! gives a lone client GLM-5.2's 11–12 slots a layer on 32 GB, where the full plan holds 9–10).
use crate::error::{Error, Result};
use serde::Serialize;

/// Inputs of the equation.
#[derive(Debug, Clone, Serialize)]
pub struct PlanInputs {
    /// The hard memory budget in bytes.
    pub budget: u64,
    /// Resident (non-expert) bytes by class, e.g. ("attention", n).
    pub spine: Vec<(String, u64)>,
    /// Bytes of one slot of the main layers.
    pub slot_bytes: u64,
    /// Sparse (MoE) main layers with an LRU tier (the MTP layer is not counted here).
    pub sparse_layers: usize,
    /// Bytes of one slot of the MTP layer's tier (0: no MTP layer is streamed).
    pub mtp_slot_bytes: u64,
    /// Experts per layer (more LRU slots than this would never be used).
    pub experts_per_layer: usize,
    /// Working slots.
    pub working_slots: usize,
    /// Pinned slots.
    pub pinned_slots: usize,
    /// Working slots of the MTP layer's own tier (its LRU is sized like a main layer's).
    pub mtp_slots: usize,
    /// Compressed KV bytes per token (MLA latent + rope key per layer + indexer keys).
    pub kv_bytes_per_token: u64,
    /// Tokens of KV cache planned for: the context length of every sequence.
    pub ctx: usize,
    /// Sequences `ctx` and the runtime reserve's activations are planned for (what
    /// [`PlanInputs::lent_to`] lends from).
    pub sequences: usize,
    /// The runtime reserve's activations of one sequence ([`reserve_per_sequence`]; 0 where the
    /// reserve was given whole).
    pub reserve_per_sequence: u64,
    /// Transient buffers of a prefill chunk.
    pub prefill_transients: u64,
    /// Process reserve (allocator, thread stacks, tokenizer, server).
    pub runtime_reserve: u64,
}

/// The resolved plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Every term of the equation, in bytes.
    pub terms: Vec<(String, u64)>,
    /// LRU slots of every sparse layer (and of the MTP tier), at least.
    pub lru_per_layer: usize,
    /// Sparse layers holding one LRU slot more than [`Plan::lru_per_layer`] (fewer than the
    /// sparse layers; [`Plan::lru_slots`] says which).
    pub lru_extra_layers: usize,
    /// Sparse (MoE) main layers planned for.
    pub sparse_layers: usize,
    /// Bytes of all LRU slots (every sparse layer's, and the MTP tier's).
    pub lru_bytes: u64,
    /// Bytes left over after the LRU.
    pub slack: u64,
}

/// What the runtime reserve is made of: the process's memory besides the weights, the caches
/// and the transients the other terms count. Its parts were measured on the demo models with
/// `/proc/<pid>/smaps_rollup` and `status` (`docs/memory.md`: the commands and the figures) and
/// are kept as constants rather than re-read by every process, so that `nectar fit`, `run` and
/// `serve` plan the same bytes and `fit`'s minimum is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReserveInputs {
    /// Bytes of the model's `tokenizer.json` (0 without one).
    pub tokenizer_json_bytes: u64,
    /// Threads of the process: compute, I/O, and the main and ledger threads.
    pub threads: usize,
    /// Sequences decoded together.
    pub sequences: usize,
    /// Hidden size.
    pub hidden: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// The process is `nectar serve` (an async runtime, HTTP buffers, the response store).
    pub server: bool,
}

/// The process image: the binary's and the C libraries' resident pages, the tokenizer's code
/// among them (`RssFile`: 9.9 MB for `run` without a tokenizer, 12.0 MB with one), and the
/// allocator's and the Rust runtime's own heap (about 3 MB of `RssAnon` besides the weights,
/// slots and caches).
pub const RESERVE_PROCESS: u64 = 15 << 20;
/// `nectar serve` on top of [`RESERVE_PROCESS`]: the async runtime's threads, connection
/// buffers, the response and conversation stores (measured 2–3 MB idle; room for requests).
pub const RESERVE_SERVER: u64 = 8 << 20;
/// A loaded tokenizer's heap per byte of its `tokenizer.json` (vocabulary and merges maps, the
/// pre-tokenizer regex): the demo's 552 KB file costs 2.3 MB of `RssAnon` once the parse's
/// temporaries are trimmed (4.2 bytes per byte; 7.5 MB before the trim).
pub const RESERVE_TOKENIZER_PER_BYTE: u64 = 5;
/// Per thread: its touched stack and its share of the allocator's per-thread arenas.
pub const RESERVE_PER_THREAD: u64 = 256 << 10;

/// The runtime reserve for `r` (see [`ReserveInputs`]): the process image, the tokenizer, the
/// threads, and per sequence a decode step's activations ([`reserve_per_sequence`]).
pub fn runtime_reserve(r: &ReserveInputs) -> u64 {
    RESERVE_PROCESS
        + if r.server { RESERVE_SERVER } else { 0 }
        + r.tokenizer_json_bytes * RESERVE_TOKENIZER_PER_BYTE
        + r.threads as u64 * RESERVE_PER_THREAD
        + r.sequences.max(1) as u64 * reserve_per_sequence(r.hidden, r.vocab)
}

/// A decode step's activations of one sequence: 16 vocabulary-sized f32 rows (the logits of a
/// verify round and the sampler's copies) and 64 hidden-sized rows. Allocated by the step and
/// freed after it, so a sequence that is not decoding holds none.
pub fn reserve_per_sequence(hidden: u64, vocab: u64) -> u64 {
    16 * vocab * 4 + 64 * hidden * 4
}

impl PlanInputs {
    /// The equation with `k` of the planned sequences in use (clamped to `1..=sequences`): the
    /// others' KV cache and step activations are lent to the LRU. Both are allocated as a
    /// sequence grows and freed when it ends, so memory follows the sequences in use; the
    /// caller takes the loan back (evicting the coldest experts, their pages returned to the
    /// OS) before another sequence starts. The working bank and the prefill transients keep
    /// the full plan's size: the bank's spare slots carry the look-ahead's reads for the rows
    /// there are, and a joining prompt's span (what the transients hold) decides how often a
    /// long prompt re-reads every expert — a lone client's 10k-token prompt would read the
    /// expert file 2.5× more often in spans of one sequence's 1,024 tokens.
    pub fn lent_to(&self, k: usize) -> PlanInputs {
        let n = self.sequences.max(1);
        let idle = (n - k.clamp(1, n)) as u64;
        PlanInputs {
            ctx: self.ctx - (self.ctx / n) * idle as usize,
            sequences: n - idle as usize,
            runtime_reserve: self.runtime_reserve - idle * self.reserve_per_sequence,
            ..self.clone()
        }
    }
}

/// Safety margin: 2 % of the budget.
pub fn safety_margin(budget: u64) -> u64 {
    budget / 50
}

/// Solves the equation (see the module docs).
pub fn plan(p: &PlanInputs) -> Result<Plan> {
    let mut terms: Vec<(String, u64)> = p
        .spine
        .iter()
        .map(|(k, v)| (format!("spine: {k}"), *v))
        .collect();
    terms.push((
        format!("working bank ({} slots)", p.working_slots),
        p.working_slots as u64 * p.slot_bytes,
    ));
    if p.pinned_slots > 0 {
        terms.push((
            format!("pinned tier ({} slots)", p.pinned_slots),
            p.pinned_slots as u64 * p.slot_bytes,
        ));
    }
    if p.mtp_slots > 0 {
        terms.push((
            format!("MTP working bank ({} slots)", p.mtp_slots),
            p.mtp_slots as u64 * p.mtp_slot_bytes,
        ));
    }
    terms.push((
        format!("KV cache ({} tokens)", p.ctx),
        p.kv_bytes_per_token * p.ctx as u64,
    ));
    terms.push(("prefill transients".into(), p.prefill_transients));
    terms.push(("runtime reserve".into(), p.runtime_reserve));
    terms.push(("safety margin (2 %)".into(), safety_margin(p.budget)));
    let fixed: u64 = terms.iter().map(|t| t.1).sum();
    let per_slot_row = p.sparse_layers.max(1) as u64 * p.slot_bytes.max(1) + p.mtp_slot_bytes;
    let lru =
        (p.budget.saturating_sub(fixed) / per_slot_row).min(p.experts_per_layer.max(1) as u64);
    // The remainder of a row: one slot more on some layers (none once every expert fits, and
    // none where not even one row does: that budget is refused below).
    let extra = if lru >= 1 && lru < p.experts_per_layer as u64 {
        ((p.budget.saturating_sub(fixed + lru * per_slot_row)) / p.slot_bytes.max(1))
            .min(p.sparse_layers.saturating_sub(1) as u64)
    } else {
        0
    };
    let lru_bytes = lru * per_slot_row + extra * p.slot_bytes;
    let mtp = if p.mtp_slot_bytes > 0 { " + MTP" } else { "" };
    let more = if extra > 0 {
        format!(", {} on {extra} of them", lru + 1)
    } else {
        String::new()
    };
    terms.push((
        format!(
            "LRU ({lru} slots × {} sparse layers{more}{mtp})",
            p.sparse_layers
        ),
        lru_bytes,
    ));
    let plan = Plan {
        slack: p.budget.saturating_sub(fixed + lru_bytes),
        lru_per_layer: lru as usize,
        lru_extra_layers: extra as usize,
        sparse_layers: p.sparse_layers,
        lru_bytes,
        terms,
    };
    if lru < 1 && p.sparse_layers > 0 {
        let need = min_budget(fixed - safety_margin(p.budget), per_slot_row);
        return Err(Error::Budget(format!(
            "{}\nneeds at least {} ({need} bytes) for one LRU slot per sparse layer",
            render(&plan, p.budget),
            human_ceil(need),
        )));
    }
    Ok(plan)
}

impl Plan {
    /// LRU slots of the `i`-th sparse layer (counted in model order): the extra slots go to
    /// evenly spaced layers. Replayed on route256 the layers gain alike from a slot (an
    /// allocation by layer beats the even one by under 0.05 % of hits,
    /// `benchmarks/policy-research/layer_alloc.py`), so where they go matters little.
    pub fn lru_slots(&self, i: usize) -> usize {
        let n = self.sparse_layers.max(1);
        let e = self.lru_extra_layers.min(n);
        self.lru_per_layer + usize::from((i + 1) * e / n > i * e / n)
    }

    /// The LRU slots of a sparse layer in words: `13 LRU slots`, or with extra slots on some
    /// layers `13–14 LRU slots (14 on 56 of 75 layers)`.
    pub fn lru_words(&self) -> String {
        let c = self.lru_per_layer;
        match self.lru_extra_layers {
            0 if c == 1 => "1 LRU slot".into(),
            0 => format!("{c} LRU slots"),
            e => format!(
                "{c}–{} LRU slots ({} on {e} of {} layers)",
                c + 1,
                c + 1,
                self.sparse_layers
            ),
        }
    }

    /// The share of the sparse layers holding one slot more (what a projection mixes in).
    pub fn lru_extra_share(&self) -> f64 {
        self.lru_extra_layers as f64 / self.sparse_layers.max(1) as f64
    }
}

/// The least budget `b` with `b − safety_margin(b) ≥ fixed + row`: the margin grows with the
/// budget, so `fixed + margin + row` at a smaller budget is not enough once typed in.
fn min_budget(fixed_without_margin: u64, row: u64) -> u64 {
    let need = fixed_without_margin + row;
    let mut b = need + need / 49;
    while b - safety_margin(b) < need {
        b += 1;
    }
    while b > 0 && (b - 1) - safety_margin(b - 1) >= need {
        b -= 1;
    }
    b
}

/// [`human`], rounded up at its last digit: a minimum printed this way is enough when typed
/// back in.
pub fn human_ceil(b: u64) -> String {
    let (unit, name, digits) = if b >= 1 << 30 {
        ((1u64 << 30) as f64, "GiB", 100.0)
    } else if b >= 1 << 20 {
        ((1u64 << 20) as f64, "MiB", 10.0)
    } else {
        (1024.0, "KiB", 10.0)
    };
    let v = (b as f64 / unit * digits).ceil() / digits;
    if digits == 100.0 {
        format!("{v:.2} {name}")
    } else {
        format!("{v:.1} {name}")
    }
}

/// The equation as text, one term per line.
pub fn render(plan: &Plan, budget: u64) -> String {
    let mut s = String::new();
    for (k, v) in &plan.terms {
        s.push_str(&format!("  {:>12}  {k}\n", human(*v)));
    }
    let total: u64 = plan.terms.iter().map(|t| t.1).sum();
    s.push_str(&format!(
        "  {:>12}  total\n  {:>12}  budget\n",
        human(total),
        human(budget)
    ));
    s
}

/// Bytes as a short human string (GiB/MiB/KiB).
pub fn human(b: u64) -> String {
    let f = b as f64;
    if f >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", f / (1024.0 * 1024.0 * 1024.0))
    } else if f >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", f / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KiB", f / 1024.0)
    }
}

/// Parses a size like `24G`, `512MiB`, `1.5GB`, `1000000` (bytes). K/M/G/T are powers of 1024.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size (try 24G or 512M)"))?;
    let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        u => return Err(format!("unknown size unit `{u}` in `{s}`")),
    };
    if v.is_nan() || v < 0.0 || !v.is_finite() {
        return Err(format!("`{s}` is not a size"));
    }
    Ok((v * mul) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The printed minimum is a fixed point: that budget (as bytes, and as the rounded-up
    /// size text) is accepted, one byte less is refused.
    #[test]
    fn the_minimum_it_prints_is_accepted() {
        for (spine, slot, layers) in [
            (150_000_000u64, 900_000u64, 16usize),
            (9_500_000_000, 21_200_000, 75),
            (1_000, 4_096, 1),
        ] {
            let inputs = |budget| PlanInputs {
                budget,
                spine: vec![("attention".into(), spine)],
                slot_bytes: slot,
                sparse_layers: layers,
                mtp_slot_bytes: 0,
                experts_per_layer: 256,
                working_slots: 16,
                pinned_slots: 0,
                mtp_slots: 0,
                kv_bytes_per_token: 1000,
                ctx: 4096,
                sequences: 1,
                reserve_per_sequence: 0,
                prefill_transients: 1 << 20,
                runtime_reserve: 1 << 27,
            };
            let err = plan(&inputs(spine)).unwrap_err().to_string();
            let bytes: u64 = err
                .split(" bytes)")
                .next()
                .and_then(|x| x.rsplit('(').next())
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("{err}"));
            assert_eq!(plan(&inputs(bytes)).unwrap().lru_per_layer, 1, "{err}");
            assert!(plan(&inputs(bytes - 1)).is_err());
            let text = err.split("needs at least ").nth(1).unwrap();
            let typed = text.split(" (").next().unwrap().replace(' ', "");
            let typed = parse_size(&typed).unwrap();
            assert!(typed >= bytes && plan(&inputs(typed)).is_ok(), "{text}");
        }
    }

    fn inputs(budget: u64) -> PlanInputs {
        PlanInputs {
            budget,
            spine: vec![("attention".into(), 1000)],
            slot_bytes: 100,
            sparse_layers: 3,
            mtp_slot_bytes: 0,
            experts_per_layer: 256,
            working_slots: 4,
            pinned_slots: 0,
            mtp_slots: 0,
            kv_bytes_per_token: 1,
            ctx: 100,
            sequences: 1,
            reserve_per_sequence: 0,
            prefill_transients: 0,
            runtime_reserve: 0,
        }
    }

    /// A plan lent to `k` of its sequences is the plan of a server planned for `k` sequences,
    /// except that the working bank and the prefill transients keep the full plan's size; its
    /// LRU only grows as fewer sequences are in use, and every term still sums to the budget.
    #[test]
    fn idle_sequences_lend_their_kv_and_activations() {
        let mut full = inputs(40_000);
        (full.sequences, full.ctx, full.kv_bytes_per_token) = (4, 4 * 1000, 2);
        (full.reserve_per_sequence, full.runtime_reserve) = (250, 100 + 4 * 250);
        let whole = plan(&full).unwrap();
        let (mut last, mut free) = (whole.lru_bytes, 0);
        for k in (1..=4).rev() {
            let lent = full.lent_to(k);
            assert_eq!((lent.sequences, lent.ctx), (k, k * 1000));
            assert_eq!(lent.runtime_reserve, 100 + k as u64 * 250);
            assert_eq!(
                (lent.working_slots, lent.prefill_transients),
                (full.working_slots, full.prefill_transients)
            );
            let p = plan(&lent).unwrap();
            assert!(p.lru_bytes >= last, "{k}: {} < {last}", p.lru_bytes);
            let total: u64 = p.terms.iter().map(|t| t.1).sum();
            assert_eq!(total + p.slack, full.budget);
            (last, free) = (p.lru_bytes, p.lru_bytes + p.slack);
        }
        // Each idle sequence lends 2 × 1000 + 250 bytes: 6,750 with one in use.
        assert_eq!(free - (whole.lru_bytes + whole.slack), 6_750);
        assert!(last - whole.lru_bytes >= 6_700, "{last}");
        assert_eq!(full.lent_to(0).sequences, 1);
        assert_eq!(full.lent_to(9).ctx, full.ctx);
    }

    #[test]
    fn capacity_and_refusal() {
        // fixed = 1000 + 400 + 100 + 2 % of budget
        let p = plan(&inputs(10_000)).unwrap();
        assert_eq!(p.lru_per_layer, (10_000 - 1500 - 200) / 300);
        // 8300 − 27 × 300 = 200: two of the three layers hold a 28th slot.
        assert_eq!(p.lru_extra_layers, 2);
        assert_eq!(p.lru_bytes, p.lru_per_layer as u64 * 300 + 200);
        assert_eq!(p.slack, 0);
        let mut few = inputs(10_000);
        few.experts_per_layer = 5;
        let all = plan(&few).unwrap();
        assert_eq!((all.lru_per_layer, all.lru_extra_layers), (5, 0));
        let e = plan(&inputs(1_700)).unwrap_err().to_string();
        assert!(
            e.contains("working bank") && e.contains("budget") && e.contains("one LRU slot"),
            "{e}"
        );
    }

    /// The remainder of a row goes to evenly spaced layers, one slot each, every byte of it
    /// counted: the terms sum to the budget less the slack, which is under one slot.
    #[test]
    fn the_last_partial_row_becomes_slots_on_some_layers() {
        for budget in (2_000..40_000).step_by(37) {
            for (layers, mtp) in [(3, 0), (7, 0), (7, 170), (75, 0)] {
                let mut inp = inputs(budget);
                inp.sparse_layers = layers;
                inp.mtp_slot_bytes = mtp;
                let Ok(p) = plan(&inp) else { continue };
                let caps: Vec<usize> = (0..layers).map(|i| p.lru_slots(i)).collect();
                let more = caps.iter().filter(|&&c| c > p.lru_per_layer).count();
                assert_eq!(more, p.lru_extra_layers, "{caps:?}");
                assert!(more < layers && caps.iter().all(|&c| c <= p.lru_per_layer + 1));
                let row = layers as u64 * 100 + mtp;
                assert_eq!(
                    p.lru_bytes,
                    p.lru_per_layer as u64 * row + more as u64 * 100
                );
                let total: u64 = p.terms.iter().map(|t| t.1).sum();
                assert_eq!(total + p.slack, budget, "{budget} {layers}");
                assert!(p.slack < 100 || more == layers - 1, "{budget}: {p:?}");
                // Evenly spread: no two layers with an extra slot closer than n / extra.
                if let Some(spacing) = layers.checked_div(more) {
                    let at: Vec<usize> =
                        (0..layers).filter(|&i| caps[i] > p.lru_per_layer).collect();
                    let gap = at.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(layers);
                    assert!(gap >= spacing, "{caps:?}");
                }
            }
        }
    }

    #[test]
    fn the_mtp_tier_has_its_own_slot_size() {
        let mut p = inputs(10_000);
        p.mtp_slot_bytes = 180;
        p.mtp_slots = 2;
        // fixed = 1500 + 2 × 180 + 200; per LRU row: 3 × 100 + 180.
        let plan = plan(&p).unwrap();
        assert_eq!(plan.lru_per_layer, (10_000 - 1500 - 360 - 200) / 480);
        let text = render(&plan, p.budget);
        assert!(
            text.contains("MTP working bank (2 slots)") && text.contains("+ MTP"),
            "{text}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("24G").unwrap(), 24 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("77").unwrap(), 77);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5Q").is_err());
    }
}
