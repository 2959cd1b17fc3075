//! `weave`: the streamweave command line.
//!
//! `weave dump FILE [--set k=v]...` loads a `.weave` fusion (parse, schedule, verify), runs
//! a pass pipeline verifying after every pass, and prints the IR (a host program is followed
//! by its kernel plans as `//` lines, for `--sms N` SMs and `--streams K` pool streams;
//! `--kernels` prints their CUDA C instead); it takes the flags of
//! `cargo xtask dump` (`--passes`, `--print-before`, `--print-after`, `--print-after-change`,
//! `--dump-dir`, `--list-passes`; docs/passes.md) and honours `WEAVE_DUMP`, which this binary
//! reads and hands to the library (`weave run` honours it too, dumping to stderr).
//!
//! `weave run FILE --ranks N [--set k=v]... [--backend cpu|cuda] [--streams K]
//! [--check-races] [--trace F] [--seed S] [--timeout-secs T] [--warmup W] [--iters I]
//! [--eager] [--transport nccl|copy-engine] [--chunks S|auto]` compiles the fusion, runs the host
//! program on N ranks with seeded random inputs, compares every rank's outputs with the
//! unsharded f64 reference and prints the max error, a summary of the host program and
//! timings; with `--trace` it writes a Chrome trace and an SVG timeline beside it.
//!
//! `weave tune FILE [--set k=v]... --ranks N [--backend cpu|cuda] [--iters I] [--warmup W]
//! [--cache F]` measures the fusion's candidate configurations (chunk count, stream pool,
//! CUDA-graph replay; `streamweave::tune`), prints them and caches the fastest, which
//! `weave run --chunks auto` then uses.
//!
//! `weave calibrate [--ranks N] [--out FILE]` measures the machine for the chunk-count model
//! (`streamweave::calibrate`) and writes the calibration cache that `--chunks auto`
//! reads.
//!
//! Every command takes `--log FILTER` (or `WEAVE_LOG=FILTER`): the `tracing` log of the
//! libraries and the command, on stderr (`weave_cli::log`).
//!
//! `weave launch -n N [--timeout-secs T] [--grace-secs G] [--master-addr A] [--master-port P]
//! -- CMD ARGS...` starts N processes of CMD with the torchrun environment (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, ...), prefixes their output with `[rank R] ` and stops them
//! all when one fails or the timeout expires (`weave_cli::launch`).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use weave_cli::cli::ChunksFlag;
use weave_passes::{DumpFlags, Ir, PassManager, Registry, DUMP_ENV};

