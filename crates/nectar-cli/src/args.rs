//! Command-line flags: declared once here, with their defaults and help text.
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// MTP draft acceptance the route256 model measured: the default of every projection.
pub const DEFAULT_ACCEPTANCE: f64 = 0.686;

/// Nectar: a runtime for giant mixture-of-experts LLMs (GLM-5.x) on small-RAM machines.
#[derive(Debug, Parser)]
#[command(name = "nectar", version, about)]
pub struct Cli {
    /// Compute threads (default: all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// Force a kernel path (scalar, avx2, avx512, neon) for measurement; every path computes
    /// the same bits. Default: the fastest this CPU supports.
    #[arg(long, global = true)]
    pub isa: Option<String>,
    /// How int4 products run on the CPU: `exact` (default: each weight dequantised to f32, the
    /// canonical order, bit-identical on every path) or `digits` (opt-in: exact integer dot
    /// products over activations split into three 8-bit digits per 64 columns, on AVX2 or
    /// AVX-512 VNNI; f32-level accuracy, different bits; faster at one or two rows, slower at
    /// four or more — docs/performance.md).
    #[arg(long, global = true, default_value = "exact", value_parser = ["exact", "digits"])]
    pub int4_order: String,
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json` (one object per
    /// line, for machines). Level: `NECTAR_LOG` (default `warn`; `serve`: request lines at info).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// Parsed once per process: the size of the largest variant (`run`'s many
// flags) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text (greedy by default). Without --model, uses the built-in demo model.
    Run(RunArgs),
    /// Print logits (and optionally MTP drafts, router and indexer choices) as JSON.
    Logits(LogitsArgs),
    /// Convert a Hugging Face checkpoint (FP8/BF16/F16/F32) into a Colibri-layout container.
    Convert(ConvertArgs),
    /// Describe a model directory: config, tensor inventory by class, bytes per class/expert.
    Inspect(InspectArgs),
    /// Check a model directory: headers, the safetensors index and, when `nectar convert` wrote a
    /// manifest, every tensor's dtype, shape and SHA-256.
    Verify(VerifyArgs),
    /// Measure throughput against this machine's limits (`nectar bench kernels`).
    Bench(BenchArgs),
    /// Print the memory equation for a model and a budget, and the expert cache it buys.
    Fit(FitArgs),
    /// Write a synthetic container with GLM-5.2's real expert geometry (for I/O benchmarks).
    Synth(SynthArgs),
    /// Serve the OpenAI and Anthropic HTTP APIs. Without --model, serves the built-in demo model.
    Serve(ServeArgs),
    /// The expert Atlas: which routed experts each prompt domain uses (`probe`), and what that
    /// says per expert, validated leave-one-prompt-out (`analyze`).
    Atlas(AtlasArgs),
    /// Check this machine and a model directory, and say what to fix before a run.
    Doctor(DoctorArgs),
}

/// `nectar atlas`.
#[derive(Debug, Args)]
pub struct AtlasArgs {
    #[command(subcommand)]
    pub what: AtlasWhat,
}

/// What `nectar atlas` does.
#[derive(Debug, Subcommand)]
pub enum AtlasWhat {
    /// Run every prompt of a JSONL file with a fresh cache and record the router's true top-k
    /// selections per token: one usage file per prompt (`<category>_<idx>.txt`) and `probe.json`.
    Probe(AtlasProbeArgs),
    /// Turn a probe directory into `experts.json` (per expert: p(category | expert),
    /// specialisation, lift, reliability) and `atlas.json` (provenance and validation).
    Analyze(AtlasAnalyzeArgs),
}

/// `nectar atlas probe`.
#[derive(Debug, Args)]
pub struct AtlasProbeArgs {
    /// Model directory. Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompts, one JSON object per line: `{"domain": NAME, "text": ...}` (`category` is
    /// accepted for `domain`). Default: the model directory's `atlas-prompts.jsonl`.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Output directory (created; existing usage files in it are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Greedy tokens generated after each prompt (stops early at an end token).
    #[arg(long, default_value_t = 32)]
    pub generate: usize,
    /// Which tokens' selections count: `prompt`, `generated` or `both`.
    #[arg(long, default_value = "both", value_parser = ["prompt", "generated", "both"])]
    pub tokens: String,
    /// Probe at most this many prompts per category (in file order). Default: all.
    #[arg(long)]
    pub per_category: Option<usize>,
    /// Stream routed experts under this memory budget (as `nectar run --memory-budget`);
    /// default: every expert resident. Routing is the same either way.
    #[arg(long)]
    pub memory_budget: Option<String>,
}

/// `nectar atlas analyze`.
#[derive(Debug, Args)]
pub struct AtlasAnalyzeArgs {
    /// A probe directory: `<category>_<idx>.txt` usage files (Colibri's STATS format), with
    /// `probe.json` when `nectar atlas probe` wrote it.
    #[arg(long)]
    pub stats: PathBuf,
    /// Output directory for `experts.json` and `atlas.json` (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Experts selected fewer times than this over all prompts are dropped as sparse.
    #[arg(long, default_value_t = 30)]
    pub min_count: u64,
    /// An affinity counts only if it holds in at least this many prompts of its category.
    #[arg(long, default_value_t = 2)]
    pub min_runs: usize,
    /// Specialisation (1 − H/ln C) at or above which a replicated expert is a specialist.
    #[arg(long, default_value_t = 0.5)]
    pub strong: f64,
}

/// `nectar doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Model directory to check (inventory, formats, memory plan, disk speed, projection).
    /// Default: the machine only.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Budget to plan for (e.g. 24G). Default: 90 % of the usable memory (the smaller of
    /// MemAvailable and the cgroup's headroom).
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// Context length the plan reserves KV for.
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    pub ctx_size: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// How a memory budget's expert cache runs (`nectar run` and `nectar serve`).
#[derive(Debug, Args)]
pub struct ExpertCacheArgs {
    /// I/O threads reading experts (with --memory-budget).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub io_threads: usize,
    /// Next-layer expert prediction: `off`; `measure` (route the next layer from this layer's
    /// post-attention state and report recall, reading nothing); `pilot` (also prefetch the
    /// predicted experts into their own slots, with --memory-budget); `lookahead` (with
    /// --memory-budget and predictive admission: read each step's misses predicted from the last
    /// time this token context occurred before their layers run, into spare working slots; a
    /// step that batches several sequences, as `serve` does, reads each one's, the expert
    /// cache keeping their token histories apart); `both` (`lookahead` and `pilot` together,
    /// PILOT's slots kept for its next-layer reads). Default `both` (replayed at GLM-5.2's
    /// expert size it read 0.43–0.50 of the misses ahead, look-ahead alone 0.08–0.27; on one
    /// conversation it was level with PILOT and ahead of look-ahead in seven of eight runs; two
    /// requests decoded together 1.03–1.08× look-ahead at 13–14 slots a layer, level at 43–44:
    /// `benchmarks/RESULTS.md`). Never changes the output.
    #[arg(long, default_value = "both", value_parser = ["off", "measure", "pilot", "lookahead", "both"])]
    pub prefetch: String,
    /// What a full layer keeps (with --memory-budget): `predictive` (the residents and misses
    /// with the highest predicted value: decayed frequency, a look-ahead from the last time
    /// this token context occurred, learned expert transitions), `frequency` (only a miss whose
    /// decayed request count beats the weakest resident's; half-life 64 tokens) or `lru`.
    #[arg(long, default_value = "predictive", value_parser = ["predictive", "frequency", "lru"])]
    pub admission: String,
    /// Pinned experts (with --memory-budget): `auto` pins the most used experts of the model
    /// directory's usage ledger (`.coli_usage`) by Colibri's auto rule, `off` pins none, a FILE
    /// names a ledger to pin from (trusted even if another engine wrote it).
    #[arg(long, default_value = "auto")]
    pub pin: String,
    /// Bytes of pinned experts (e.g. 10G) instead of the auto rule.
    #[arg(long)]
    pub pin_size: Option<String>,
}

/// `nectar run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model directory (Hugging Face `glm_moe_dsa` layout). Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Hard memory budget (e.g. 24G): routed experts stream from disk through a bounded cache
    /// (see `nectar fit`). Default: every expert resident (memory-mapped).
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// VRAM for weights on the GPU (a build with `--features cuda`): a size (16G), `auto` (90 %
    /// of the free VRAM; the default with the CUDA tier) or `off`. Attention, dense, router and
    /// shared-expert matrices first, then the LM heads, then routed experts (the most used
    /// first) as far as they fit, run there (docs/gpu.md). Without a usable GPU, Nectar says
    /// why and runs on the CPU.
    #[arg(long, value_name = "SIZE|auto|off")]
    pub gpu_memory: Option<String>,
    /// Context length (prompt + reply) the memory plan reserves KV for (with --memory-budget:
    /// a prompt that fills it is refused, a reply stops where it ends).
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    pub ctx_size: usize,
    #[command(flatten)]
    pub cache: ExpertCacheArgs,
    /// Do not add this run's expert selections to the model directory's `.coli_usage`.
    #[arg(long)]
    pub no_usage_save: bool,
    /// Session file: restored (identity-checked) when it exists, the prompt's common prefix
    /// with it reused, and saved back crash-safely with the prompt and output.
    #[arg(long, value_name = "FILE", help_heading = "Session")]
    pub session: Option<PathBuf>,
    /// Session file format: by the file name (`*.coli_kv`, `*.coli_kv.N`: Colibri), `nectar`
    /// or `coli-kv`.
    #[arg(long, value_enum, default_value_t = SessionFormatArg::Auto, help_heading = "Session")]
    pub session_format: SessionFormatArg,
    /// Prompt text (default: a short sample prompt).
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids instead of text (no tokenizer needed).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Wrap the prompt as one user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object (prompt_ids, tokens, text, stats) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Sampling temperature; 0 (the default) is greedy decoding.
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, value_name = "K", default_value_t = 0, help_heading = "Sampling")]
    pub top_k: usize,
    /// Nucleus sampling: keep the most likely tokens until their probability reaches P (1 = off).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub top_p: f32,
    /// Keep tokens at least P times as likely as the most likely one (0 = off).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub min_p: f32,
    /// Repetition penalty over prompt and output: positive logits divided, negative multiplied (1 = off).
    #[arg(
        long,
        default_value_t = 1.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub repeat_penalty: f32,
    /// Apply --repeat-penalty to the last N tokens only (default: the whole prompt and output).
    #[arg(long, value_name = "N", help_heading = "Sampling")]
    pub repeat_last_n: Option<usize>,
    /// Subtract this from the logit of every token already generated, in [-2, 2] (0 = off).
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub presence_penalty: f32,
    /// Subtract this times its count from a generated token's logit, in [-2, 2] (0 = off).
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub frequency_penalty: f32,
    /// Add BIAS to token ID's logit, e.g. 42=-100 (repeatable).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias, help_heading = "Sampling")]
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed for sampling: the same seed gives the same output (default: random, reported).
    #[arg(long, help_heading = "Sampling")]
    pub seed: Option<u64>,
    /// Stop when STRING appears in the output, which ends before it (repeatable).
    #[arg(long, value_name = "STRING", help_heading = "Stopping")]
    pub stop: Vec<String>,
    /// Also stop at token ID, besides the model's end-of-sequence ids (repeatable).
    #[arg(long, value_name = "ID", help_heading = "Stopping")]
    pub stop_id: Vec<u32>,
    /// With --json: add each token's logprob and its N most likely alternatives (0-20).
    #[arg(long, value_name = "N", requires = "json")]
    pub logprobs: Option<usize>,
    /// Speculative decoding with the model's MTP head: off, on, or auto (draft only while it
    /// measurably pays; the decisions are reported). Output is unchanged either way.
    #[arg(long, value_enum, default_value_t = MtpMode::Off, help_heading = "Speculation")]
    pub mtp: MtpMode,
    /// Drafts per round (1-3), with --mtp on/auto or --prompt-lookup; the maximum for auto.
    /// Default: 1 for --mtp on (measured on the demo model), 3 for auto and --prompt-lookup.
    #[arg(long, value_name = "N", help_heading = "Speculation")]
    pub draft_tokens: Option<usize>,
    /// Prompt-lookup drafts (model-free): propose what followed the latest earlier occurrence of
    /// the last N tokens. Not with --mtp on/auto.
    #[arg(long, value_name = "N", help_heading = "Speculation")]
    pub prompt_lookup: Option<usize>,
    /// Structured output: the text is a JSON document valid against the JSON Schema in FILE.
    #[arg(long, value_name = "FILE", help_heading = "Structured output",
          conflicts_with_all = ["json_object", "regex", "grammar"])]
    pub json_schema: Option<PathBuf>,
    /// Structured output: the text is a JSON object.
    #[arg(long, help_heading = "Structured output", conflicts_with_all = ["regex", "grammar"])]
    pub json_object: bool,
    /// Structured output: the text fully matches PATTERN.
    #[arg(
        long,
        value_name = "PATTERN",
        help_heading = "Structured output",
        conflicts_with = "grammar"
    )]
    pub regex: Option<String>,
    /// Structured output: the text is in the language of the Lark grammar in FILE.
    #[arg(long, value_name = "FILE", help_heading = "Structured output")]
    pub grammar: Option<PathBuf>,
}

