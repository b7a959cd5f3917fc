//! Startup glue: CLI, tracing, config, then `app::run`. Exit codes: 64 for a bad config (before any
//! port is bound), 1 for a failed start, 74 (`EX_IOERR`) when the log's storage fails.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mcp_resume_proxy::config::{Config, Overrides};

#[derive(Parser, Debug)]
#[command(
    name = "mcp-resume-proxy",
    version,
    about = "Durable, gap-free resumption for legacy HTTP+SSE MCP servers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args, Debug, Default, Clone)]
struct RunArgs {
    /// TOML config file (see proxy.toml.example).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Upstream SSE URL (overrides upstream.sse_url).
    #[arg(long, global = true)]
    upstream: Option<String>,
    /// Client listener address (overrides listen.addr).
    #[arg(long, global = true)]
    listen: Option<String>,
    /// Admin listener address (overrides admin.addr).
    #[arg(long = "admin-listen", global = true)]
    admin_listen: Option<String>,
    /// Log directory (overrides log.dir).
    #[arg(long = "data-dir", global = true)]
    data_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the proxy (the default).
    Run,
    /// Run an embedded legacy MCP upstream, the proxy, and a narrated client that disconnects,
    /// resumes, and meets a refusal.
    Demo,
    /// Run only the embedded legacy MCP upstream of the demo (for load and chaos harnesses).
    #[command(hide = true)]
    DemoUpstream {
        /// Address to listen on.
        #[arg(long = "at", default_value = "127.0.0.1:8000")]
        at: String,
        /// Use CRLF line endings (like Python servers).
        #[arg(long)]
        crlf: bool,
    },
    /// Read a data directory: sessions, epochs, heads; or the events of one session.
    Inspect {
        /// A session id to list the events of.
        session: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("MCP_RESUME_PROXY_LOG")
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(match cli.cmd {
                Some(Cmd::Demo) => "error",
                _ => "info",
            })
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let over = Overrides {
        upstream: cli.run.upstream.clone(),
        listen: cli.run.listen.clone(),
        admin_listen: cli.run.admin_listen.clone(),
        data_dir: cli.run.data_dir.clone(),
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-resume-proxy: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match cli.cmd {
        None | Some(Cmd::Run) => {
            let cfg = match Config::load(cli.run.config.as_deref(), &over) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("mcp-resume-proxy: {e}");
                    return ExitCode::from(64);
                }
            };
            // The signal handlers are installed before anything starts (see `shutdown::signal`).
            match rt.block_on(async {
                let shutdown = mcp_resume_proxy::shutdown::signal();
                mcp_resume_proxy::app::run(cfg, shutdown).await
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mcp-resume-proxy: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Some(Cmd::Demo) => match rt.block_on(mcp_resume_proxy::demo::run()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo failed: {e}");
                ExitCode::from(1)
            }
        },
        Some(Cmd::DemoUpstream { at, crlf }) => {
            use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
            let served = rt.block_on(async {
                let listener = tokio::net::TcpListener::bind(&at).await?;
                println!(
                    "demo upstream listening on http://{}/sse",
                    listener.local_addr()?
                );
                let opts = UpstreamOptions {
                    crlf,
                    ping_secs: None,
                };
                Upstream::serve(listener, opts, mcp_resume_proxy::shutdown::signal()).await
            });
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("demo-upstream: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Some(Cmd::Inspect { session }) => {
            let dir = cli.run.data_dir.clone().or_else(|| {
                Config::load(cli.run.config.as_deref(), &over)
                    .ok()
                    .map(|c| c.log.dir)
            });
            let Some(dir) = dir else {
                eprintln!("mcp-resume-proxy: inspect needs --data-dir or a valid --config");
                return ExitCode::from(64);
            };
            match mcp_resume_proxy::inspect::run(&dir, session.as_deref(), &mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mcp-resume-proxy: inspect: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
