//! Speculative decoding on the demo model: acceptance, tokens per forward
//! and tok/s for MTP γ = 1..3, `auto` and prompt lookup against plain
//! decoding, greedy, on the four reference prompts, with the eos stop off so
//! every run generates the same number of tokens.
//!
//! ```text
//! cargo run --release -p nectar-engine --example spec_bench -- [--threads N] [--tokens 128]
//!     [--repeats 5] [--model DIR]
//! ```
//!
//! Configurations are interleaved within each repeat, so load on the
//! machine hits them alike; per prompt and configuration the median time of
//! the repeats counts. Every run's tokens are checked against plain
//! decoding's (greedy speculation must not change them).

use nectar_engine::{
    generate_speculative, Generation, ModelBundle, Request, Speculation, Speculator, Step,
};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqStep};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

struct Config {
    name: &'static str,
    spec: Option<Speculation>,
}

fn configs() -> Vec<Config> {
    let mtp = |gamma, auto| {
        Some(Speculation {
            speculator: Speculator::Mtp { gamma },
            auto,
        })
    };
    vec![
        Config {
            name: "off",
            spec: None,
        },
        Config {
            name: "mtp γ=1",
            spec: mtp(1, false),
        },
        Config {
            name: "mtp γ=2",
            spec: mtp(2, false),
        },
        Config {
            name: "mtp γ=3",
            spec: mtp(3, false),
        },
        Config {
            name: "mtp auto (γ≤2)",
            spec: mtp(2, true),
        },
        Config {
            name: "mtp auto (γ≤3)",
            spec: mtp(3, true),
        },
        Config {
            name: "prompt-lookup n=2 γ=3",
            spec: Some(Speculation {
                speculator: Speculator::PromptLookup {
                    ngram: 2,
                    max_draft: 3,
                },
                auto: false,
            }),
        },
    ]
}

/// The repeats of one configuration on one prompt.
#[derive(Default)]
struct Runs {
    gens: Vec<Generation>,
    /// Prefill + decode seconds per repeat.
    e2e: Vec<f64>,
    /// Decode seconds per repeat.
    decode: Vec<f64>,
}