/// `nectar run --session-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SessionFormatArg {
    /// `.coli_kv` for `*.coli_kv` and `*.coli_kv.N`, else Nectar's format.
    Auto,
    /// Nectar's session format (every cache, model identity, checksum).
    Nectar,
    /// Colibri's `.coli_kv` v1 (main caches; identity in a `.nectar-id` sidecar).
    ColiKv,
}

/// `nectar run --mtp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MtpMode {
    /// Plain decoding.
    Off,
    /// Draft --draft-tokens tokens every round.
    On,
    /// Choose the depth (0 to --draft-tokens) from measured acceptance and cost.
    Auto,
}

/// A number `ok` accepts (`what` says which in the error).
fn number(s: &str, ok: fn(f64) -> bool, what: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if ok(v) => Ok(v),
        Ok(_) => Err(format!("`{s}` must be {what}")),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

/// A rate or speed: finite and above zero (a projection divides by it).
fn positive(s: &str) -> Result<f64, String> {
    number(s, |v| v.is_finite() && v > 0.0, "a finite number above 0")
}

/// A cost: finite and not negative.
fn non_negative(s: &str) -> Result<f64, String> {
    number(
        s,
        |v| v.is_finite() && v >= 0.0,
        "a finite number, 0 or more",
    )
}

/// A count of at least one.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

/// A share or probability: within 0..=1.
fn unit(s: &str) -> Result<f64, String> {
    number(s, |v| (0.0..=1.0).contains(&v), "within 0..1")
}

/// A share something reaches and is divided by: above 0, at most 1.
fn share(s: &str) -> Result<f64, String> {
    number(s, |v| v > 0.0 && v <= 1.0, "a share above 0, at most 1")
}

/// `--logit-bias ID=BIAS`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not ID=BIAS"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|e| format!("token id `{id}`: {e}"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|e| format!("bias `{bias}`: {e}"))?;
    Ok((id, bias))
}

