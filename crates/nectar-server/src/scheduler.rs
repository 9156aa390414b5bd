//! The model thread: loads the model, then serves the queue.
//!
//! One schedule, continuous batching: up to `parallel` requests live in one
//! `nectar_engine::Batch`; every step admits waiting requests while there is room, drops rows
//! whose client went away, and runs one forward over all live rows (so each routed expert is
//! read once per layer per step, whatever the number of rows that use it). With `--mtp on|auto`
//! every row speculates inside that step: the MTP head drafts for all rows in one forward per
//! depth and the main forward verifies every row's drafts beside the other rows' tokens (`auto`
//! chooses each row's depth, 0 included). Rows stream their deltas as they are produced and
//! leave when finished.
//!
//! A panic inside a step is a bug; it fails the requests of that step and nothing else: the
//! thread keeps serving.

use crate::backend::{
    engine_err, AutoChoice, CancelToken, EngineOptions, Failure, Finish, FinishReason, GenEvent,
    Job, LoadState, ModelInfo, Shared, TextSide, TokenLogprob, Usage, DEFAULT_CTX,
};
use crate::guard::MemoryGuard;
use nectar_engine::{
    Batch, BatchOptions, FinishReason as EngineFinish, ModelBundle, RowOptions, RowSummary,
    Speculation, Step, StopCause, Tokenizer, UsageLog, LEDGER_FILE,
};
use nectar_model::{NoObserver, SeqStep};
use serde_json::Value;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Weight of the newest step in the smoothed batch throughput.
const TOK_S_SMOOTHING: f64 = 0.1;

/// Opens the model directory, with experts streamed under a budget when one is given.
fn open_bundle(opts: &EngineOptions) -> Result<ModelBundle, String> {
    // A budget above what the process can have (a container's memory.max) is planned down.
    let budget = opts
        .memory_budget
        .map(nectar_engine::budget_for_this_process);
    // With a budget, the hottest experts of a usage ledger are pinned (by default the model
    // directory's, by the auto rule).
    let pin = match budget {
        Some(_) => {
            let (req, warning) = opts
                .pin
                .request(&opts.model_dir)
                .map_err(|e| e.to_string())?;
            if let Some(w) = warning {
                tracing::warn!(warning = %w, "not pinning");
            }
            req
        }
        None => None,
    };
    let load = nectar_model::arch::glm5::LoadOptions {
        pin,
        memory_budget: budget,
        ctx_size: opts.ctx_size.unwrap_or(DEFAULT_CTX),
        // The rows, and the conversations kept for continuing requests.
        sequences: nectar_model::arch::glm5::serve_sequences(opts.parallel),
        server: true,
        // `--mtp off` neither loads nor plans the MTP layer (its memory goes to the cache).
        mtp: matches!(
            opts.speculation,
            Some(Speculation {
                speculator: nectar_engine::Speculator::Mtp { .. },
                ..
            })
        ),
        gpu_memory: opts.gpu_memory,
        prefetch: opts.prefetch,
        io_threads: opts.io_threads,
        admission: opts.admission,
        ..Default::default()
    };
    ModelBundle::open_with(&opts.model_dir, &load).map_err(|e| e.to_string())
}

/// The speculation actually in force: `auto` without an MTP head falls back to plain decoding;
/// `on` without one is a load error.
fn resolve_speculation(opts: &EngineOptions, has_mtp: bool) -> Result<Option<Speculation>, String> {
    match opts.speculation {
        Some(s) if !has_mtp && s.auto => Ok(None),
        Some(_) if !has_mtp => Err("--mtp on, but the model has no MTP layer".into()),
        other => Ok(other),
    }
}