/// Compile multi-GPU tensor programs into host programs that overlap communication with
/// compute.
#[derive(Parser)]
#[command(name = "weave", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print the log of the libraries and the command to stderr, filtered by FILTER (e.g.
    /// `debug`, `weave_passes=trace,info`); default: `$WEAVE_LOG`, else no log.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Load a `.weave` file, run a pass pipeline and print the IR (docs/passes.md).
    Dump {
        /// The `.weave` file to load.
        #[arg(required_unless_present = "list_passes")]
        file: Option<PathBuf>,
        /// Override a fusion parameter (repeatable), e.g. `--set s=3`.
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = streamweave::parse_override)]
        set: Vec<(String, i64)>,
        /// The passes to run: `default`, a pipeline `a,b,c`, or edits `+x,-y` of the default
        /// pipeline. Without it no pass runs (the loaded fusion is printed) unless a
        /// `--print-*`/`--dump-dir` flag asks for dumps, which runs the default pipeline.
        #[arg(long, value_name = "PIPELINE|EDITS", allow_hyphen_values = true)]
        passes: Option<String>,
        /// Print the IR before these passes: a name, names separated by commas, or `all`.
        #[arg(long, value_name = "PASS|all")]
        print_before: Vec<String>,
        /// Print the IR after these passes: a name, names separated by commas, or `all`.
        #[arg(long, value_name = "PASS|all")]
        print_after: Vec<String>,
        /// Print after a pass only when it changed the IR (alone: after every such pass).
        #[arg(long)]
        print_after_change: bool,
        /// Write the dumps to DIR/NNN-PASS.{before,after}.txt instead (alone: after every
        /// pass), and a failing pass's reproducer to DIR/weave-repro-PASS.txt.
        #[arg(long, value_name = "DIR")]
        dump_dir: Option<PathBuf>,
        /// List the registered passes with their summaries, and the default pipeline.
        #[arg(long)]
        list_passes: bool,
        /// Compile with the default pipeline and print the CUDA C of every generated kernel
        /// of its kernel table: one per distinct segment and buffer layouts that the ranks
        /// launch (each chunk shape; each rank's copy of a kernel whose ops mention `rank`).
        #[arg(long, conflicts_with_all = ["passes", "print_before", "print_after", "print_after_change", "dump_dir"])]
        kernels: bool,
        /// The SM count kernel grids are sized for, in the kernel plans printed after a host
        /// program and with --kernels (default 132, an H100 SXM's).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
        sms: Option<u32>,
        /// The pool size (`numberOfStreams`, as `weave run --streams`) the kernel plans
        /// printed after a host program and with --kernels are for: it sets the strides of a
        /// buffer of chunk slots (default 2).
        #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=MAX_STREAMS))]
        streams: Option<u64>,
    },
    /// Compile a `.weave` file (or take a printed host program, `.hir`), run it on N ranks
    /// with seeded random inputs and compare every rank's outputs with the unsharded f64
    /// reference.
    Run {
        /// The `.weave` fusion, or a host program printed by `weave dump --passes default`
        /// (`.hir`: it runs as printed, its inputs sharded by its signature).
        file: PathBuf,
        /// How many ranks run the program (in-process threads on the CPU backend; at most
        /// 1024). Default: 2 for a fusion (its mesh-size parameter follows), the devices of a
        /// host program.
        #[arg(long)]
        ranks: Option<usize>,
        /// Run without the f64 reference (a host program without a `Definition:` block has
        /// none): outputs are not checked, races still are with --check-races.
        #[arg(long)]
        no_check: bool,
        /// Override a fusion parameter (repeatable), e.g. `--set s=3`.
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = streamweave::parse_override)]
        set: Vec<(String, i64)>,
        /// Where to run: `cpu` (always available) or `cuda`. Default: `cpu` when no GPU
        /// backend is available.
        #[arg(long, value_name = "cpu|cuda")]
        backend: Option<String>,
        /// `numberOfStreams`: the size of each rank's stream pool, from 1 to 64. Default: the
        /// pool size `weave tune` cached for this program with `--chunks auto`, else 2.
        #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=MAX_STREAMS))]
        streams: Option<u64>,
        /// Check stream synchronization with the race checker.
        #[arg(long)]
        check_races: bool,
        /// Write a Chrome trace (Perfetto) to this file, and an SVG timeline beside it (the
        /// same name with the extension `.svg`, so FILE must not end in `.svg`).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Seed of the generated inputs.
        #[arg(long, default_value_t = 0x5eed)]
        seed: u64,
        /// How long a stream or a collective waits before failing, and how long the whole run
        /// may take, in seconds (1 to 31,536,000: a year). On GPUs a rank still running then
        /// gets half as long again (5 to 30 s) to stop; one that does not is reported as
        /// stuck and the command ends with an error. A first run's tuning bounds each
        /// candidate's waits by this and half the tuning budget.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
        timeout_secs: u64,
        /// Write a one-line JSON summary (scenario, ranks, mode, max errors, wall time,
        /// result) to this file. An earlier file is removed first; on any failure `passed`
        /// is false and `error` says what failed.
        ///
        /// Output files are written atomically (a temporary file, then a rename).
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// CUDA backend: run the program this many times first (at most 1,000,000; warms
        /// kernels, GEMM plans and NCCL up), then the run that is checked, timed and traced.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=MAX_RUNS))]
        warmup: u64,
        /// The chunk count S (the fusion's chunk-count parameter, declared `s: chunks` or the
        /// extent of its Stream axes, unless `--set` gives it): a number, or `auto` — the
        /// configuration `weave tune` measured fastest for this program, rank count, backend
        /// and GPU (its S, and its pool size and graph replay unless `--streams` or `--eager`
        /// say otherwise), when the tuning cache holds one; else on the CUDA backend a cost
        /// model (GEMM work and communication of the unchunked program against the machine's
        /// calibration) picks the fastest of 1, 2, 4, 8, no overlap when it cannot pay; on
        /// the CPU backend the fusion's own value. `ring:K` runs the fusion's ring form: from
        /// its one-chunk form, each GEMM whose contraction is split over the devices and
        /// reduced by an allreduce or reduce-scatter becomes a reduce ring, and each
        /// allgather a ring, one stream chunk per device, the reduce rings' steps cut into K
        /// pieces summed in their GEMMs (`ring` is `ring:1`, each step whole); refused for a
        /// fusion without such a communication.
        #[arg(long, default_value = "auto", value_parser = parse_chunks)]
        chunks: Auto<ChunksFlag>,
        /// CUDA backend: after the warm-up, time this many runs on inputs already on the
        /// device (issued back to back, each timed by CUDA events on the main stream) and
        /// print their median and minimum (the slowest rank's), before the checked run (at
        /// most 1,000,000). The timed runs replay one run captured as a CUDA graph (one launch
        /// per run), unless `--eager`.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=MAX_RUNS))]
        iters: u64,
        /// With `--iters`: issue every timed run statement by statement instead of
        /// replaying a captured CUDA graph.
        #[arg(long)]
        eager: bool,
        /// CUDA backend: how allgathers, send/recv transfers and sum reduce-scatters and
        /// allreduces move: `nccl`, or `copy-engine` (the GPUs' copy engines push into
        /// shared windows, no SMs but one reduction kernel per reducing post; direct
        /// pointers between the ranks of one process, CUDA IPC windows between launched
        /// processes). Default: the tuned configuration's, else `nccl`.
        #[arg(long, value_name = "nccl|copy-engine")]
        transport: Option<String>,
        /// CUDA backend: run compute (GEMMs, kernels) in issue order across streams, so
        /// chunk i + 1 computes while chunk i communicates (`on`), or let every chunk's
        /// compute start at once (`off`). Default: the tuned configuration's, else off.
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        ordered_compute: Option<bool>,
        /// CUDA backend: the priority of the stream pool that posts the chunks'
        /// collectives: `high` schedules their kernels ahead of queued GEMM blocks.
        /// Default: the tuned configuration's, else normal.
        #[arg(long, value_name = "high|normal", value_parser = parse_priority)]
        pool_priority: Option<bool>,
        /// CUDA backend: post the collectives from high-priority streams of their own, one
        /// beside each pool stream (`high`), so a chunk's collective is scheduled ahead of
        /// the GEMM blocks other chunks queue; or on the pool streams (`normal`). Default: the
        /// tuned configuration's, else normal.
        #[arg(long, value_name = "high|normal", value_parser = parse_priority)]
        comm_priority: Option<bool>,
        /// CUDA backend: SMs every GEMM leaves to concurrent communication (cuBLASLt's SM
        /// target is the GPU's SMs minus N; 0: the whole GPU). Default: the tuned
        /// configuration's, else 0.
        #[arg(long, value_name = "N")]
        gemm_sm_margin: Option<u32>,
        /// CUDA backend: the most CTAs one NCCL kernel may use (`maxCTAs`), or `auto` for
        /// NCCL's choice. Default: the tuned configuration's, else auto.
        #[arg(long, value_name = "N|auto", value_parser = parse_max_ctas)]
        nccl_max_ctas: Option<Auto<u32>>,
        /// CUDA backend: NCCL's CTA policy: `efficiency` (as few CTAs as give decent
        /// bandwidth), `zero` (none wherever NCCL can: copy engines over a symmetric window,
        /// NCCL ≥ 2.28), `default`, or `auto` for NCCL's choice. Default: the tuned
        /// configuration's, else auto.
        #[arg(long, value_name = "default|efficiency|zero|auto", value_parser = parse_cta_policy)]
        nccl_cta_policy: Option<Auto<streamweave::NcclCtaPolicy>>,
        /// CUDA backend: MiB of a symmetric NCCL window in each direction (0: none, at most
        /// 65536): whole-world allgathers, allreduces and reduce-scatters that fit are staged
        /// through it so NCCL may run its symmetric kernels. Default: the tuned
        /// configuration's, else 0.
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(0..=i64::from(streamweave::MAX_NCCL_WINDOW_MIB)))]
        nccl_window_mib: Option<u32>,
        /// CUDA backend, copy-engine transport: MiB of each slot of the receive windows (1 to
        /// 1024; each rank holds 8 lanes × 2 slots × (ranks − 1) of them): a block to one
        /// peer that fits moves as one piece. Default: the tuned configuration's, else 8 (or
        /// WEAVE_CE_WINDOWS's).
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=i64::from(streamweave::MAX_CE_SLOT_MIB)))]
        ce_slot_mib: Option<u32>,
        /// CUDA backend, copy-engine transport: a linear whose output only feeds a sum
        /// reduce-scatter or allreduce is computed by that collective, its GEMM writing each
        /// peer's block straight into the peer's receive window (`on`), or computed whole
        /// and its blocks copied (`off`). Default: the tuned configuration's, else off.
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        gemm_into_windows: Option<bool>,
        /// Never tune: without a cached configuration, run the cost model's chunk count with
        /// the default knobs. (By default the first `--iters` run of a fusion on GPUs in
        /// this process, with nothing on the command line choosing S, K or a knob and no
        /// cached configuration, measures the candidates first, for at most
        /// --tune-budget-secs, and caches the winner.)
        #[arg(long)]
        no_tune: bool,
        /// The most seconds that first tuning may take (1 to 86400).
        #[arg(long, value_name = "T", default_value_t = 60,
              value_parser = clap::value_parser!(u64).range(1..=MAX_TUNE_BUDGET_SECS))]
        tune_budget_secs: u64,
        /// Whether that first tuning also tries the copy-engine transport (its slots and
        /// GEMMs writing into the windows) at every chunk count: `on` (the default of a
        /// tuning) or `off` (NCCL only). `on` is refused where no tuning runs (the CPU
        /// backend, `--no-tune`).
        #[arg(long, value_name = "on|off", value_parser = parse_on_off,
              action = clap::ArgAction::Set)]
        tune_copy_engines: Option<bool>,
    },
    /// Start N processes of a command with the torchrun environment (RANK, WORLD_SIZE,
    /// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK), forward their
    /// output prefixed with `[rank R] `, and stop them all when one fails or time runs out.
    ///
    /// Every rank leads its own process group; stopping a rank kills its whole group.
    ///
    /// Exit status: 0 when every rank succeeds, 124 when the timeout expired, 128 + N when
    /// the launcher got signal N (SIGINT, SIGTERM, SIGHUP), 1 otherwise.
    Launch {
        /// How many processes (ranks) to start.
        #[arg(short = 'n', long = "nprocs", value_name = "N")]
        nprocs: usize,
        /// Kill every rank still running after this many seconds (1 to 31,536,000: a year).
        #[arg(long, value_name = "T", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
        timeout_secs: u64,
        /// After a rank fails, kill the others once this many seconds have passed.
        #[arg(long, value_name = "G", default_value_t = 5)]
        grace_secs: u64,
        /// MASTER_ADDR given to every rank.
        #[arg(long, value_name = "A", default_value = weave_cli::launch::DEFAULT_MASTER_ADDR)]
        master_addr: String,
        /// MASTER_PORT given to every rank (default: a port the launcher binds on the
        /// MASTER_ADDR and hands, still bound, to rank 0's store through WEAVE_STORE_FD).
        #[arg(long, value_name = "P")]
        master_port: Option<u16>,
        /// The command and its arguments, after `--`. A bare `weave` runs this executable.
        #[arg(last = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Measure a fusion's candidate configurations — chunk count S ∈ {1, 2, 4, 8}, stream
    /// pool K ∈ {1, 2, 4}, CUDA-graph replay on and off — and cache the fastest, which
    /// `weave run --chunks auto` then uses.
    ///
    /// Each candidate runs the warm-up runs, then the timed ones (their median, each at its
    /// slowest rank). On GPUs, chunk counts the cost model predicts at least 1.5x slower
    /// than its best are skipped; pools of more streams than chunks are always skipped; ties
    /// within 2% go to fewer chunks, then fewer streams.
    Tune {
        /// The `.weave` fusion.
        file: PathBuf,
        /// Override a fusion parameter (repeatable), e.g. `--set t=4096`; the chunk count is
        /// what is tuned.
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = streamweave::parse_override)]
        set: Vec<(String, i64)>,
        /// How many ranks run the program (its mesh-size parameter follows).
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        /// Where to run: `cpu` (threads, the default, as for `weave run`) or `cuda`.
        #[arg(long, value_name = "cpu|cuda")]
        backend: Option<String>,
        /// Timed runs per candidate (1 to 1,000,000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=MAX_RUNS))]
        iters: u64,
        /// Untimed runs per candidate first (at most 1,000,000).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=MAX_RUNS))]
        warmup: u64,
        /// The tuning cache (default: $WEAVE_TUNE_CACHE, else streamweave/tune.toml in the cache directory: ~/.cache on Linux).
        #[arg(long, value_name = "FILE")]
        cache: Option<PathBuf>,
        /// How long each candidate's runs (warm-up and timed) may take together, in seconds
        /// (1 to 31,536,000: a year). On GPUs each wait of them (a stream, a collective) gets
        /// half of it, but 5 s at least (all of it when that is less), and the runs at least
        /// two waits. A candidate whose ranks do not stop in that time fails, and the
        /// candidates after it are not measured (its GPU work may hold the GPUs).
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
        timeout_secs: u64,
        /// Whether to try the copy-engine transport (its slots and GEMMs writing into the
        /// windows) at every chunk count: `on` (default; a bare `--copy-engines` says the
        /// same) or `off` (NCCL only).
        #[arg(long, value_name = "on|off", value_parser = parse_on_off, default_value = "on",
              num_args = 0..=1, default_missing_value = "on", action = clap::ArgAction::Set)]
        copy_engines: bool,
    },
    /// Measure this machine for the chunk-count model (`--chunks auto`) on N GPUs: bf16 GEMM
    /// throughput and fixed cost, allreduce bus bandwidth and latency, point-to-point
    /// bandwidth; write the figures to the calibration cache.
    Calibrate {
        /// GPUs (ranks) to measure the collectives on.
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        /// Where to write the figures (default: $WEAVE_CALIBRATION, else
        /// streamweave/calibration.txt in the platform's cache directory).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// How long any wait may take before the calibration fails, in seconds (1 to
        /// 31,536,000: a year).
        #[arg(long, value_name = "T", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
        timeout_secs: u64,
    },
}

