//! `nectar run`: generate text from a prompt (greedy by default), streamed to stdout.
use crate::args::{MtpMode, RunArgs};
use crate::demo::model_dir;
use anyhow::{Context, Result};
use nectar_engine::{
    generate_spec, Generation, Logprobs, ModelBundle, Request, SamplingParams, SpecStats,
    Speculation, Speculator, StopCause, Tokenizer, DEFAULT_DRAFT_TOKENS, MAX_DRAFT,
};
use nectar_model::arch::glm5::{LoadOptions, PilotStats, Prefetch};
use nectar_residency::rss::RssGuard;
use nectar_residency::Telemetry;
use serde_json::{json, Value};
use std::io::Write;

/// The prompt used when none is given.
const DEFAULT_PROMPT: &str = "And God said,";

pub fn run(a: RunArgs) -> Result<()> {
    let dir = model_dir(a.model.clone())?;
    let budget = match &a.memory_budget {
        Some(b) => Some(nectar_engine::budget_for_this_process(
            super::fit::resolve_budget(Some(b))?,
        )),
        None => None,
    };
    let opts = LoadOptions {
        memory_budget: budget,
        ctx_size: a.ctx_size,
        io_threads: a.cache.io_threads,
        prefetch: Prefetch::parse(&a.cache.prefetch).unwrap_or_default(),
        admission: nectar_residency::Admission::from_name(&a.cache.admission)
            .unwrap_or(nectar_model::arch::glm5::DEFAULT_ADMISSION),
        pin: match budget {
            Some(_) => super::usage::pin_request(&dir, &a.cache.pin, a.cache.pin_size.as_deref())?,
            None => None,
        },
        gpu_memory: super::gpu_flag::resolve(a.gpu_memory.as_deref())?,
        // `--mtp off` (the default) neither loads nor plans the MTP layer.
        mtp: a.mtp != MtpMode::Off,
        ..Default::default()
    };
    let bundle = ModelBundle::open_with(&dir, &opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    if let Some(p) = bundle.model.gpu_placement() {
        eprintln!("{}", p.summary);
    }
    let mut guard = budget.map(RssGuard::new);
    let prompt_ids = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, p) => {
            let text = p.as_deref().unwrap_or(DEFAULT_PROMPT);
            if a.chat {
                bundle.encode_chat(text)?
            } else {
                bundle.encode_text(text)?
            }
        }
    };
    let mut request = request(&a, prompt_ids.clone())?;
    if budget.is_some() {
        request.max_tokens = within_context(prompt_ids.len(), a.max_tokens, a.ctx_size)?;
    }
    let tok = bundle.tokenizer.as_ref();
    // Refuse bad flags before echoing the prompt.
    request.validate(bundle.model.vocab_size(), tok.is_some())?;
    request.compile_grammar(tok, bundle.model.vocab_size(), &bundle.stop_ids)?;
    warn_unused_knobs(&request.params);
    let spec = speculation(&a)?;
    let mut stdout = std::io::stdout().lock();
    if !a.json {
        if let (Some(t), None) = (tok, &a.prompt_ids) {
            if !a.chat {
                write!(stdout, "{}", t.decode(&prompt_ids, true)?)?;
                stdout.flush()?;
            }
        }
    }
    let mut session = match &a.session {
        Some(p) => Some(super::session::open(p, a.session_format, &bundle)?),
        None => None,
    };
    let stops: Vec<u32> = bundle.stop_ids.iter().chain(&a.stop_id).copied().collect();
    let on_step = |step: &nectar_engine::Step| {
        // After each step every expert lease is released: a safe point for the RSS guard.
        if let (Some(g), Some(r)) = (guard.as_mut(), bundle.model.residency()) {
            g.check(r)
                .map_err(|e| nectar_engine::Error::Model(e.into()))?;
        }
        if a.json {
            return Ok(true);
        }
        let piece = match tok {
            Some(_) => step.text.clone(),
            None if stops.contains(&step.token) => String::new(),
            None => format!("{} ", step.token),
        };
        // A closed stdout stops generation instead of failing it.
        Ok(write!(stdout, "{piece}")
            .and_then(|_| stdout.flush())
            .is_ok())
    };
    let (gen, reuse) = match session.as_mut() {
        Some(s) => {
            let (g, r) = s
                .session
                .generate_spec(&bundle, &request, spec.as_ref(), on_step)?;
            s.save(&bundle)?;
            (g, Some(r))
        }
        None => (
            generate_spec(&bundle, &request, spec.as_ref(), on_step)?,
            None,
        ),
    };
    if !a.no_usage_save {
        super::usage::save(&dir, &bundle.model);
    }
    let residency = bundle.model.residency().map(|r| r.telemetry());
    if a.json {
        let mut out = json_output(&prompt_ids, &request, &gen, tok)?;
        if let Some(t) = &residency {
            out["stats"]["residency"] = residency_json(t, &bundle, budget);
        }
        if let Some(s) = &gen.spec {
            out["stats"]["mtp"] = serde_json::to_value(s)?;
        }
        if bundle.model.prefetch != Prefetch::Off {
            out["stats"]["prefetch"] = prefetch_json(&bundle, residency.as_ref());
        }
        // Where the prompt's and the decode's time went (docs/gpu.md, "Prefill and decode
        // phases"): seconds per phase of the layers' forwards of each kind, and `other`, the
        // rest of that kind's time.
        let model = &bundle.model;
        for (key, phases, wall) in [
            ("prefill_phases_s", model.prefill_phases(), gen.prefill),
            ("decode_phases_s", model.decode_phases(), gen.decode),
        ] {
            if phases.total() > 0.0 {
                let mut p = serde_json::to_value(phases)?;
                p["other"] = json!((wall.as_secs_f64() - phases.total()).max(0.0));
                out["stats"][key] = p;
            }
        }
        if let Some(p) = bundle.model.gpu_placement() {
            // Where the routed experts ran (docs/gpu.md): VRAM tier, copied from RAM, CPU.
            out["stats"]["gpu"] = json!({
                "summary": p.summary,
                "spine_host_released_bytes": p.host_released,
                "spine_host_kept_bytes": p.host_kept,
                "expert_runs": bundle.model.expert_runs(),
                "attention_rows": bundle.model.gpu_attention_rows(),
                "decode_attention_rows": bundle.model.gpu_decode_attention_rows(),
                "indexer_rows": bundle.model.gpu_indexer_rows(),
                "copy": bundle.model.copy_stats().map(|c| c.json()),
            });
        }
        if let (Some(s), Some(r)) = (&session, &reuse) {
            out["session"] = s.json(r, prompt_ids.len());
        }
        out["stats"]["rss_bytes"] = json!(nectar_residency::rss::rss_bytes());
        writeln!(stdout, "{out}")?;
    } else {
        writeln!(stdout)?;
        let seed = if request.params.is_greedy() {
            String::new()
        } else {
            format!(", seed {}", gen.seed)
        };
        eprintln!(
            "[{} at {:.1} tok/s, {} generated at {:.1} tok/s, finish: {}{}, {}, {}]",
            super::count(gen.prompt_tokens as u64, "prompt token", "prompt tokens"),
            gen.prefill_tok_s(),
            gen.tokens.len(),
            gen.decode_tok_s(),
            gen.finish.as_str(),
            seed,
            super::count(rayon::current_num_threads() as u64, "thread", "threads"),
            match nectar_kernels::int4_order() {
                "exact" => nectar_kernels::isa().to_string(),
                order => format!("{} (int4 {order})", nectar_kernels::isa()),
            }
        );
        if let Some(s) = gen.spec.as_ref().filter(|s| s.mode != "off") {
            eprintln!("{}", spec_summary(s));
        }
        if let (Some(s), Some(r)) = (&session, &reuse) {
            eprintln!("{}", s.summary(r, prompt_ids.len()));
        }
        if let (Some(t), Some(plan)) = (&residency, bundle.model.memory_plan()) {
            eprintln!(
                "[experts streamed: {} per layer, hit rate {:.1} %, {:.3} GB read from disk ({} reads), {:.2} s disk time, {:.2} s waiting]",
                plan.lru_words(),
                100.0 * t.hit_rate(),
                t.bytes_read as f64 / 1e9,
                t.reads,
                t.disk_seconds,
                t.wait_seconds
            );
        }
        // Look-ahead (and `both`) reads only under a budget (without one every expert is
        // mapped already).
        let lookahead_idle = bundle.model.prefetch.reads_repeated_contexts() && residency.is_none();
        if bundle.model.prefetch != Prefetch::Off && !lookahead_idle {
            eprintln!(
                "{}",
                prefetch_summary(
                    bundle.model.prefetch,
                    &bundle.model.pilot_stats(),
                    residency.as_ref()
                )
            );
        }
    }
    Ok(())
}