/// The model thread: load, publish the text side, then serve jobs until every handle is gone.
pub(crate) fn model_thread(
    opts: EngineOptions,
    id: String,
    shared: Arc<Shared>,
    rx: Receiver<Job>,
) {
    let t0 = Instant::now();
    // This thread becomes worker 0 of its own compute pool, so the kernels' parallel calls fork
    // from inside the pool instead of handing every matrix to another thread and parking (see
    // the CLI's main). The pool lives as long as the thread (rayon leaks such a pool's registry
    // by design; there is one per model thread).
    let _pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads.unwrap_or(0))
        .thread_name(|i| format!("nectar-compute-{i}"))
        .use_current_thread()
        .build()
    {
        Ok(p) => p,
        Err(e) => {
            let e = format!("cannot start the compute threads: {e}");
            shared.state.send_replace(LoadState::Failed(e));
            return;
        }
    };
    // ... and owns a compute team of as many threads (the forward's parallel regions run there;
    // see `nectar_kernels::team`). Dropped when the thread returns: its workers stop.
    let _team = match nectar_kernels::team::Team::start(_pool.current_num_threads()) {
        Ok(t) => t,
        Err(e) => {
            let e = format!("cannot start the compute threads: {e}");
            shared.state.send_replace(LoadState::Failed(e));
            return;
        }
    };
    let loaded = open_bundle(&opts).and_then(|b| {
        let spec = resolve_speculation(&opts, b.model.has_mtp())?;
        Ok((b, spec))
    });
    let (bundle, spec) = match loaded {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(model = %opts.model_dir.display(), error = %e, "model load failed");
            shared.state.send_replace(LoadState::Failed(e));
            return;
        }
    };
    let max_pos = bundle
        .model
        .cfg
        .raw
        .max_position_embeddings
        .unwrap_or(DEFAULT_CTX);
    let ctx = opts.ctx_size.unwrap_or(max_pos.min(DEFAULT_CTX));
    let mtp_tier = bundle.model.mtp_residency().cloned();
    // The next-layer prediction's quality where the router runs early (`pilot`, `both`).
    let pilot = bundle
        .model
        .prefetch
        .runs_router_early()
        .then(|| bundle.model.pilot_stats_source());
    let residency = bundle.model.residency().cloned().map(|r| {
        Box::new(move || {
            let mut v = serde_json::to_value(r.telemetry()).ok()?;
            if let Some(m) = &mtp_tier {
                v["mtp_tier"] = serde_json::to_value(m.telemetry()).ok()?;
            }
            if let Some(p) = &pilot {
                v["pilot"] = p().summary();
            }
            Some(v)
        }) as Box<dyn Fn() -> Option<Value> + Send + Sync>
    });
    let mtp = match spec {
        None => "off",
        Some(s) if s.auto => "auto",
        Some(_) => "on",
    };
    let side = TextSide {
        tokenizer: bundle.tokenizer.clone(),
        template: bundle.template.clone(),
        vocab_size: bundle.model.vocab_size(),
        stop_ids: bundle.stop_ids.clone(),
        info: ModelInfo {
            id,
            context_length: ctx,
            tokenizer: bundle.tokenizer.is_some(),
            chat_template: bundle.template.is_some(),
            mtp_head: bundle.model.has_mtp(),
            mtp: mtp.into(),
            parallel: opts.parallel.max(1),
            memory_budget: opts.memory_budget,
            prefetch: bundle.model.prefetch.as_str().into(),
            memory_plan: bundle
                .model
                .memory_plan()
                .and_then(|p| serde_json::to_value(p).ok()),
        },
        residency,
        gpu: gpu_stats(&bundle.model),
    };
    if let Some(g) = bundle.model.gpu_placement() {
        eprintln!("nectar serve: {}", g.summary);
    }
    // `set` fails only if already set, which cannot happen: this thread is the only writer.
    let _ = shared.text.set(side);
    let tiers = [
        ("main", bundle.model.residency()),
        ("mtp", bundle.model.mtp_residency()),
    ]
    .into_iter()
    .filter_map(|(name, r)| Some((name, r?.clone())))
    .collect();
    shared
        .observatory
        .init(&bundle.model.expert_usage(), tiers, opts.memory_budget);
    if let Some(g) = bundle.model.gpu_placement() {
        let vram = g
            .vram_experts
            .iter()
            .flat_map(|(l, ids, _)| ids.iter().map(move |&e| (*l as u32, e)));
        shared.observatory.set_vram(vram.collect());
    }
    shared.state.send_replace(LoadState::Ready);
    tracing::info!(
        model = %opts.model_dir.display(),
        ctx,
        parallel = opts.parallel,
        mtp,
        seconds = t0.elapsed().as_secs_f64(),
        "model loaded"
    );
    let mut usage = Ledger::new(&bundle);
    let mut guard = MemoryGuard::new(&bundle, opts.memory_budget);
    serve_batched(
        &bundle,
        Schedule {
            parallel: opts.parallel.max(1),
            ctx,
            spec,
        },
        &shared,
        &rx,
        &mut usage,
        &mut guard,
    );
    usage.close(&bundle);
}