/// `nectar logits`.
#[derive(Debug, Args)]
pub struct LogitsArgs {
    /// Model directory. Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Print JSON (the only output format; accepted for compatibility with scripts).
    #[arg(long)]
    pub json: bool,
    /// Add `mtp_logits`: per position p, the MTP draft for p+2 given the prompt token at p+1.
    #[arg(long)]
    pub mtp: bool,
    /// Add `router`: per MoE layer, chosen expert ids and weights per position.
    #[arg(long)]
    pub router: bool,
    /// Add `indexer`: per full-indexer layer, the key positions the last position attends to.
    #[arg(long)]
    pub indexer: bool,
}

/// `nectar verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Model directory.
    pub dir: PathBuf,
}

/// `nectar inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Model directory. Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `nectar convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Source Hugging Face directory.
    #[arg(long)]
    pub from: PathBuf,
    /// Output directory (created; an interrupted conversion resumes here).
    #[arg(long)]
    pub to: PathBuf,
    /// Routed experts of the main layers: 4, 8 or float.
    #[arg(long, default_value = "4")]
    pub expert_bits: nectar_format::convert::Bits,
    /// Attention projections: 4, 8 or float.
    #[arg(long, default_value = "4")]
    pub attn_bits: nectar_format::convert::Bits,
    /// Shared experts: 4, 8 or float.
    #[arg(long, default_value = "4")]
    pub shared_bits: nectar_format::convert::Bits,
    /// Dense MLPs: 4, 8 or float.
    #[arg(long, default_value = "4")]
    pub dense_bits: nectar_format::convert::Bits,
    /// embed_tokens and lm_head: 4, 8 or float.
    #[arg(long, default_value = "8")]
    pub io_bits: nectar_format::convert::Bits,
    /// The MTP layer (keep 8 or float: int4 MTP heads lose their acceptance).
    #[arg(long, default_value = "8")]
    pub mtp_bits: nectar_format::convert::Bits,
    /// DSA indexer wq_b and wk: 4, 8 or float.
    #[arg(long, default_value = "8")]
    pub indexer_bits: nectar_format::convert::Bits,
    /// Columns per int4 scale group (0 = one scale per row).
    #[arg(long, default_value_t = 64)]
    pub group_size: usize,
    /// Free space (GB) that must remain on the output disk after each shard.
    #[arg(long, default_value_t = 20.0)]
    pub min_free_gb: f64,
}