/// Milliseconds (best, median of `reps`) of a main forward plus logits of
/// n = 1..=4 rows after `prompt` (n = 1 is a plain decoding step, n = γ + 1
/// a verification), then of one MTP draft step (layer + head, one row).
fn costs(model: &Glm5, prompt: &[u32], reps: usize) -> nectar_engine::Result<Vec<(f64, f64)>> {
    let err = |e: nectar_model::Error| nectar_engine::Error::Model(e);
    let mut cache = model.new_cache();
    let hd = model.hidden_size();
    let h = model
        .forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: prompt,
            }],
            &mut NoObserver,
        )
        .map_err(err)?;
    let mut next = prompt[1..].to_vec();
    next.push(prompt[0]);
    model
        .mtp_forward(
            &mut [MtpStep {
                cache: &mut cache,
                hidden: &h,
                next_tokens: &next,
            }],
            &mut NoObserver,
        )
        .map_err(err)?;
    let (n0, m0) = (cache.len(), cache.mtp.len());
    let mut times = vec![Vec::new(); 5];
    for _ in 0..reps {
        for (n, t) in times.iter_mut().enumerate().take(4) {
            let t0 = Instant::now();
            let h = model
                .forward(
                    &mut [SeqStep {
                        cache: &mut cache,
                        tokens: &prompt[..n + 1],
                    }],
                    &mut NoObserver,
                )
                .map_err(err)?;
            model.logits(&h).map_err(err)?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            cache.truncate(n0);
        }
        let t0 = Instant::now();
        let hm = model
            .mtp_forward(
                &mut [MtpStep {
                    cache: &mut cache,
                    hidden: &h[..hd],
                    next_tokens: &prompt[..1],
                }],
                &mut NoObserver,
            )
            .map_err(err)?;
        model.mtp_logits(&hm).map_err(err)?;
        times[4].push(t0.elapsed().as_secs_f64() * 1e3);
        cache.mtp.truncate(m0);
    }
    Ok(times
        .into_iter()
        .map(|t| (t.iter().copied().fold(f64::INFINITY, f64::min), median(t)))
        .collect())
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(n) = arg(&args, "--threads") {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.parse()?)
            .build_global()?;
    }
    let tokens: usize = arg(&args, "--tokens").map_or(Ok(128), |s| s.parse())?;
    let repeats: usize = arg(&args, "--repeats").map_or(Ok(5), |s| s.parse())?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = arg(&args, "--model").map_or(root.join("models/nectar-demo-glm5"), PathBuf::from);
    let bundle = ModelBundle::open(&dir)?;
    let model = &bundle.model;
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json"))?)?;
    let prompts: Vec<(String, Vec<u32>)> = reference["prompts"]
        .as_array()
        .ok_or("reference.json: no prompts")?
        .iter()
        .map(|p| {
            let ids = p["input_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                .into_iter()
                .flatten()
                .collect();
            (p["name"].as_str().unwrap_or("?").to_string(), ids)
        })
        .collect();
    let configs = configs();
    let ok = |_: &Step| Ok(true);
    let run = |spec: Option<&Speculation>, prompt: &[u32]| -> nectar_engine::Result<Generation> {
        let req = Request::new(prompt.to_vec(), tokens);
        generate_speculative(model, None, &[], &req, spec, ok)
    };
    // Warm-up: page the weights in and settle the pool.
    for (_, p) in &prompts {
        run(None, p)?;
    }
    // [config][prompt]
    let mut results: Vec<Vec<Runs>> = configs
        .iter()
        .map(|_| prompts.iter().map(|_| Default::default()).collect())
        .collect();
    for _ in 0..repeats {
        for (pi, (_, p)) in prompts.iter().enumerate() {
            for (ci, c) in configs.iter().enumerate() {
                let g = run(c.spec.as_ref(), p)?;
                let r = &mut results[ci][pi];
                r.e2e.push((g.prefill + g.decode).as_secs_f64());
                r.decode.push(g.decode.as_secs_f64());
                r.gens.push(g);
            }
        }
    }
    let threads = rayon::current_num_threads();
    let cost = costs(model, &prompts[prompts.len() - 1].1, 50)?;
    println!("costs after the last prompt, ms (best / median of 50):");
    for (i, (best, med)) in cost.iter().enumerate() {
        let what = match i {
            4 => "MTP draft step (layer + head, 1 row)".to_string(),
            0 => "main forward + logits, 1 row (plain step)".to_string(),
            n => format!("main forward + logits, {} rows (verify γ={n})", n + 1),
        };
        println!(
            "  {what:<44} {best:>7.3} / {med:>7.3}   ×{:.2} of a plain step",
            best / cost[0].0
        );
    }
    println!(
        "demo model, greedy, {tokens} tokens per prompt, {} prompts, {repeats} repeats (median), {threads} threads",
        prompts.len()
    );
    println!(
        "{:<24} {:>8} {:>9} {:>16} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8}",
        "config",
        "drafted",
        "accept %",
        "by depth %",
        "tok/fwd",
        "tok/s",
        "best",
        "decode/s",
        "vs off",
        "(best)"
    );
    let mut rows = Vec::new();
    let (mut off_tok_s, mut off_best) = (0.0, 0.0);
    for (ci, c) in configs.iter().enumerate() {
        let (mut drafted, mut accepted, mut fwd, mut decoded) = (0, 0, 0, 0);
        // Per depth j: drafts checked and accepted.
        let (mut tried_at, mut acc_at) = (vec![0.0; 3], vec![0.0; 3]);
        let (mut e2e, mut e2e_best, mut dec, mut n_tokens) = (0.0, 0.0, 0.0, 0);
        let mut identical = true;
        for (pi, r) in results[ci].iter().enumerate() {
            let g = &r.gens[0];
            identical &= r
                .gens
                .iter()
                .all(|x| x.tokens == results[0][pi].gens[0].tokens);
            let s = g.spec.as_ref().ok_or("no telemetry")?;
            drafted += s.drafted;
            accepted += s.accepted;
            fwd += s.main_forwards;
            decoded += g.tokens.len().saturating_sub(1);
            for (j, (&n, &a)) in s
                .checked_by_depth
                .iter()
                .zip(&s.acceptance_by_depth)
                .enumerate()
                .take(3)
            {
                tried_at[j] += n as f64;
                acc_at[j] += a * n as f64;
            }
            e2e += median(r.e2e.clone());
            e2e_best += r.e2e.iter().copied().fold(f64::INFINITY, f64::min);
            dec += median(r.decode.clone());
            n_tokens += g.tokens.len();
        }
        let tok_s = n_tokens as f64 / e2e;
        let best = n_tokens as f64 / e2e_best;
        let dec_s = decoded as f64 / dec;
        if ci == 0 {
            (off_tok_s, off_best) = (tok_s, best);
        }
        let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
        println!(
            "{:<24} {:>8} {:>9.1} {:>16} {:>8.2} {:>8.1} {:>8.1} {:>9.1} {:>8.3} {:>8.3}{}",
            c.name,
            drafted,
            pct(accepted as f64, drafted as f64),
            (0..3)
                .filter(|&j| tried_at[j] > 0.0)
                .map(|j| format!("{:.1}", pct(acc_at[j], tried_at[j])))
                .collect::<Vec<_>>()
                .join("/"),
            decoded as f64 / fwd.max(1) as f64,
            tok_s,
            best,
            dec_s,
            tok_s / off_tok_s,
            best / off_best,
            if identical { "" } else { "  OUTPUT DIFFERS" }
        );
        let decisions: Vec<String> = results[ci]
            .iter()
            .filter_map(|r| {
                let d = &r.gens[0].spec.as_ref()?.decisions;
                let path: Vec<String> = d
                    .iter()
                    .map(|d| format!("γ={}×{}", d.gamma, d.windows))
                    .collect();
                d.last()
                    .map(|last| format!("{}; last: {}", path.join(" → "), last.reason))
            })
            .collect();
        rows.push(json!({
            "config": c.name, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted as f64 / drafted.max(1) as f64,
            "acceptance_by_depth": (0..3)
                .filter(|&j| tried_at[j] > 0.0)
                .map(|j| acc_at[j] / tried_at[j])
                .collect::<Vec<_>>(),
            "tokens_per_forward": decoded as f64 / fwd.max(1) as f64,
            "tok_s": tok_s, "tok_s_best": best, "decode_tok_s": dec_s,
            "ratio_vs_off": tok_s / off_tok_s, "ratio_vs_off_best": best / off_best,
            "identical_to_off": identical, "auto_final_decisions": decisions,
        }));
    }
    for r in &rows {
        if let Some(d) = r["auto_final_decisions"]
            .as_array()
            .filter(|d| !d.is_empty())
        {
            println!(
                "{}: decisions per prompt (γ × windows held), first repeat:",
                r["config"]
            );
            for x in d {
                println!("  {}", x.as_str().unwrap_or(""));
            }
        }
    }
    if args.iter().any(|a| a == "--json") {
        println!(
            "{}",
            json!({"threads": threads, "tokens": tokens, "repeats": repeats, "rows": rows})
        );
    }
    Ok(())
}