/// How often finished requests' expert selections are added to the usage ledger.
const USAGE_FLUSH: Duration = Duration::from_secs(10);

/// What the load put in VRAM, for `/stats` and `/metrics`.
fn gpu_stats(model: &nectar_model::Glm5) -> crate::backend::GpuStats {
    let Some(g) = model.gpu_placement() else {
        return Default::default();
    };
    crate::backend::GpuStats {
        summary: Some(g.summary.clone()),
        vram_bytes: g.bytes,
        matrices: g.matrices,
        left_on_cpu: g.left_on_cpu,
        spine_host_released: g.host_released,
        vram_experts: g.experts_in_vram(),
        vram_experts_per_layer: g
            .vram_experts
            .iter()
            .map(|(l, ids, of)| (*l, ids.len(), *of))
            .collect(),
        ..Default::default()
    }
}

/// Records the model's expert runs since load, the last step's share, and the copy totals.
fn count_expert_runs(n: &crate::backend::Counters, model: &nectar_model::Glm5) {
    let r = model.expert_runs();
    if let Some(c) = model.copy_stats() {
        *n.copy.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
    }
    for (i, now) in [r.vram, r.copied, r.cpu].into_iter().enumerate() {
        let before = n.expert_runs[i].swap(now, Ordering::Relaxed);
        n.last_step_runs[i].store(now.saturating_sub(before), Ordering::Relaxed);
    }
}

/// Cumulative expert selection counts per layer (`Glm5::expert_usage`).
type Counts = Vec<(usize, Vec<u64>)>;

/// The model directory's usage ledger, updated at most every [`USAGE_FLUSH`] and at exit. The
/// model thread only copies the selection counts; a writer thread reads, merges and writes the
/// file (an fsync'd atomic write), so a slow disk never stalls decoding.
struct Ledger {
    tx: Option<std::sync::mpsc::Sender<Counts>>,
    writer: Option<std::thread::JoinHandle<()>>,
    last: Instant,
}

impl Ledger {
    fn new(bundle: &ModelBundle) -> Ledger {
        let mut log = UsageLog::new(&bundle.model, bundle.dir.join(LEDGER_FILE));
        let (tx, rx) = std::sync::mpsc::channel::<Counts>();
        let writer = std::thread::Builder::new()
            .name("nectar-ledger".into())
            .spawn(move || {
                while let Ok(mut counts) = rx.recv() {
                    // Counts are cumulative: only the newest snapshot waiting matters.
                    while let Ok(newer) = rx.try_recv() {
                        counts = newer;
                    }
                    // The ledger is derived state: a failure is logged, never served.
                    if let Err(e) = log.flush_counts(counts) {
                        tracing::warn!(error = %e, "usage ledger not updated");
                    }
                }
            })
            .map_err(
                |e| tracing::warn!(error = %e, "no usage ledger writer: the ledger is not kept"),
            )
            .ok();
        Ledger {
            tx: writer.as_ref().map(|_| tx),
            writer,
            last: Instant::now(),
        }
    }

    /// Flushes when the interval has passed.
    fn tick(&mut self, bundle: &ModelBundle) {
        if self.last.elapsed() >= USAGE_FLUSH {
            self.flush(bundle);
        }
    }

