//! The `leadrouter` command line (SPEC section 3): parses arguments and hands
//! off to the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use leadrouter::config::{self, LogFormat, Settings, DEFAULT_CONFIG_PATH};
use leadrouter::startup::Application;
use leadrouter::telemetry;

/// mimalloc: glibc's malloc and free were a quarter of the service's CPU
/// while routing.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "leadrouter",
    version,
    about = "Store-first lead intake and routing"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run migrations, then serve.
    Serve(ConfigArg),
    /// Validate the configuration and print a summary.
    CheckConfig(ConfigArg),
    /// Run pending migrations and exit.
    Migrate(ConfigArg),
    /// Serve a self-contained demo (SQLite in data/demo, demo buyers, a demo form).
    Demo,
    /// Re-derive a source's normalised fields from the stored raw payloads.
    Renormalize(RenormalizeArgs),
    /// Release evidence after a deploy: a marked test lead end to end.
    VerifyRelease(VerifyReleaseArgs),
    /// Run a buyer API simulator (POST /ping and /post).
    MockBuyer(MockBuyerArgs),
}

#[derive(clap::Args)]
struct VerifyReleaseArgs {
    /// The live service, e.g. https://leads.example.com
    #[arg(long)]
    url: String,
    /// The source the test lead is sent as
    #[arg(long)]
    source: String,
    /// The admin token, for reading the stored lead back
    #[arg(long, env = "LEADROUTER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// A feed source's key
    #[arg(long, env = "LEADROUTER_SOURCE_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// How long the notify channels may take to confirm
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    wait: std::time::Duration,
}

#[derive(clap::Args)]
struct RenormalizeArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The source whose leads to re-derive
    #[arg(long)]
    source: String,
    /// How far back, e.g. 7d or 12h
    #[arg(long, value_parser = humantime::parse_duration)]
    since: std::time::Duration,
}

#[derive(clap::Args)]
struct MockBuyerArgs {
    /// Address to listen on, e.g. 127.0.0.1:9001
    #[arg(long)]
    listen: String,
    /// Share of pings and posts accepted (0..1)
    #[arg(long, default_value_t = 0.5)]
    accept_rate: f64,
    /// Time before each answer, e.g. 200ms
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    latency: std::time::Duration,
    /// Share of calls answered 503 (0..1)
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Never answer (a buyer that hangs)
    #[arg(long)]
    hang: bool,
}

#[derive(clap::Args)]
struct ConfigArg {
    /// Configuration file [default: $LEADROUTER_CONFIG or config/leadrouter.toml]
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ConfigArg {
    fn path(&self) -> PathBuf {
        self.config
            .clone()
            .or_else(|| std::env::var_os("LEADROUTER_CONFIG").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig(arg) => return check_config(&arg.path()),
        Command::Serve(arg) => configured(&arg.path()).and_then(|settings| run(serve(settings))),
        Command::Migrate(arg) => {
            configured(&arg.path()).and_then(|settings| run(migrate(settings)))
        }
        Command::Demo => leadrouter::demo::prepare().and_then(|demo| {
            telemetry::init(demo.settings.log.format);
            run(demo.run())
        }),
        Command::Renormalize(args) => configured(&args.config.path())
            .and_then(|settings| run(renormalize(settings, args.source, args.since))),
        Command::VerifyRelease(args) => {
            telemetry::init(LogFormat::Text);
            run(leadrouter::verify_release::run(
                leadrouter::verify_release::Check {
                    url: args.url,
                    source: args.source,
                    admin_token: args.admin_token,
                    api_key: args.api_key,
                    wait: args.wait,
                },
            ))
        }
        Command::MockBuyer(args) => {
            telemetry::init(LogFormat::Text);
            let behaviour = leadrouter::mock_buyer::Behaviour {
                accept_rate: args.accept_rate,
                latency: args.latency,
                fail_rate: args.fail_rate,
                hang: args.hang,
            };
            run(async move { leadrouter::mock_buyer::run(&args.listen, behaviour).await })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            telemetry::report_failure(&error);
            ExitCode::FAILURE
        }
    }
}

/// Loads the configuration, and starts the log in the format it names
/// (before anything else logs: the subscriber is installed once).
fn configured(path: &Path) -> anyhow::Result<Settings> {
    let settings = config::load(path)?;
    telemetry::init(settings.log.format);
    Ok(settings)
}

fn run(future: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    actix_web::rt::System::new().block_on(future)
}

fn check_config(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(settings) => {
            println!("{}", config::summary(path, &settings));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let host = settings
        .server
        .listen
        .rsplit_once(':')
        .map_or("127.0.0.1", |(host, _)| host)
        .to_string();
    let application = Application::build(settings).await?;
    // On stdout, for people and for tools that start us on port 0.
    println!(
        "leadrouter listening on http://{host}:{}",
        application.port()
    );
    application.run_until_stopped().await?;
    Ok(())
}

async fn renormalize(
    settings: Settings,
    source: String,
    since: std::time::Duration,
) -> anyhow::Result<()> {
    let report = leadrouter::renormalize::run(&settings, &source, since).await?;
    println!("source {source}: {report}");
    Ok(())
}

async fn migrate(settings: Settings) -> anyhow::Result<()> {
    let store = leadrouter::store::Store::connect(&settings.database).await?;
    store.migrate().await?;
    println!("migrations applied to {}", settings.database.display_url());
    Ok(())
}