/// The speculation the flags ask for (`None`: plain decoding), checked.
fn speculation(a: &RunArgs) -> Result<Option<Speculation>> {
    // `on` drafts at the depth measured best on the demo model; `auto` and
    // prompt lookup (whose drafts cost nothing) search or draft up to the most.
    let depth = |default| a.draft_tokens.unwrap_or(default);
    let speculator = match (a.mtp, a.prompt_lookup) {
        (MtpMode::Off, None) => return Ok(None),
        (MtpMode::Off, Some(ngram)) => Speculator::PromptLookup {
            ngram,
            max_draft: depth(MAX_DRAFT),
        },
        (MtpMode::On, None) => Speculator::Mtp {
            gamma: depth(DEFAULT_DRAFT_TOKENS),
        },
        (MtpMode::Auto, None) => Speculator::Mtp {
            gamma: depth(MAX_DRAFT),
        },
        (_, Some(_)) => anyhow::bail!(
            "--prompt-lookup and --mtp on/auto both draft; a request has one drafter, choose one"
        ),
    };
    let spec = Speculation {
        speculator,
        auto: a.mtp == MtpMode::Auto,
    };
    spec.validate()?;
    Ok(Some(spec))
}

/// One stderr line on what speculation did, and the `auto` decision in force.
fn spec_summary(s: &SpecStats) -> String {
    let mut line = format!(
        "[{}{}: γ={}, drafted {}, accepted {} ({:.1} %), {:.2} tokens per forward, {} of {} forwards saved, {:.1} tok/s end to end",
        s.mode,
        if s.auto { " auto" } else { "" },
        s.gamma,
        s.drafted,
        s.accepted,
        100.0 * s.acceptance_rate,
        s.tokens_per_forward,
        s.forwards_saved,
        s.forwards_saved + s.main_forwards,
        s.tok_s
    );
    let u = &s.expert_union;
    if u.verify_steps > 0 {
        line += &format!(
            "; expert union per verify {:.1} vs {:.1} experts per layer without the drafts (×{:.2})",
            u.verify_experts_per_layer, u.verify_plain_experts_per_layer, u.growth
        );
    }
    if let Some(d) = s.decisions.last() {
        let path: Vec<String> = s
            .decisions
            .iter()
            .map(|d| format!("γ={}×{}", d.gamma, d.windows))
            .collect();
        line += &format!(
            "; auto (γ × windows held): {}; last decision {}",
            path.join(" → "),
            d.reason
        );
    }
    line + "]"
}