/// `nectar bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

/// What `nectar bench` measures.
#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// Matrix-product kernels on GLM-5.2 shapes (synthetic weights), as a ratio to the read
    /// bandwidth measured in the same run.
    Kernels(BenchKernelsArgs),
    /// Expert loads through the residency manager vs raw reads of the same files.
    Io(BenchIoArgs),
    /// Synthetic decode over a container with K LRU slots per layer and replayed routes.
    Decode(BenchDecodeArgs),
    /// Recorded routing replayed through the real slot policy, against Belady-OPT.
    Policy(BenchPolicyArgs),
    /// Recorded routing driving the real model (attention, spine, MoE through the residency
    /// manager, I/O workers, kernels) on a container under memory budgets.
    Replay(BenchReplayArgs),
    /// The CUDA tier (`--features cuda`): GPU kernels on GLM-5.2 shapes ÷ the device's copy
    /// bandwidth, and expert-sized pinned host→device copies ÷ one large copy.
    Gpu(BenchGpuArgs),
}

/// `nectar bench gpu`.
#[derive(Debug, Args)]
pub struct BenchGpuArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Smaller copies and no LM head (a few seconds).
    #[arg(long)]
    pub quick: bool,
    /// Only cases whose name contains this text (e.g. `expert`, `attn`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Activation rows to measure (decode, MTP verify, small batches).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    pub m: Vec<usize>,
    /// Activation rows of the tensor-core GEMM cases (prefill, batched verify), each against
    /// the ⌈M/8⌉ GEMV launches it replaces; `0` skips them.
    #[arg(long, value_delimiter = ',', default_values_t = [16, 64, 512])]
    pub gemm_m: Vec<usize>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// `nectar bench replay`.
