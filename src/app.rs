//! The process from its arguments to its exit: arguments, settings, logging, the panic
//! hook, then `ackd check`, `ackd status` or the daemon, and the end of the process once
//! every line is written ([`exit::end_process`]).

use std::process::ExitCode;

use crate::processors::processor::Processor;
use crate::processors::schema_registry::{Decoder, Decoding};
use crate::settings::SettingError;
use crate::settings::Settings;
use crate::{cli, commands, consumer, exit, output, settings};

/// [`crate::main_with`]: arguments first, then the settings, logging and the panic hook,
/// then the command or the daemon; the process ends here once the settings are read.
pub(crate) fn main_with<P: Processor>(
    make: impl FnOnce(&Settings) -> Result<P, SettingError>,
) -> ExitCode {
    // Arguments first: they answer without reading a setting, and never consume.
    let command = match parse_arguments() {
        Ok(command) => command,
        Err(code) => return code,
    };
    let settings = read_settings();
    let guard = start_logging(&command, &settings);
    let exit_wait = exit_wait(&settings);
    if command == cli::Command::Check || command == cli::Command::Status {
        run_command(&command, settings, make, guard, exit_wait);
    }
    let code = match settings.and_then(|s| with_decoding(&s, make).map(|p| (s, p))) {
        Ok((settings, processor)) => consumer::daemon::run(settings, processor),
        Err(e) => {
            settings::report_setting_error(&e);
            tracing::info!(at = "exit", code = exit::CONFIG);
            exit::CONFIG
        }
    };
    exit::end_process(guard, code, exit_wait)
}

/// How long the exit waits for a slow stdout to take every line: the shutdown timeout.
/// Refused settings leave a few lines, one write: a stdout that takes none for
/// `lines::STALL` is stuck, so that bounds the wait.
fn exit_wait(settings: &Result<Settings, SettingError>) -> std::time::Duration {
    settings
        .as_ref()
        .map_or(output::lines::STALL, |s| s.shutdown_timeout)
}

/// The processor `make` builds, its messages decoded as `ACKD_VALUE_FORMAT` and
/// `ACKD_KEY_FORMAT` say (raw by default: then it is called as it is).
fn with_decoding<P: Processor>(
    settings: &Settings,
    make: impl FnOnce(&Settings) -> Result<P, SettingError>,
) -> Result<Decoding<P>, SettingError> {
    let decoder = Decoder::from_settings(settings)?;
    Ok(Decoding::new(make(settings)?, decoder))
}

/// The command the arguments name (`Run`, `Check` or `Status`); `Err`: the process's
/// exit code once `--help`, `--version` or a usage error is answered.
fn parse_arguments() -> Result<cli::Command, ExitCode> {
    match cli::parse(std::env::args_os().skip(1)) {
        Ok(command @ (cli::Command::Run | cli::Command::Check | cli::Command::Status)) => {
            Ok(command)
        }
        Ok(cli::Command::Help) => Err(print_out(&cli::help())),
        Ok(cli::Command::Version) => Err(print_out(&format!("{}\n", cli::version()))),
        Err(e) => {
            use std::io::Write;
            // A closed stderr changes nothing: the exit code says it.
            let _ = write!(std::io::stderr().lock(), "ackd: {e}\n\n{}\n", cli::USAGE);
            Err(ExitCode::from(exit::USAGE as u8))
        }
    }
}

/// The settings from the environment, their secret values registered so that no line
/// shows them.
fn read_settings() -> Result<Settings, SettingError> {
    let settings = Settings::from_env();
    // From here on no line carries a secret value, whatever path it takes: what the
    // variables hold is known even when they are refused (a refusal is a line too).
    let mut never_shown = settings::never_shown_in_vars(utf8_vars());
    if let Ok(s) = &settings {
        never_shown.extend(s.never_shown());
    }
    settings::secret::register(never_shown);
    settings
}

/// Starts the line writer at the settings' level (a default one if they were refused)
/// and installs the panic hook.
fn start_logging(
    command: &cli::Command,
    settings: &Result<Settings, SettingError>,
) -> output::lines::OutputGuard {
    let (mut level, prefix) = match settings {
        Ok(s) => (s.logging.log_level.clone(), s.logging.metric_prefix.clone()),
        Err(_) => ("info".to_string(), "ackd".to_string()),
    };
    // The info lines of `check` and `status` are their output, not log lines: a quiet
    // ACKD_LOG_LEVEL must not silence them.
    if matches!(command, cli::Command::Check | cli::Command::Status)
        && matches!(level.as_str(), "error" | "warn")
    {
        level = "info".to_string();
    }
    let (guard, rust_log_error) = output::lines::init(&level, &prefix);
    exit::install_panic_hook();
    if let Some(e) = rust_log_error {
        tracing::warn!(
            at = "config_warning",
            setting = "RUST_LOG",
            "{e}; using ACKD_LOG_LEVEL"
        );
    }
    guard
}

/// `ackd check` / `ackd status`: the settings, then questions to the brokers. check
/// builds the processor to validate its settings, as the daemon would, and drops it
/// unused (building starts nothing: exec handlers start on the first message).
fn run_command<P: Processor>(
    command: &cli::Command,
    settings: Result<Settings, SettingError>,
    make: impl FnOnce(&Settings) -> Result<P, SettingError>,
    guard: output::lines::OutputGuard,
    exit_wait: std::time::Duration,
) -> ! {
    let check = *command == cli::Command::Check;
    let started = std::time::Instant::now();
    let settings = match settings {
        Ok(s) if check => make(&s).map(|_unused| s),
        other => other,
    };
    let code = match &settings {
        Ok(s) if check => commands::check::run(s),
        Ok(s) => commands::status::run(s),
        Err(e) => {
            settings::report_setting_error(e);
            if check {
                tracing::error!(
                    at = "check",
                    check = "settings",
                    ok = false,
                    setting = &e.setting
                );
            }
            exit::CONFIG
        }
    };
    if check || code != exit::OK {
        tracing::info!(
            at = "exit",
            code,
            duration_ms = started.elapsed().as_millis() as u64
        );
    }
    exit::end_process(guard, code, exit_wait)
}

/// Writes `text` to stdout for `--help`/`--version`; a closed pipe (`ackd --help | head`)
/// is no error worth a panic.
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    ExitCode::SUCCESS
}

/// The environment's variables that are UTF-8 (`std::env::vars` panics on others).
fn utf8_vars() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}