/// Prefetch figures: the next-layer prediction's recall (`measure`, `pilot`, `both`), and what
/// the prefetches did.
fn prefetch_json(bundle: &ModelBundle, t: Option<&Telemetry>) -> Value {
    let s = bundle.model.pilot_stats();
    let (issued, hits, dropped, cancelled) = prefetch_counts(t);
    if !bundle.model.prefetch.runs_router_early() {
        return json!({
            "mode": bundle.model.prefetch.as_str(),
            "issued": issued,
            "prefetch_hits": hits,
            "prefetch_dropped": dropped,
            "prefetch_cancelled": cancelled,
        });
    }
    let mut v = s.summary();
    v["mode"] = json!(bundle.model.prefetch.as_str());
    // With `both`, every read started ahead (look-ahead's and PILOT's; `issued` is PILOT's).
    v["read_ahead"] = json!(issued);
    v["prefetch_hits"] = json!(hits);
    v["prefetch_dropped"] = json!(dropped);
    v["prefetch_cancelled"] = json!(cancelled);
    v
}

/// Prefetches started ahead (cancelled ones excluded), used, dropped after their read and
/// cancelled before it, over every layer.
fn prefetch_counts(t: Option<&Telemetry>) -> (u64, u64, u64, u64) {
    t.map_or((0, 0, 0, 0), |t| {
        (
            t.layer_sum(|l| l.read_ahead()),
            t.layer_sum(|l| l.prefetch_hits),
            t.layer_sum(|l| l.prefetch_dropped),
            t.layer_sum(|l| l.prefetch_cancelled),
        )
    })
}

