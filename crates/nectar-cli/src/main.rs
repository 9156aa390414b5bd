//! `nectar`: run giant mixture-of-experts models on machines with far less RAM than the model.
mod args;
mod cmd;
mod demo;
mod machine;

use clap::Parser;

/// glibc returns freed blocks above its mmap threshold (and the heap's free top beyond the trim
/// threshold) to the kernel, so every forward's activation buffers came back as fresh pages
/// that the kernel zeroes on first touch: a quarter of prefill time went to page faults. Fixed
/// thresholds keep freed buffers for reuse; the process keeps at most its peak working set,
/// which the memory plan already counts (prefill transients).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_buffers() {
    // SAFETY: mallopt only sets allocator parameters; it is called first thing in main, before
    // any other thread exists, and an unsupported value is refused with a return of 0.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_buffers() {}

/// Log lines go to stderr, filtered by `NECTAR_LOG` (default `warn`; `serve` adds its request
/// lines at info). Colour only when stderr is a terminal: a redirected log never carries ANSI
/// codes. `--log-format json` writes one JSON object per line.
fn init_logging(cli: &args::Cli) {
    use std::io::IsTerminal;
    let default = match cli.command {
        args::Command::Serve(_) => "warn,nectar_server=info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("NECTAR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        builder.json().with_current_span(false).init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

fn main() {
    keep_freed_buffers();
    let cli = args::Cli::parse();
    init_logging(&cli);
    // The thread that runs the model is worker 0 of the compute pool, so every parallel kernel
    // call forks from inside the pool: handing each call to a pool thread and parking the caller
    // cost two futex round trips per matrix (a tenth of decode time on the demo model). The
    // server's model thread builds its own pool the same way; its main thread only runs HTTP.
    //
    // The same thread owns the compute team (`nectar_kernels::team`) of as many threads: the
    // forward's short parallel regions run there, on workers that spin between regions instead
    // of sleeping (rayon's idle workers slept between them, and waking them cost what the second
    // thread saved).
    let _team = if matches!(cli.command, args::Command::Serve(_)) {
        None
    } else {
        let team = rayon::ThreadPoolBuilder::new()
            .num_threads(cli.threads.unwrap_or(0))
            .use_current_thread()
            .build_global()
            .map_err(|e| e.to_string())
            .and_then(|()| {
                nectar_kernels::team::Team::start(rayon::current_num_threads())
                    .map_err(|e| e.to_string())
            });
        match team {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: cannot start the compute threads: {e}");
                std::process::exit(2);
            }
        }
    };
    if let Some(isa) = &cli.isa {
        if let Err(e) = nectar_kernels::set_isa(isa) {
            eprintln!("error: --isa: {e}");
            std::process::exit(2);
        }
    }
    if let Err(e) = nectar_kernels::set_int4_order(&cli.int4_order) {
        eprintln!("error: --int4-order: {e}");
        std::process::exit(2);
    }
    let result = match cli.command {
        args::Command::Run(a) => cmd::run::run(a),
        args::Command::Logits(a) => cmd::logits::run(a),
        args::Command::Inspect(a) => cmd::inspect::run(a),
        args::Command::Verify(a) => cmd::verify::run(a),
        args::Command::Bench(a) => cmd::bench::run(a),
        args::Command::Convert(a) => cmd::convert::run(a),
        args::Command::Fit(a) => cmd::fit::run(a),
        args::Command::Synth(a) => cmd::synth::run(a),
        args::Command::Serve(a) => cmd::serve::run(a, cli.threads),
        args::Command::Atlas(a) => cmd::atlas::run(a),
        args::Command::Doctor(a) => cmd::doctor::run(a),
    };
    if let Err(e) = result {
        // A closed stdout (`nectar run | head`) is not an error.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        eprintln!("error: {}", chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes joined by `: `, leaving out a cause whose text the message before
/// it already ends with (library errors often print their source too).
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !out.ends_with(&s) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&s);
        }
    }
    out
}
