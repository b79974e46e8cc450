//! The `condenser` command: parses arguments and hands over to the library.

// The commands' output is meant for stdout.
#![allow(clippy::print_stdout)]

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand, ValueEnum};
use condenser::cli::{self, LogFormat, PlanOptions, ReplayOptions};
use condenser::compaction::plan::Mode;
use condenser::config::{Config, Overrides};
use condenser::dialect::{self, Api, DIALECTS};
use condenser::server::admission::raise_open_files_limit;
use condenser::server::allocator::keep_freed_memory;
use condenser::server::serve::{shutdown_signal, Server};

// Many small allocations per request (JSON values, headers, buffers): mimalloc serves them
// faster than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "condenser",
    version,
    about = "OpenAI-compatible proxy that keeps long conversations inside the context window"
)]
struct Args {
    /// Config file (default: $CONDENSER_CONFIG, else ./config.toml when present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Listen address, overriding server.listen.
    #[arg(long)]
    listen: Option<String>,
    /// Default upstream base URL, overriding upstream.base_url.
    #[arg(long)]
    upstream: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    log_format: Format,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config and print the effective settings.
    CheckConfig { path: Option<PathBuf> },
    /// Print the prompt-token count of a request body: Chat Completions, Responses or
    /// Anthropic Messages.
    Count {
        #[arg(long)]
        model: Option<String>,
        /// The body's API; detected from its fields when not given.
        #[arg(long, value_parser = api_named())]
        api: Option<Api>,
        #[arg(long)]
        json: bool,
        /// Request file, or - for stdin (the default).
        file: Option<String>,
    },
    /// Show what the proxy would do with a request, calling nothing.
    Plan {
        #[arg(long)]
        model: Option<String>,
        /// The body's API; detected from its fields when not given.
        #[arg(long, value_parser = api_named())]
        api: Option<Api>,
        /// auto, off or force, as the x-condenser-mode header.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// A [profiles.NAME], as the x-condenser-profile header.
        #[arg(long)]
        profile: Option<String>,
        file: Option<String>,
    },
    /// Replay a recorded session, calling nothing: per request, what condenser would forward,
    /// each cache break and why, and the bill against the session as sent.
    Replay {
        #[arg(long)]
        model: Option<String>,
        /// The bodies' API; detected from their fields when not given.
        #[arg(long, value_parser = api_named())]
        api: Option<Api>,
        /// A [profiles.NAME], as the x-condenser-profile header.
        #[arg(long)]
        profile: Option<String>,
        /// A JSON Lines file of the session's request bodies, in order (zstd-compressed
        /// or not), or - for stdin.
        file: Option<String>,
        /// Also write the session as one self-contained HTML page: a chart of each
        /// conversation, the bill by tier, and what the model was sent.
        #[arg(long, value_name = "OUT")]
        html: Option<PathBuf>,
    },
}

/// `--api`: one of the registered dialects' names, the possible values that turn away any
/// other before it is looked up.
fn api_named() -> impl TypedValueParser<Value = Api> {
    PossibleValuesParser::new(DIALECTS.iter().map(|wire| wire.name)).try_map(|name| {
        dialect::named(&name)
            .map(|wire| wire.api)
            .ok_or("not a dialect's name")
    })
}

/// The request body from `file`, or standard input, zstd-compressed or not; an error names
/// which it could not read.
fn read_input(file: Option<&str>) -> Result<String, String> {
    let (bytes, name) = match file {
        None | Some("-") => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| format!("cannot read the request from standard input: {e}"))?;
            (bytes, "standard input")
        }
        Some(path) => (
            std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?,
            path,
        ),
    };
    cli::decoded_input(bytes).map_err(|e| format!("cannot read {name}: {e}"))
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("condenser: {message}");
    ExitCode::FAILURE
}

// The server runs one current-thread runtime per worker; this one is worker 0.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    cli::init_logging(match args.log_format {
        Format::Text => LogFormat::Text,
        Format::Json => LogFormat::Json,
    });
    let overrides = Overrides {
        listen: args.listen.clone(),
        upstream: args.upstream.clone(),
    };
    let command = args.command;
    if let Some(Command::CheckConfig { path }) = &command {
        let path = path.as_deref().or(args.config.as_deref());
        return match cli::check_config(path, &overrides) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        };
    }
    let config = match cli::load_config(args.config.as_deref(), &overrides) {
        Ok(config) => config,
        Err(e) => return fail(e),
    };
    let output = match command {
        None | Some(Command::CheckConfig { .. }) => return serve(config).await,
        Some(Command::Count {
            model,
            api,
            json,
            file,
        }) => match read_input(file.as_deref()) {
            Ok(input) => cli::count(&config, &input, model.as_deref(), api, json).await,
            Err(e) => return fail(e),
        },
        Some(Command::Plan {
            model,
            api,
            mode,
            profile,
            file,
        }) => {
            let Some(mode) = Mode::parse(&mode) else {
                return fail("--mode must be auto, off or force");
            };
            match read_input(file.as_deref()) {
                Ok(input) => {
                    let options = PlanOptions {
                        model: model.as_deref(),
                        api,
                        mode,
                        profile: profile.as_deref(),
                    };
                    cli::plan(&config, &input, options).await
                }
                Err(e) => return fail(e),
            }
        }
        Some(Command::Replay {
            model,
            api,
            profile,
            file,
            html,
        }) => match read_input(file.as_deref()) {
            Ok(input) => {
                let options = ReplayOptions {
                    model: model.as_deref(),
                    api,
                    profile: profile.as_deref(),
                };
                match cli::replay(&config, &input, options).await {
                    Ok(replay) => match html {
                        None => Ok(replay.table),
                        Some(out) => {
                            // The file's name, not where it lies on this machine.
                            let name = file
                                .as_deref()
                                .map(std::path::Path::new)
                                .and_then(std::path::Path::file_name)
                                .map_or("standard input".into(), |name| name.to_string_lossy());
                            let title = format!("condenser replay of {name}");
                            if let Err(e) = std::fs::write(&out, replay.html(&title)) {
                                return fail(format!("cannot write {}: {e}", out.display()));
                            }
                            Ok(replay.table)
                        }
                    },
                    Err(e) => Err(e),
                }
            }
            Err(e) => return fail(e),
        },
    };
    match output {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

async fn serve(config: Config) -> ExitCode {
    keep_freed_memory();
    match raise_open_files_limit() {
        Ok(files) => tracing::info!(files, "open files allowed"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(e) => return fail(e),
    };
    let addr = server.local_addr();
    tracing::info!(%addr, "condenser listening");
    server.serve(shutdown_signal()).await;
    ExitCode::SUCCESS
}