/// The largest `--streams`: a rank's stream pool holds at most this many streams.
const MAX_STREAMS: u64 = 64;

/// The most warm-up or timed runs (`--warmup`, `--iters`) one command asks for.
const MAX_RUNS: u64 = 1_000_000;

/// The longest `--timeout-secs` of every command: a year (365 days), far from any overflow
/// of the deadlines computed from it.
const MAX_TIMEOUT_SECS: u64 = 31_536_000;

/// The longest `--tune-budget-secs`: a day.
const MAX_TUNE_BUDGET_SECS: u64 = 86_400;

/// A count checked by its flag's range, as a `usize`.
fn count(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// `--ordered-compute`: `on` or `off`.
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("`{s}`: expected on or off")),
    }
}

/// `--pool-priority`, `--comm-priority`: `high` (true) or `normal`.
fn parse_priority(s: &str) -> Result<bool, String> {
    match s {
        "high" => Ok(true),
        "normal" => Ok(false),
        _ => Err(format!("`{s}`: expected high or normal")),
    }
}

/// A flag that takes `auto` (`None`: the product chooses) or a value: `--chunks`,
/// `--nccl-max-ctas`, `--nccl-cta-policy`.
#[derive(Clone, Copy, Debug)]
struct Auto<T>(Option<T>);