fn prefetch_summary(mode: Prefetch, s: &PilotStats, t: Option<&Telemetry>) -> String {
    let (issued, hits, dropped, cancelled) = prefetch_counts(t);
    if !mode.runs_router_early() {
        return format!(
            "[look-ahead prefetch: {issued} reads started ahead, {hits} used, {dropped} dropped, {cancelled} cancelled unread]"
        );
    }
    let also = match mode.reads_repeated_contexts() {
        true => format!(", with look-ahead's {issued} reads started ahead in all"),
        false => String::new(),
    };
    format!(
        "[next-layer prediction: recall {:.1} % ({} of {} chosen experts); {} prefetches issued{also}, {} used, {} dropped, {} cancelled unread]",
        100.0 * s.recall(),
        s.predicted_right,
        s.chosen,
        s.issued,
        hits,
        dropped,
        cancelled
    )
}

/// Residency figures for `--json`: hit rate, bytes read, occupancy and the plan.
fn residency_json(t: &Telemetry, bundle: &ModelBundle, budget: Option<u64>) -> Value {
    json!({
        "memory_budget": budget,
        "lru_per_layer": bundle.model.memory_plan().map(|p| p.lru_per_layer),
        "lru_extra_layers": bundle.model.memory_plan().map(|p| p.lru_extra_layers),
        "hit_rate": t.hit_rate(),
        // Expert requests (hits + misses) over all layers: ÷ main forwards ÷ MoE layers is the
        // per-layer expert union a forward needs (it grows with the rows of a verify).
        "requests": t.layers.iter().map(|l| l.hits + l.misses).sum::<u64>(),
        "gb_read": t.bytes_read as f64 / 1e9,
        "reads": t.reads,
        "read_errors": t.read_errors,
        "disk_seconds": t.disk_seconds,
        "wait_seconds": t.wait_seconds,
        "disk_busy_seconds": t.disk_busy_seconds,
        // The look-ahead controller's threshold and history (policy/control.rs).
        "lookahead": t.lookahead,
        "occupancy": t.occupancy,
        "rss_shrinks": t.rss_shrinks,
        "rss_regrows": t.rss_regrows,
        "released_bytes": t.released_bytes,
        "pinned": t.occupancy.pinned,
        "slab_bytes": bundle.model.residency().map(|r| r.slab_bytes()),
        // Direct reads into scattered 4 KiB pages were 2.3× slower than into huge pages.
        "slab_huge_page_bytes": bundle.model.residency().and_then(|r| r.slab_huge_page_bytes()),
        "mtp_tier": bundle.model.mtp_residency().map(|m| {
            let t = m.telemetry();
            json!({
                "slot_bytes": m.slot_bytes(),
                "hit_rate": t.hit_rate(),
                "requests": t.layers.iter().map(|l| l.hits + l.misses).sum::<u64>(),
                "gb_read": t.bytes_read as f64 / 1e9,
                "reads": t.reads,
            })
        }),
    })
}

/// The engine request the flags describe (validated by the engine).
/// Under a budget the memory plan reserved KV for `ctx` tokens (prompt + reply): a prompt that
/// fills it is refused, and the reply stops where the context ends (as `serve` clamps
/// `max_tokens`), so KV never outgrows the plan.
fn within_context(prompt: usize, max_tokens: usize, ctx: usize) -> Result<usize> {
    anyhow::ensure!(
        prompt < ctx,
        "the prompt has {prompt} tokens, but --ctx-size {ctx} (the context the memory plan \
         reserves KV for) leaves no room for a reply: raise --ctx-size"
    );
    let room = ctx - prompt;
    if max_tokens > room {
        eprintln!(
            "note: --max-tokens {max_tokens} runs past --ctx-size {ctx}; stopping after {room} \
             tokens (raise --ctx-size for more)"
        );
    }
    Ok(max_tokens.min(room))
}