    /// Hands the writer a snapshot of the counts.
    fn flush(&mut self, bundle: &ModelBundle) {
        self.last = Instant::now();
        if let Some(tx) = &self.tx {
            let _ = tx.send(bundle.model.expert_usage());
        }
    }

    /// The last flush, written before this returns.
    fn close(mut self, bundle: &ModelBundle) {
        self.flush(bundle);
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Sequences whose memory the plan must hold now: the rows, and the kept conversations (one
/// sequence's worth at most, `keep_tokens` = the context) while any is kept. A chat client that
/// continues its conversation takes it out of the store, so alone it holds one sequence.
fn sequences_in_use(rows: usize, kept_tokens: usize) -> usize {
    (rows + usize::from(kept_tokens > 0)).max(1)
}

/// Pins swapped at most per finished turn (the seed's live-repin rule).
const REPIN_SWAPS: usize = 4;

/// A turn ended (the model thread is between steps, so no expert lease is alive): let a
/// clearly hotter resident expert take a pinned slot of its layer (see `Policy::repin`).
fn repin(bundle: &ModelBundle) {
    if let Some(res) = bundle.model.residency() {
        let swaps = res.repin(REPIN_SWAPS);
        if !swaps.is_empty() {
            tracing::debug!(?swaps, "repinned experts (promoted, demoted)");
        }
    }
}

/// How often an idle model thread lets the memory guard look (another process may take the
/// memory while no request runs).
const IDLE_GUARD: Duration = Duration::from_millis(100);

/// Waits for the next job, running the memory guard while idle (a safe point: no step runs).
fn recv_idle(
    rx: &Receiver<Job>,
    guard: &mut MemoryGuard,
    bundle: &ModelBundle,
    shared: &Shared,
) -> Result<Job, RecvTimeoutError> {
    loop {
        if shared.closing.load(Ordering::SeqCst) {
            return Err(RecvTimeoutError::Disconnected);
        }
        match rx.recv_timeout(IDLE_GUARD) {
            Err(RecvTimeoutError::Timeout) => {
                // Nothing to fail while idle: a request arriving later meets the same check.
                let _ = guard.check(bundle);
            }
            other => return other,
        }
    }
}

/// A live row's connection to its client.
struct Client {
    cancel: CancelToken,
    sink: UnboundedSender<GenEvent>,
}

/// How the batch runs: its rows, the tokens kept for continuing conversations, every row's
/// speculation.
struct Schedule {
    parallel: usize,
    ctx: usize,
    spec: Option<Speculation>,
}

/// Continuous batching (see the module docs).
fn serve_batched(
    bundle: &ModelBundle,
    sched: Schedule,
    shared: &Shared,
    rx: &Receiver<Job>,
    usage: &mut Ledger,
    guard: &mut MemoryGuard,
) {
    let model = &bundle.model;
    let tok = bundle.tokenizer.as_ref();
    let n = &shared.n;
    // Finished conversations are kept up to one context's worth of tokens (the memory plan
    // reserves one sequence beyond the rows for them).
    // A joining prompt runs layer-major in spans of what the memory plan holds activations for.
    let mut batch = Batch::new(BatchOptions {
        max_rows: sched.parallel,
        keep_tokens: sched.ctx,
        prefill_span: model.prefill_span(),
        ..BatchOptions::default()
    });
    let mut clients: HashMap<u64, Client> = HashMap::new();
    let mut next_id = 0u64;
    let mut tok_s = 0.0f64;
    loop {
        // Admit: block for work when idle; otherwise take whatever waits, up to the room left.
        let mut closed = false;
        while batch.has_room() {
            let job = if batch.is_empty() {
                recv_idle(rx, guard, bundle, shared).map_err(|_| TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            match job {
                Ok(job) => {
                    shared.queued.fetch_sub(1, Ordering::SeqCst);
                    if batch.is_empty() {
                        // The model was idle: a new turn of the expert map's hits.
                        shared.observatory.turn_start();
                    }
                    let id = next_id;
                    next_id += 1;
                    admit(
                        bundle,
                        &mut batch,
                        &mut clients,
                        (id, sched.spec),
                        job,
                        shared,
                    );
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if shared.closing.load(Ordering::SeqCst) {
            // Shutting down after the drain period: the rows still running end here.
            for id in batch.clear() {
                if let Some(c) = clients.remove(&id) {
                    n.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = c.sink.send(GenEvent::Error(Failure::internal(
                        "the server is shutting down",
                    )));
                }
            }
            return;
        }
        if closed && batch.is_empty() {
            return;
        }
        // Rows whose client went away leave before the step.
        let gone: Vec<u64> = clients
            .iter()
            .filter(|(_, c)| c.cancel.is_cancelled() || c.sink.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let (Some(s), Some(c)) = (batch.remove(id), clients.remove(&id)) {
                n.cancelled.fetch_add(1, Ordering::Relaxed);
                finish_row(shared, &c, FinishReason::Cancelled, &s);
            }
        }
        n.active.store(batch.len(), Ordering::SeqCst);
        if batch.is_empty() {
            continue;
        }
        // Between steps no expert lease is alive: the safe point where the memory plan follows
        // the sequences in use (an idle row's KV and activations, and between prompts the
        // prompt transients and the bank's spare slots, lent to the expert cache; taken back
        // before a joining row's or prompt's first step) and the memory guard looks.
        let in_use = sequences_in_use(batch.len(), batch.kept().tokens);
        let planned = model
            .use_sequences(in_use, batch.prefilling())
            .map(drop)
            .map_err(nectar_engine::Error::Model);
        let outcome = match planned.and_then(|()| guard.check(bundle)) {
            Ok(()) => catch_unwind(AssertUnwindSafe(|| batch.step(model, tok))),
            Err(e) => Ok(Err(e)),
        };
        let report = match outcome {
            Ok(Ok(r)) => r,
            failed => {
                let failure = match failed {
                    Ok(Err(e)) => Failure::of_engine(&e),
                    _ => Failure::internal("generation panicked"),
                };
                tracing::error!(error = %failure.cause, rows = batch.len(), "batched step failed");
                // The step's caches may be half-written: every row in it fails; later
                // requests start clean.
                for id in batch.clear() {
                    if let Some(c) = clients.remove(&id) {
                        n.failed.fetch_add(1, Ordering::Relaxed);
                        let _ = c.sink.send(GenEvent::Error(failure.clone()));
                    }
                }
                n.active.store(0, Ordering::SeqCst);
                continue;
            }
        };
        shared.observatory.step(&model.expert_usage());
        count_expert_runs(n, model);
        n.batch_steps.fetch_add(1, Ordering::Relaxed);
        n.batch_rows
            .fetch_add(report.batch_rows as u64, Ordering::Relaxed);
        n.busy_nanos
            .fetch_add(report.elapsed.as_nanos() as u64, Ordering::Relaxed);
        if report.spec_rows > 0 {
            n.mtp_forwards.fetch_add(1, Ordering::Relaxed);
            n.mtp_drafted
                .fetch_add(report.drafted as u64, Ordering::Relaxed);
            n.mtp_accepted
                .fetch_add(report.accepted as u64, Ordering::Relaxed);
            n.mtp_rows
                .fetch_add(report.spec_rows as u64, Ordering::Relaxed);
            n.mtp_speculating
                .fetch_add(report.speculating as u64, Ordering::Relaxed);
            n.mtp_gamma
                .fetch_add(report.gamma_sum as u64, Ordering::Relaxed);
        }
        if let Some(a) = batch.auto() {
            let choices = a
                .choices()
                .into_iter()
                .map(|(s, gamma)| AutoChoice {
                    rows: s.rows,
                    auto_rows: s.auto_rows,
                    gamma,
                })
                .collect();
            *n.auto.lock().unwrap_or_else(|e| e.into_inner()) = (a.logged() as u64, choices);
        }
        if let Some(u) = &report.union {
            n.expert_union
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(u);
        }
        n.generated_tokens
            .fetch_add(report.rows.len() as u64, Ordering::Relaxed);
        if !report.rows.is_empty() {
            let now = report.rows.len() as f64 / report.elapsed.as_secs_f64().max(1e-9);
            tok_s = if tok_s == 0.0 {
                now
            } else {
                tok_s + TOK_S_SMOOTHING * (now - tok_s)
            };
            n.batch_tok_s_bits.store(tok_s.to_bits(), Ordering::Relaxed);
        }
        for rs in report.rows {
            let Some(c) = clients.get(&rs.id) else {
                continue;
            };
            let delivered = send_step(bundle, &c.sink, &rs.step);
            if let (Some(summary), Some(c)) = (rs.summary, clients.get(&rs.id)) {
                let reason = finish_reason(summary.finish, summary.stop.clone());
                finish_row(shared, c, reason, &summary);
                clients.remove(&rs.id);
                usage.tick(bundle);
                repin(bundle);
            } else if !delivered {
                // The client is gone: the row leaves at the top of the next step.
                c.cancel.cancel();
            }
        }
        n.active.store(batch.len(), Ordering::SeqCst);
        let kept = batch.kept();
        n.sessions.store(kept.sessions, Ordering::Relaxed);
        n.session_tokens.store(kept.tokens, Ordering::Relaxed);
        n.session_hits.store(kept.hits, Ordering::Relaxed);
        n.session_reused
            .store(kept.reused_tokens, Ordering::Relaxed);
    }
}

/// Puts a job into the batch as row `id` speculating with `spec`, or answers it at once
/// (cancelled while queued, or refused).
fn admit(
    bundle: &ModelBundle,
    batch: &mut Batch,
    clients: &mut HashMap<u64, Client>,
    (id, spec): (u64, Option<Speculation>),
    job: Job,
    shared: &Shared,
) {
    let n = &shared.n;
    let prompt_tokens = job.request.prompt_ids.len();
    if job.cancel.is_cancelled() {
        // The client left while the request was queued: skip the work.
        n.completed.fetch_add(1, Ordering::Relaxed);
        n.cancelled.fetch_add(1, Ordering::Relaxed);
        let _ = job.sink.send(GenEvent::Finish(Finish {
            reason: FinishReason::Cancelled,
            usage: Usage {
                prompt_tokens,
                completion_tokens: 0,
            },
            decode_tok_s: 0.0,
        }));
        return;
    }
    if let Err(cause) = send_prompt_logprobs(bundle, &job) {
        n.failed.fetch_add(1, Ordering::Relaxed);
        let _ = job.sink.send(GenEvent::Error(cause));
        return;
    }
    let admitted = catch_unwind(AssertUnwindSafe(|| {
        let opts = RowOptions {
            speculation: spec,
            ..RowOptions::default()
        };
        batch.admit_row(&bundle.model, id, job.state, opts)
    }));
    match admitted {
        Ok(Ok(())) => {
            n.prompt_tokens
                .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
            clients.insert(
                id,
                Client {
                    cancel: job.cancel,
                    sink: job.sink,
                },
            );
        }
        refused => {
            // The HTTP side validated the request already; this is a bug or a race.
            let cause = match refused {
                Ok(Err(e)) => engine_err(e).to_string(),
                _ => "admission panicked".into(),
            };
            n.failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.sink.send(GenEvent::Error(Failure::internal(cause)));
        }
    }
}

/// When the request asked for the prompt's logprobs (`echo` with `logprobs`), runs the prompt
/// once more through a fresh cache, keeping every position's logits (one row at a time, so
/// memory is one vocabulary row), and sends them before any output.
fn send_prompt_logprobs(bundle: &ModelBundle, job: &Job) -> Result<(), Failure> {
    let Some(top) = job.prompt_logprobs else {
        return Ok(());
    };
    let ids = &job.request.prompt_ids;
    let Some(&first) = ids.first() else {
        return Ok(());
    };
    let tok = bundle.tokenizer.as_ref();
    let temperature = job.request.params.temperature;
    let failed = |e: nectar_model::Error| Failure::of_engine(&nectar_engine::Error::Model(e));
    let run = || -> Result<Vec<TokenLogprob>, Failure> {
        let model = &bundle.model;
        let mut cache = model.new_cache();
        let hidden = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: ids,
                }],
                &mut NoObserver,
            )
            .map_err(failed)?;
        let d = hidden.len() / ids.len();
        // Position i predicts token i + 1.
        (0..ids.len() - 1)
            .map(|i| {
                let logits = model.logits(&hidden[i * d..(i + 1) * d]).map_err(failed)?;
                let lp = nectar_engine::logprobs(&logits, temperature, ids[i + 1], top);
                Ok(token_logprob(tok, ids[i + 1], &lp))
            })
            .collect()
    };
    let rest = catch_unwind(AssertUnwindSafe(run))
        .unwrap_or_else(|_| Err(Failure::internal("prompt logprobs panicked")))?;
    let text = tok
        .and_then(|t| t.decode(&[first], false).ok())
        .unwrap_or_default();
    let _ = job.sink.send(GenEvent::Prompt {
        first: (first, text),
        rest,
    });
    Ok(())
}

/// Sends a row's last event and counts it.
fn finish_row(shared: &Shared, c: &Client, reason: FinishReason, s: &RowSummary) {
    let n = &shared.n;
    n.completed.fetch_add(1, Ordering::Relaxed);
    let tok_s = s.decode_tok_s();
    n.last_tok_s_bits.store(tok_s.to_bits(), Ordering::Relaxed);
    let _ = c.sink.send(GenEvent::Finish(Finish {
        reason,
        usage: Usage {
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.generated,
        },
        decode_tok_s: tok_s,
    }));
}

/// The protocol-neutral finish of an engine finish and its stop cause.
fn finish_reason(finish: Option<EngineFinish>, stop: Option<StopCause>) -> FinishReason {
    match (finish, stop) {
        (Some(EngineFinish::Stop), Some(StopCause::String(s))) => FinishReason::StopString(s),
        // A stop id, or the grammar completing: the model's turn ended.
        (Some(EngineFinish::Length), _) => FinishReason::Length,
        (Some(EngineFinish::Cancelled), _) => FinishReason::Cancelled,
        _ => FinishReason::Stop,
    }
}

/// Streams one step's output to its client; `false` when the client is gone.
fn send_step(bundle: &ModelBundle, sink: &UnboundedSender<GenEvent>, step: &Step) -> bool {
    let tok = bundle.tokenizer.as_ref();
    // A model stop id ends the turn; it is counted in usage but is not output.
    let output = !(step.finished.is_some() && bundle.stop_ids.contains(&step.token));
    let ids = if output { vec![step.token] } else { vec![] };
    let logprobs = match (&step.logprobs, output) {
        (Some(lp), true) => vec![token_logprob(tok, step.token, lp)],
        _ => vec![],
    };
    if ids.is_empty() && step.text.is_empty() {
        return !sink.is_closed();
    }
    sink.send(GenEvent::Delta {
        ids,
        text: step.text.clone(),
        logprobs,
    })
    .is_ok()
}

/// A token's logprobs with text (each id decoded alone, special tokens kept).
fn token_logprob(tok: Option<&Tokenizer>, id: u32, lp: &nectar_engine::Logprobs) -> TokenLogprob {
    let text = |id: u32| {
        tok.and_then(|t| t.decode(&[id], false).ok())
            .unwrap_or_default()
    };
    TokenLogprob {
        id,
        token: text(id),
        logprob: lp.logprob,
        top: lp.top.iter().map(|&(i, l)| (i, text(i), l)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::sequences_in_use;

    /// A lone row with nothing kept holds one sequence (the kept conversation's share is
    /// lent); a kept conversation counts as one more however many it holds; never below one.
    #[test]
    fn the_kept_conversations_count_only_while_kept() {
        assert_eq!(sequences_in_use(1, 0), 1);
        assert_eq!(sequences_in_use(1, 900), 2);
        assert_eq!(sequences_in_use(4, 4096), 5);
        assert_eq!(sequences_in_use(0, 0), 1);
    }
}