#[derive(Debug, Args)]
pub struct BenchReplayArgs {
    /// The container to run (e.g. `nectar synth --layers 8 --mtp`: GLM-5.2's geometry).
    #[arg(long)]
    pub model: PathBuf,
    /// Trace directory (default: the route256 traces, GLM-5.2's expert shape).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace kind whose conversations are replayed.
    #[arg(long, default_value = "decode")]
    pub kind: String,
    /// Memory budgets, comma-separated (`K`/`M`/`G`/`T`); each runs on a freshly loaded model.
    #[arg(long, value_delimiter = ',', required = true)]
    pub memory_budget: Vec<String>,
    /// Speculation modes, comma-separated: `off`, `on` (MTP drafts one token per step, the
    /// main forward verifies two rows; acceptance drawn with --acceptance).
    #[arg(long, value_delimiter = ',', default_value = "off")]
    pub mtp: Vec<String>,
    /// Probability that a draft is accepted (default: the MTP acceptance measured on the
    /// route256 model, 0.686).
    #[arg(long, default_value_t = DEFAULT_ACCEPTANCE, value_parser = unit)]
    pub acceptance: f64,
    /// Conversations replayed per run: N segments spread evenly over the trace (its domains;
    /// the first few of a trace share one).
    #[arg(long, default_value_t = 2)]
    pub conversations: usize,
    /// Decode tokens per conversation at most (after its prompt).
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// Expert-reading threads.
    #[arg(long, default_value_t = 3)]
    pub io_threads: usize,
    /// What a full layer keeps: `predictive`, `frequency` or `lru` (see `nectar run`).
    #[arg(long, default_value = "predictive", value_parser = ["predictive", "frequency", "lru"])]
    pub admission: String,
    /// Seconds of each raw-disk sample (whole experts in the order this run missed them),
    /// taken before and after every run.
    #[arg(long, default_value_t = 2.0)]
    pub raw_seconds: f64,
    /// Instead of decoding: prefill the first N rows of the trace's `prefill` stream as one
    /// prompt (comma-separated sizes), and compare the expert bytes read with one read of
    /// every expert the prompt touches.
    #[arg(long, value_delimiter = ',')]
    pub prompt_rows: Vec<usize>,
    /// With --prompt-rows: prefill through `nectar serve`'s batch with this much prefill work
    /// per step (tokens' worth through every layer; 512 is `serve`'s), the model planned as
    /// `serve --parallel` plans it (0: one forward over the whole prompt, as `nectar run`).
    #[arg(long, default_value_t = 0)]
    pub prefill_chunk: usize,
    /// Plan memory as `nectar serve --parallel N` (its N rows and one kept conversation):
    /// with --prefill-chunk the plan decides the prefill span (default 4); a decode replay
    /// decodes the trace's sequences (N at least as many) as serve decodes that many rows,
    /// lending the idle rows' KV cache to the expert cache (default: a batch trace's width; a
    /// one-sequence trace is planned as `nectar run`).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Seed of the acceptance draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Prefetch arms, comma-separated (`off`, `lookahead`, `pilot`, `both`; see `nectar run
    /// --prefetch`): each (budget, MTP) point runs every arm in turn, alternating, on a freshly
    /// loaded model.
    #[arg(long, value_delimiter = ',', default_value = "off")]
    pub prefetch: Vec<String>,
    /// VRAM arms, comma-separated (`off`, a size such as `16G`, `auto`; `--gpu-memory` of
    /// `nectar run`, a build with `--features cuda`): each (budget, MTP, prefetch) point runs
    /// every arm in turn on a freshly loaded model, so the CPU path and the GPU tier are
    /// measured in the same run.
    #[arg(long, value_delimiter = ',', default_value = "off")]
    pub gpu_memory: Vec<String>,
    /// The model that produced the trace, for the `pilot` and `both` arms: it re-runs the trace's texts and
    /// its next-layer predictions (the router of layer L+1 applied to layer L's state) are what
    /// the replay prefetches — the container's own early router means nothing against
    /// replayed routes. Default: the model the trace's manifest names
    /// (`models/nectar-demo-glm5-e256-int4` for route256).
    #[arg(long)]
    pub predictor: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `nectar bench policy`.
#[derive(Debug, Args)]
pub struct BenchPolicyArgs {
    /// Trace directory (`manifest.json`, `{kind}.experts.npy`; default: the route256 traces,
    /// GLM-5.2's expert shape).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace kinds to replay, comma-separated (default: every kind of the directory).
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// LRU slots per layer, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,12,16,32,64")]
    pub slots: Vec<usize>,
    /// Admission policies to replay, comma-separated: `lru`, `frequency` (half-life
    /// --half-life), `predictive` (the default of `run` and `serve`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lru,frequency,predictive"
    )]
    pub admission: Vec<String>,
    /// Half-life of the frequency score, in waves (tokens) of the layer.
    #[arg(long, default_value_t = 64.0)]
    pub half_life: f64,
    /// Decode rows per step (w > 1: verifying w tokens per forward, as speculative decoding
    /// does).
    #[arg(long, default_value_t = 1)]
    pub window: usize,
    /// Layers replayed: `main` (the model's MoE layers), `mtp` (the MTP layer) or `all`.
    #[arg(long, default_value = "main", value_parser = ["main", "mtp", "all"])]
    pub layers: String,
    /// Pin this many experts per layer besides the --slots LRU slots: the most requested of
    /// the directory's `prefill` trace (other text: a usage ledger), as `--pin auto` would.
    #[arg(long, default_value_t = 0)]
    pub pin: usize,
    /// With --pin: live repin at each turn (a conversation's first step), at most this many
    /// swaps (0: the pins stay).
    #[arg(long, default_value_t = 0)]
    pub repin: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `nectar bench io`.
