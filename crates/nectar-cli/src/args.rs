//! Command-line flags: declared once here, with their defaults and help text.
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Nectar: a runtime for giant mixture-of-experts LLMs (GLM-5.x) on small-RAM machines.
#[derive(Debug, Parser)]
#[command(name = "nectar", version, about)]
pub struct Cli {
    /// Compute threads (default: all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
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
}

/// `nectar run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model directory (Hugging Face `glm_moe_dsa` layout). Default: the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
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