/// `auto`, or a value that `value` accepts; else the error `expected` says of `s`.
fn parse_auto<T>(
    s: &str,
    value: impl FnOnce(&str) -> Option<T>,
    expected: impl FnOnce(&str) -> String,
) -> Result<Auto<T>, String> {
    if s == "auto" {
        return Ok(Auto(None));
    }
    value(s).map(|v| Auto(Some(v))).ok_or_else(|| expected(s))
}

/// `--nccl-max-ctas`: `auto` (NCCL's choice) or a count from 1 to 64.
fn parse_max_ctas(s: &str) -> Result<Auto<u32>, String> {
    parse_auto(
        s,
        |s| s.parse::<u32>().ok().filter(|n| (1..=64).contains(n)),
        |s| format!("`{s}`: expected auto or a CTA count from 1 to 64"),
    )
}

/// `--nccl-cta-policy`: a policy, or `auto` (NCCL's choice).
fn parse_cta_policy(s: &str) -> Result<Auto<streamweave::NcclCtaPolicy>, String> {
    parse_auto(
        s,
        |s| s.parse().ok(),
        |s| format!("`{s}`: expected default, efficiency, zero or auto"),
    )
}

/// `--chunks`: `auto`, a positive count, `ring` or `ring:K` (K from 1 to 64).
fn parse_chunks(s: &str) -> Result<Auto<ChunksFlag>, String> {
    parse_auto(
        s,
        |s| match streamweave::Chunks::parse(s) {
            Ok(streamweave::Chunks::Fixed(n)) => Some(ChunksFlag::Count(n)),
            Ok(streamweave::Chunks::Ring(k)) => Some(ChunksFlag::Ring(k)),
            _ => None,
        },
        |s| {
            format!(
                "`{s}` is neither `auto`, a positive number, `ring` nor `ring:K` (K pieces a step, 1 to 64)"
            )
        },
    )
}