#[derive(Debug, Args)]
pub struct BenchIoArgs {
    /// A container (e.g. from `nectar synth`), ideally larger than the memory left for caches.
    #[arg(long)]
    pub model: PathBuf,
    /// I/O threads (both arms).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Experts requested per wave in the residency arm.
    #[arg(long, default_value_t = 16)]
    pub wave: usize,
    /// Seconds per arm and repetition.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Repetitions (the three arms rotate their order; the median of each is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Request size of the sequential raw arm (the device ceiling), in MiB.
    #[arg(long, default_value_t = 32)]
    pub seq_mib: usize,
    /// Pages of the raw arms' buffers: `huge` (transparent huge pages, physically contiguous:
    /// the device's ceiling) or `small` (4 KiB pages like the residency slab's — a diagnostic:
    /// what the same reads give into scattered memory).
    #[arg(long, default_value = "huge", value_parser = ["huge", "small"])]
    pub raw_pages: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `nectar bench decode`.
#[derive(Debug, Args)]
pub struct BenchDecodeArgs {
    /// A container (e.g. from `nectar synth`).
    #[arg(long)]
    pub model: PathBuf,
    /// LRU slots per layer.
    #[arg(long, default_value_t = 12)]
    pub slots: usize,
    /// Route source: uniform, zipf (temporal locality) or trace (recorded routing at GLM-5.2's
    /// expert shape, 256 experts top-8: `tests/fixtures/traces/route256`, or `--trace DIR`).
    #[arg(long, default_value = "zipf")]
    pub routes: String,
    /// Directory of a recorded trace (`manifest.json` and `{kind}.experts.npy`). Expert ids are
    /// used as recorded: the container needs at least the trace's experts per layer.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Which trace of the directory to replay (its decode rows only: prompt rows are prefill).
    #[arg(long, default_value = "decode")]
    pub trace_kind: String,
    /// Measured tokens.
    #[arg(long, default_value_t = 100)]
    pub tokens: usize,
    /// Warm-up tokens (not timed).
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Emulated resident spine read per layer and token, in MB.
    #[arg(long, default_value_t = 127.0)]
    pub spine_mb: f64,
    /// The part of --spine-mb that is the shared expert (GLM-5.2: 21.2 MB at int4 g64), read
    /// while the layer's misses load, as the model's MoE block does; the rest (attention) runs
    /// before the router. 0 puts the whole spine before the router.
    #[arg(long, default_value_t = 21.2)]
    pub shared_mb: f64,
    /// I/O threads.
    #[arg(long, default_value_t = 4)]
    pub io_threads: usize,
    /// Working slots.
    #[arg(long, default_value_t = 64)]
    pub working: usize,
    /// `none`; `oracle`: prefetch the next layer's experts (known from the route source) while
    /// computing this one — the perfect-prediction upper bound; `pilot` (with `--routes
    /// trace`): prefetch what the trace model's real next-layer predictor names for each row.
    #[arg(long, default_value = "none", value_parser = ["none", "oracle", "pilot"])]
    pub prefetch: String,
    /// Admission of misses into a full layer: `lru` (always, evict the least recently used),
    /// `frequency` (only a miss whose decayed request count beats the weakest resident's) or
    /// `predictive` (fed no token ids here, so without its context look-ahead: `bench replay`
    /// measures the default policy as the model runs it).
    #[arg(long, default_value = "frequency", value_parser = ["lru", "frequency", "predictive"])]
    pub admission: String,
    /// Half-life of the frequency score, in waves (tokens) of the layer.
    #[arg(long, default_value_t = 64.0)]
    pub half_life: f64,
    /// Prefetch only the first N experts of each guess (the predictor's most confident; 0 =
    /// all).
    #[arg(long, default_value_t = 0)]
    pub prefetch_top: usize,
    /// The model that produced the trace, for `--prefetch pilot` (default: the model its
    /// manifest names — the demo model, or `models/nectar-demo-glm5-e256-int4` for route256).
    #[arg(long)]
    pub predictor: Option<PathBuf>,
    /// Seconds of each raw-disk sample (random whole experts, then large sequential reads),
    /// taken between tokens through the run and excluded from its time.
    #[arg(long, default_value_t = 0.5)]
    pub raw_seconds: f64,
    /// Measured tokens between raw-disk samples (samples also precede the first and follow the
    /// last measured token).
    #[arg(long, default_value_t = 20)]
    pub raw_every: usize,
    /// Bytes the emulated spine slices rotate through, in MB (0: at least 4× the last-level
    /// cache read from sysfs, so the compute-bound figure streams from DRAM).
    #[arg(long, default_value_t = 0.0)]
    pub spine_pool_mb: f64,
    /// Route generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `nectar bench kernels`.
#[derive(Debug, Args)]
pub struct BenchKernelsArgs {
    /// Print one JSON object (`{"machine":..,"bandwidth":[..],"cases":[..]}`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Fewer repetitions and a row subset of the LM head (about a minute).
    #[arg(long)]
    pub quick: bool,
    /// Only cases whose name contains this text (e.g. `expert`, `lm_head`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Activation rows to measure (default 1,2,4,8,32: decode, MTP verify / small batches,
    /// a prefill chunk).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8, 32])]
    pub m: Vec<usize>,
    /// Thread counts to measure, each with its own read-bandwidth reference (default: 1 and
    /// all cores).
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
}

/// `nectar fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// Model directory. Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Hard memory budget (e.g. 24G, 512M). Default: 90 % of available memory.
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// Context length to reserve KV cache for.
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    pub ctx_size: usize,
    /// Also print what goes to VRAM at this `--gpu-memory` (a size; `auto` needs a build with
    /// `--features cuda` and a GPU): the spine by class, routed experts in VRAM per layer, and
    /// what stays in RAM — the plan `run` and `serve` apply, from the headers alone.
    #[arg(long, value_name = "SIZE|auto")]
    pub gpu_memory: Option<String>,
    /// Sequences decoded together (`nectar serve --parallel`): KV and prompt transients are
    /// reserved for each.
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// Plan as `nectar serve --parallel N` does: its rows plus one kept conversation (without
    /// it, the plan is `nectar run`'s).
    #[arg(long)]
    pub serve: bool,
    /// Plan for this `--mtp` mode: `off` leaves the MTP layer out of memory (as `run --mtp off`
    /// and `serve --mtp off` do), `on`/`auto` load it. Default: the planned command's own
    /// default (`off` for run, `auto` with --serve).
    #[arg(long, value_parser = ["off", "on", "auto"])]
    pub mtp: Option<String>,
    /// Also predict decode tok/s (MTP off and on) and prefill tok/s for this plan, from this
    /// machine's measured memory, kernel and disk speeds (or the flags below) and the hit rate
    /// the route256 trace reaches at the plan's slots.
    #[arg(long)]
    pub project: bool,
    /// Plan and project a built-in geometry instead of --model: `glm52` (GLM-5.2's real
    /// constants with Nectar's default int4 g64 experts, 21.2 MB) or `glm52-row` (the same
    /// with the published per-row int4 artifact's 18.9 MB experts); --project needs
    /// --disk-gbps, there being no files to measure.
    #[arg(long)]
    pub geometry: Option<String>,
    /// Disk read speed of whole experts (O_DIRECT, queue depth of the I/O threads), GB/s;
    /// default: measured on --model's files.
    #[arg(long, value_parser = positive)]
    pub disk_gbps: Option<f64>,
    /// Memory read bandwidth of the machine projected, GB/s (the decode kernels get this
    /// machine's measured share of it); default: measured here.
    #[arg(long, value_parser = positive)]
    pub mem_gbps: Option<f64>,
    /// Share of --mem-gbps the decode kernels reach (default: the share measured here; the
    /// kernel benchmark's M = 1 ratio is the steadier figure on a busy machine).
    #[arg(long, value_parser = share)]
    pub kernel_share: Option<f64>,
    /// Prefill GFLOP/s of the machine projected; default: measured here (scaled by --cores).
    #[arg(long, value_parser = positive)]
    pub gflops: Option<f64>,
    /// GFLOP/s of prefill's attention core on the machine projected; default: timed here on
    /// the model's own attention code at its dimensions (scaled by --cores).
    #[arg(long, value_parser = positive)]
    pub attn_gflops: Option<f64>,
    /// Cores of the machine projected (scales the measured prefill GFLOP/s and the calibrated
    /// per-layer compute).
    #[arg(long, value_parser = at_least_one)]
    pub cores: Option<usize>,
    /// Compute per MoE layer and token beyond streaming its weights (attention math, the DSA
    /// indexer, routing, synchronisation), milliseconds on the machine projected. Default:
    /// calibrated by a short decode of --model under the budget (or of --calibrate with
    /// --geometry), scaled by --cores; 0 when there is nothing to calibrate on.
    #[arg(long, value_parser = non_negative)]
    pub layer_overhead_ms: Option<f64>,
    /// Share of the MoE block's compute behind which expert reads hide (0–1; 1 = all of it,
    /// the block's design; 0 = each layer's misses read after its router with nothing beside).
    /// Default: measured by the calibration decode (trace routes under the budget), else 0.
    #[arg(long, value_parser = unit)]
    pub moe_overlap: Option<f64>,
    /// Share (0–1) of look-ahead's reads (their disk time) that run while attention computes
    /// rather than beside a MoE block, whose disk is busy with its own misses: how much of
    /// reading ahead is credited. Default: measured by a second calibration decode with
    /// look-ahead on, else 0 (no credit).
    #[arg(long, value_parser = unit)]
    pub lookahead_hidden: Option<f64>,
    /// Share (0–1) of look-ahead's wrong guesses that are cancelled before their read starts
    /// (the layer's router chose otherwise while the read still waited for an idle disk): only
    /// the rest cost disk time. Default: measured by the calibration decode with look-ahead on,
    /// else 0 (every wrong guess read).
    #[arg(long, value_parser = unit)]
    pub lookahead_cancelled: Option<f64>,
    /// With --geometry: a container of the same geometry (e.g. `nectar synth --layers 4`) to
    /// calibrate the per-layer compute and the overlap on.
    #[arg(long)]
    pub calibrate: Option<PathBuf>,
    /// With --project and --gpu-memory: weight GB/s of the GPU's kernels at M = 1 on the card
    /// projected (the int4 GEMV reads 0.15–0.76 of HBM bandwidth by shape on an H200,
    /// docs/gpu.md; `nectar bench gpu` measures it).
    #[arg(long, value_parser = positive)]
    pub gpu_gbps: Option<f64>,
    /// With --project and --gpu-memory: one GPU product's round trip beyond its weight reads
    /// (launch, activation copies over PCIe, synchronisation), microseconds (`nectar bench gpu`
    /// prints it as a round trip's fixed cost: about 30 on an H200).
    #[arg(long, value_parser = non_negative)]
    pub gpu_product_us: Option<f64>,
    /// With --project and --gpu-memory: GB/s of an expert's copy from a RAM slot to the card
    /// (`run` copies experts that are not in VRAM when that beats computing them on the CPU,
    /// splitting each layer's step between the two: docs/gpu.md). About 0.95 of the link's
    /// pinned host-to-device rate (`nectar bench gpu`: 52.7 of 55.3 GB/s on an H200's PCIe5;
    /// a PCIe4 x16 card about 25). Without it, experts not in VRAM are projected on the CPU.
    #[arg(long, value_parser = positive)]
    pub gpu_copy_gbps: Option<f64>,
    /// With --project and --gpu-memory: GPU prefill time per prompt token and layer beyond
    /// attention's quadratic work (the products, routing, norms and the host's share),
    /// microseconds, on the card projected. With --gpu-attn-tflops, prefill is projected on the
    /// GPU (else the CPU's is printed). `scripts/gpu-prefill-projection` measures both speeds
    /// on a card with every matrix in VRAM (docs/gpu.md; an H100 at GLM-5.2's shapes with 256
    /// experts per layer: 76 µs and 87 TFLOP/s, benchmarks/RESULTS.md).
    #[arg(long, value_parser = positive)]
    pub gpu_prefill_us: Option<f64>,
    /// With --gpu-prefill-us: TFLOP/s of the GPU's prompt attention (every causal key tile),
    /// as `AttnShape::gpu_prefill_flops` counts its work.
    #[arg(long, value_parser = positive)]
    pub gpu_attn_tflops: Option<f64>,
    /// Prefetch projected: `both` (the default, as `run` and `serve`: projected as PILOT, with b
    /// and w measured by a calibration decode of both), `lookahead`, `off`, or `pilot` (`run
    /// --prefetch pilot`: the next layer's router applied early; its prefetch slots come out of
    /// the plan, its reads keep the disk busy through attention a share --pilot-busy of it and
    /// read --pilot-waste wrong guesses per needed read).
    #[arg(long, default_value = "both", value_parser = ["off", "lookahead", "pilot", "both"])]
    pub prefetch: String,
    /// With --prefetch pilot (or both): the share (0–1) of the predicted layers' attention (MoE layers
    /// with a layer before them) through which PILOT's reads kept the disk busy (its queue of
    /// the next layer's predicted misses runs on from the MoE block before). Default: measured
    /// by a calibration decode with PILOT on, else 0 (no credit).
    #[arg(long, value_parser = unit)]
    pub pilot_busy: Option<f64>,
    /// With --prefetch pilot (or both): the wrong guesses read (not cancelled at their layer's
    /// router) per needed expert read. Default: measured by the calibration decode with PILOT
    /// on, else 0.
    #[arg(long, value_parser = non_negative)]
    pub pilot_waste: Option<f64>,
    /// With --prefetch pilot (or both): the model that produced the trace, whose next-layer predictions
    /// the PILOT calibration decode replays (as `bench replay --predictor`). Default: the model
    /// the trace's manifest names (`models/nectar-demo-glm5-e256-int4` for route256).
    #[arg(long)]
    pub predictor: Option<PathBuf>,
    /// With --project: also project decode after a context of this many tokens (an agent's
    /// long prompt). Adds, per decoded row, the CPU attention work that grows with the keys a
    /// row sees — the absorbed form over min(N, index_topk) keys on every layer, the indexer's
    /// scores of all N keys and its top-k on each full-indexer layer — timed here on the
    /// model's own code at its dimensions (scaled by --cores), beyond the short context the
    /// calibration decodes at.
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<usize>,
    /// Probability that an MTP draft is accepted (the route256 model measured 0.686).
    #[arg(long, default_value_t = DEFAULT_ACCEPTANCE, value_parser = unit)]
    pub acceptance: f64,
    /// Routing trace for the hit-rate curve (default: route256, GLM-5.2's expert shape).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// I/O threads of the disk measurement.
    #[arg(long, default_value_t = 3)]
    pub io_threads: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `nectar synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Geometry: `glm52` (hidden 6144, 256 experts of 2048, int4 g64: 20.25 MiB per expert),
    /// `small` (hidden 1024, 64 experts of 512: 0.84 MiB each, for memory tests) or `tiny` (for
    /// tests).
    #[arg(long, default_value = "glm52")]
    pub preset: String,
    /// MoE layers to write (glm52: about 5.06 GiB each).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Add an MTP layer (int8 routed experts, as `nectar convert` writes them by default).
    #[arg(long)]
    pub mtp: bool,
    /// Routed experts per layer instead of the preset's (e.g. `--preset tiny --experts 256
    /// --layers 78`: GLM-5.2's expert map on a few hundred MB).
    #[arg(long)]
    pub experts: Option<usize>,
}

/// `nectar serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory. Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Address to bind (loopback by default; anything else should come with --api-key).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require this key on every route but /health (`Authorization: Bearer KEY` or `x-api-key`).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Another name clients may give as `model` (repeatable). A request naming any model
    /// other than the served one (the directory's name) or an alias is 404 `model_not_found`.
    #[arg(long = "alias", value_name = "NAME")]
    pub alias: Vec<String>,
    /// Context length in tokens (prompt + reply). Default: the model's, at most 4096.
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Requests decoded together (continuous batching: one forward per step over every row, so
    /// each routed expert is read once per layer per step).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Stream routed experts under this memory budget (e.g. 24G). Default: experts memory-mapped.
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// VRAM for the GPU tier, as `nectar run --gpu-memory` (a size, `auto` — the default with
    /// `--features cuda` — or `off`).
    #[arg(long, value_name = "SIZE|auto|off")]
    pub gpu_memory: Option<String>,
    #[command(flatten)]
    pub cache: ExpertCacheArgs,
    /// MTP speculative decoding: on, off or auto. Every row drafts inside the batch step and one
    /// forward verifies all rows' drafts; `auto` chooses the step's depth (0 included) for the
    /// batch from measured acceptance and the measured cost of steps of its shape (tokens per
    /// second over all rows; docs/speculation.md).
    #[arg(long, default_value = "auto", value_parser = ["on", "off", "auto"])]
    pub mtp: String,
    /// The Atlas the page shows (`/experts.json`, written by `nectar atlas analyze`). Default:
    /// the model directory's `experts.json`.
    #[arg(long, value_name = "FILE")]
    pub atlas: Option<PathBuf>,
    /// Seconds a client has to send a request's line and headers (also how long an idle
    /// keep-alive connection stays open).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's whole body once its headers arrived (408 after).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,
}