fn request(a: &RunArgs, prompt_ids: Vec<u32>) -> Result<Request> {
    Ok(Request {
        prompt_ids,
        params: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repetition_penalty: a.repeat_penalty,
            repetition_window: a.repeat_last_n,
            presence_penalty: a.presence_penalty,
            frequency_penalty: a.frequency_penalty,
            logit_bias: a.logit_bias.iter().copied().collect(),
            seed: a.seed,
            logprobs: a.logprobs,
        },
        max_tokens: a.max_tokens,
        stop_strings: a.stop.clone(),
        extra_stop_ids: a.stop_id.clone(),
        grammar: super::grammar::spec(a)?,
    })
}

/// Truncation knobs and the seed do nothing at temperature 0; say so rather
/// than let a user believe they sampled.
fn warn_unused_knobs(p: &SamplingParams) {
    let d = SamplingParams::default();
    if p.is_greedy()
        && (p.top_k != d.top_k || p.top_p != d.top_p || p.min_p != d.min_p || p.seed.is_some())
    {
        eprintln!(
            "warning: --top-k, --top-p, --min-p and --seed have no effect at --temperature 0 (greedy)"
        );
    }
}

/// The `--json` object: `prompt_ids`, `tokens`, `text`, `finish_reason`, `stop_reason` (the
/// stop token id or string, else null), `seed` (when sampling), `logprobs` (when asked) and
/// `stats`.
fn json_output(
    prompt_ids: &[u32],
    request: &Request,
    gen: &Generation,
    tok: Option<&Tokenizer>,
) -> Result<Value> {
    let stop_reason = match &gen.stop {
        Some(StopCause::Token(id)) => json!(id),
        Some(StopCause::String(s)) => json!(s),
        // A complete grammar ends the output without a stop token or string.
        Some(StopCause::Grammar) | None => Value::Null,
    };
    let mut out = json!({
        "prompt_ids": prompt_ids,
        "tokens": gen.tokens,
        "text": gen.text,
        "finish_reason": gen.finish.as_str(),
        "stop_reason": stop_reason,
        "stats": {
            "prompt_tokens": gen.prompt_tokens,
            "generated_tokens": gen.tokens.len(),
            "forced_tokens": gen.forced_tokens,
            "prefill_tok_s": gen.prefill_tok_s(),
            "decode_tok_s": gen.decode_tok_s(),
            "prefill_s": gen.prefill.as_secs_f64(),
            "decode_s": gen.decode.as_secs_f64(),
            "threads": rayon::current_num_threads(),
            "isa": nectar_kernels::isa(),
            "int4_order": nectar_kernels::int4_order(),
        }
    });
    // The compute team's counts over the whole process (load, prefill and decode): regions run
    // in parallel and how often an idle worker parked and had to be woken.
    if let Some(t) = nectar_kernels::team::stats() {
        out["stats"]["team"] =
            json!({"threads": t.threads, "regions": t.regions, "parks": t.parks});
    }
    if !request.params.is_greedy() {
        out["seed"] = json!(gen.seed);
    }
    if request.params.logprobs.is_some() {
        let entries = gen
            .tokens
            .iter()
            .zip(&gen.logprobs)
            .map(|(&id, lp)| logprob_entry(id, lp, tok))
            .collect::<Result<Vec<_>>>()?;
        out["logprobs"] = Value::Array(entries);
    }
    Ok(out)
}

/// `{"id", "token" (its text, with a tokenizer), "logprob", "top_logprobs": [{"id", "token",
/// "logprob"}]}`, OpenAI's shape with ids added.
fn logprob_entry(id: u32, lp: &Logprobs, tok: Option<&Tokenizer>) -> Result<Value> {
    let one = |id: u32, logprob: f32| -> Result<Value> {
        let mut v = json!({"id": id, "logprob": logprob});
        if let Some(t) = tok {
            v["token"] = json!(t.decode(&[id], false)?);
        }
        Ok(v)
    };
    let mut v = one(id, lp.logprob)?;
    v["top_logprobs"] = Value::Array(
        lp.top
            .iter()
            .map(|&(i, l)| one(i, l))
            .collect::<Result<Vec<_>>>()?,
    );
    Ok(v)
}