fn main() -> ExitCode {
    let code = run_command();
    if streamweave::stuck_ranks() > 0 {
        end_without_clean_up();
    }
    code
}

/// Ends the process with status 1 at once, its output flushed, skipping the clean-up at exit:
/// a rank thread was left waiting on a stalled GPU (its error is printed), and the CUDA
/// clean-up at exit would wait on that GPU forever. Measured: such a process did not exit
/// 35 s after its error (docs/benchmarks.md, 2026-11-27 sixth).
#[allow(unsafe_code)]
fn end_without_clean_up() {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(target_os = "linux")]
    // SAFETY: `_exit` ends the process at once, skipping atexit handlers and destructors;
    // nothing of this process is needed after it (the output is flushed above, and the
    // command wrote and closed its files before returning).
    unsafe {
        libc::_exit(1)
    };
}

/// The command line's command, run.
fn run_command() -> ExitCode {
    let cli = Cli::parse();
    if let Some(filter) = weave_cli::log::filter(cli.log) {
        if let Err(e) = weave_cli::log::init(&filter) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    match cli.command {
        Command::Dump {
            file,
            set,
            passes,
            print_before,
            print_after,
            print_after_change,
            dump_dir,
            list_passes,
            kernels,
            sms,
            streams,
        } => {
            if list_passes {
                weave_cli::out!("{}", Registry::standard().listing());
                return ExitCode::SUCCESS;
            }
            let Some(file) = file else {
                eprintln!("error: dump needs a FILE (or --list-passes)");
                return ExitCode::FAILURE;
            };
            let given = match (sms, streams) {
                (Some(_), _) => Some("--sms"),
                (None, Some(_)) => Some("--streams"),
                (None, None) => None,
            };
            let target = PlanTarget {
                sms: sms.map_or(DEFAULT_SMS, |n| n as usize),
                streams: streams.map_or(streamweave::RunOptions::default().streams, |k| k as usize),
            };
            if kernels {
                return dump_kernels(&file, &set, target);
            }
            let flags = DumpFlags {
                passes,
                print_before,
                print_after,
                print_after_change,
                dump_dir,
                weave_dump: std::env::var(DUMP_ENV).ok(),
            };
            dump(&file, &set, &flags, target, given)
        }
        Command::Run {
            file,
            ranks,
            no_check,
            set,
            backend,
            streams,
            check_races,
            trace,
            seed,
            timeout_secs,
            json,
            warmup,
            chunks,
            iters,
            eager,
            transport,
            ordered_compute,
            pool_priority,
            comm_priority,
            gemm_sm_margin,
            nccl_max_ctas,
            nccl_cta_policy,
            nccl_window_mib,
            ce_slot_mib,
            gemm_into_windows,
            no_tune,
            tune_budget_secs,
            tune_copy_engines,
        } => {
            let Some(cuda) = is_cuda(backend.as_deref()) else {
                return ExitCode::FAILURE;
            };
            let transport = match transport.as_deref() {
                None => None,
                Some("nccl") => Some(streamweave::Transport::Nccl),
                Some("copy-engine") => Some(streamweave::Transport::CopyEngine),
                Some(t) => {
                    eprintln!(
                        "error: --transport {t}: unknown transport (expected nccl or copy-engine)"
                    );
                    return ExitCode::FAILURE;
                }
            };
            let pinned = weave_cli::cli::Pinned {
                transport,
                ordered_compute,
                pool_priority_high: pool_priority,
                comm_priority_high: comm_priority,
                gemm_sm_margin,
                nccl_max_ctas: nccl_max_ctas.map(|m| m.0),
                nccl_cta_policy: nccl_cta_policy.map(|p| p.0),
                nccl_window_mib,
                ce_slot_mib,
                gemm_into_windows,
            };
            if !cuda {
                let gpu_only = [
                    (warmup > 0, "--warmup"),
                    (iters > 0, "--iters"),
                    (eager, "--eager"),
                    (
                        transport == Some(streamweave::Transport::CopyEngine),
                        "--transport copy-engine",
                    ),
                    (ordered_compute.is_some(), "--ordered-compute"),
                    (pool_priority.is_some(), "--pool-priority"),
                    (comm_priority.is_some(), "--comm-priority"),
                    (gemm_sm_margin.is_some(), "--gemm-sm-margin"),
                    (nccl_max_ctas.is_some(), "--nccl-max-ctas"),
                    (nccl_cta_policy.is_some(), "--nccl-cta-policy"),
                    (nccl_window_mib.is_some(), "--nccl-window-mib"),
                    (ce_slot_mib.is_some(), "--ce-slot-mib"),
                    (gemm_into_windows.is_some(), "--gemm-into-windows"),
                    (tune_copy_engines == Some(true), "--tune-copy-engines on"),
                ];
                if let Some((_, flag)) = gpu_only.iter().find(|f| f.0) {
                    eprintln!("error: {flag} needs --backend cuda");
                    return ExitCode::FAILURE;
                }
            }
            if tune_copy_engines == Some(true) && no_tune {
                eprintln!("error: --tune-copy-engines on asks the first run's tuning, which --no-tune turns off");
                return ExitCode::FAILURE;
            }
            let options = streamweave::RunOptions {
                streams: streams.map_or(2, count),
                check_races,
                trace: trace.is_some(),
                timeouts: streamweave::Timeouts::all(Duration::from_secs(timeout_secs)),
                warmup: count(warmup),
                iters: count(iters),
                gpu: streamweave::GpuRunOptions {
                    replay: !eager,
                    // The command line tunes its first repeated run itself (it caches across
                    // processes): the library's tuning of a second call never applies.
                    tune: None,
                    ..streamweave::GpuRunOptions::default()
                },
                ..streamweave::RunOptions::default()
            };
            let json = weave_cli::cli::RunFlags {
                ranks,
                cuda,
                seed,
                no_check,
                path: json,
                chunks: chunks.0,
                streams_given: streams.is_some(),
                weave_dump: std::env::var(DUMP_ENV).ok(),
                pinned,
                tune_budget: (!no_tune).then(|| Duration::from_secs(tune_budget_secs)),
                tune_copy_engines: tune_copy_engines.unwrap_or(true),
            };
            weave_cli::cli::run(&file, &set, &options, trace.as_deref(), &json)
        }
        Command::Tune {
            file,
            set,
            ranks,
            backend,
            iters,
            warmup,
            cache,
            timeout_secs,
            copy_engines,
        } => {
            let Some(cuda) = is_cuda(backend.as_deref()) else {
                return ExitCode::FAILURE;
            };
            let flags = weave_cli::cli::TuneFlags {
                ranks,
                cuda,
                iters: count(iters),
                warmup: count(warmup),
                cache,
                timeout: Duration::from_secs(timeout_secs),
                copy_engines,
            };
            weave_cli::cli::tune(&file, &set, &flags)
        }
        Command::Calibrate {
            ranks,
            out,
            timeout_secs,
        } => weave_cli::cli::calibrate(ranks, out, Duration::from_secs(timeout_secs)),
        Command::Launch {
            nprocs,
            timeout_secs,
            grace_secs,
            master_addr,
            master_port,
            command,
        } => {
            let options = weave_cli::launch::LaunchOptions {
                nprocs,
                command,
                timeout: Duration::from_secs(timeout_secs),
                grace: Duration::from_secs(grace_secs),
                master_addr,
                master_port,
            };
            launch(&options)
        }
    }
}

/// Runs `weave launch` and prints its verdict on stderr: one line per failed rank.
fn launch(options: &weave_cli::launch::LaunchOptions) -> ExitCode {
    use weave_cli::launch::LaunchError;
    match weave_cli::launch::launch(options) {
        Ok(report) => {
            eprintln!(
                "launch: all {} rank(s) succeeded in {:.1} s",
                report.ranks.len(),
                report.wall.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e @ LaunchError::Failed(_)) => {
            for line in e.to_string().lines() {
                eprintln!("launch: {line}");
            }
            match e {
                LaunchError::Failed(report) if report.timed_out() => ExitCode::from(124),
                // A launcher stopped by a signal exits as the shells report it: 128 + signal.
                LaunchError::Failed(report) => match report.interrupted() {
                    Some(sig) => ExitCode::from(128u8.saturating_add(sig as u8)),
                    None => ExitCode::FAILURE,
                },
                _ => ExitCode::FAILURE,
            }
        }
        Err(e) => {
            eprintln!("error: launch: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The SM count `weave dump` sizes kernel grids for without `--sms` (an H100 SXM's).
const DEFAULT_SMS: usize = 132;

/// What `weave dump` plans kernels for: GPUs of `sms` SMs, a pool of `streams` streams.
#[derive(Clone, Copy)]
struct PlanTarget {
    sms: usize,
    streams: usize,
}

/// Loads and compiles `file`, then prints the CUDA C of its kernel table for `target`;
/// every failure is reported on stderr with exit status 1.
fn dump_kernels(file: &Path, set: &[(String, i64)], target: PlanTarget) -> ExitCode {
    let text = (|| -> Result<String, String> {
        let fusion = streamweave::load_file(file, set).map_err(|e| e.to_string())?;
        let exe = streamweave::Compiler::new()
            .compile(&fusion)
            .map_err(|e| e.to_string())?;
        let table = exe
            .kernel_table(exe.min_ranks(), target.streams, target.sms)
            .map_err(|e| e.to_string())?;
        Ok(streamweave::kernels::print_kernels(&table))
    })();
    print_or_report(text)
}

/// The kernel table of a printed host program, as `//` lines that follow it (the program
/// parses back with them): its plans on the ranks its meshes name, for `target`,
/// or why there are none (a kernel the code generator cannot plan is named there; the
/// program is still printed, for the CPU backend runs it).
fn kernel_plans(program: &weave_host_ir::HostProgram, target: PlanTarget) -> String {
    let table = streamweave::Executable::from_program(program.clone())
        .map_err(|e| e.to_string())
        .and_then(|exe| {
            exe.kernel_table(exe.min_ranks(), target.streams, target.sms)
                .map_err(|e| e.to_string())
        });
    match table {
        Ok(table) => streamweave::kernels::print_plans(&table),
        Err(e) => e
            .lines()
            .enumerate()
            .map(|(k, line)| match k {
                0 => format!("// Kernel plans: none: {line}\n"),
                _ => format!("//   {line}\n"),
            })
            .collect(),
    }
}

/// Prints `text` on stdout (a closed pipe ends the process quietly:
/// weave_cli::output::Stdout), or reports its error on stderr with exit status 1.
fn print_or_report(text: Result<String, impl std::fmt::Display>) -> ExitCode {
    match text {
        Ok(text) => match weave_cli::output::Stdout.write_all(text.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: cannot write the output: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Loads `file`, runs the pipeline `flags` ask for, printing its dumps, then prints the IR it
/// leaves, a host program followed by its kernel plans for `target`; every failure is
/// reported on stderr with exit status 1 (the flag `given` of `target`, with no host
/// program to plan, is one).
fn dump(
    file: &Path,
    set: &[(String, i64)],
    flags: &DumpFlags,
    target: PlanTarget,
    given: Option<&str>,
) -> ExitCode {
    let text = (|| -> Result<String, String> {
        let manager = PassManager::from_flags(flags).map_err(|e| e.to_string())?;
        let fusion = streamweave::load_file(file, set).map_err(|e| e.to_string())?;
        // A closed pipe ends the process quietly (weave_cli::output::Stdout).
        let ir = manager
            .run_with_output(Ir::Fusion(fusion), &mut weave_cli::output::Stdout)
            .map_err(|e| e.to_string())?;
        let mut text = weave_passes::manager::render(&ir);
        match &ir {
            Ir::Host(program) => text.push_str(&kernel_plans(program, target)),
            _ if given.is_some() => {
                return Err(format!(
                    "{} sets what the kernel plans printed after a host program, or with \
                     --kernels, are for; this dump prints a {} (run the pipeline to the host \
                     program: --passes default)",
                    given.unwrap_or_default(),
                    ir.form()
                ))
            }
            _ => {}
        }
        Ok(text)
    })();
    print_or_report(text)
}

/// Whether `--backend` names the CUDA backend (`None`: the CPU default); an unknown one is
/// reported and gives `None`.
fn is_cuda(backend: Option<&str>) -> Option<bool> {
    match backend {
        None | Some("cpu") => Some(false),
        #[cfg(feature = "cuda")]
        Some("cuda") => Some(true),
        #[cfg(not(feature = "cuda"))]
        Some("cuda") => {
            eprintln!("error: --backend cuda: {}", weave_cli::cli::NO_CUDA_FEATURE);
            None
        }
        Some(b) => {
            eprintln!("error: --backend {b}: unknown backend (expected cpu or cuda)");
            None
        }
    }
}
