//! Command-line arguments. ackd is configured by its environment only; arguments never
//! start consuming. `--help` and `--version` answer and exit 0, anything else exits 64
//! (EX_USAGE) with the usage. The subcommands `ackd check` and `ackd status` ask the
//! brokers and exit; they take no options (settings come from the environment).
//!
//! Hand-rolled: two flags and two bare subcommands do not need a parser crate (nor its
//! build time); once subcommands take options, lexopt is the small step up.

use std::ffi::OsString;
use std::fmt::{self, Write as _};

use crate::settings::{self, DefaultValue};

/// What the arguments ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// No arguments: consume, with settings from the environment.
    Run,
    /// `--help`, `-h`: every setting with its default.
    Help,
    /// `--version`, `-V`.
    Version,
    /// `check`: validate the settings, connect, authenticate, look for every topic and
    /// the group; one line per check (src/commands/check.rs).
    Check,
    /// `status`: per partition the committed offset, the log end, the lag and the member
    /// holding it (src/commands/status.rs).
    Status,
}

/// Arguments ackd does not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError {
    pub argument: String,
    pub problem: &'static str,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.problem, self.argument)
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut args = args.into_iter();
    let Some(first) = args.next() else {
        return Ok(Command::Run);
    };
    let command = match first.to_str() {
        Some("--help" | "-h" | "help") => Command::Help,
        Some("--version" | "-V") => Command::Version,
        Some("check") => Command::Check,
        Some("status") => Command::Status,
        _ => {
            return Err(UsageError {
                argument: first.to_string_lossy().into_owned(),
                problem: "unknown argument",
            })
        }
    };
    match args.next() {
        None => Ok(command),
        Some(extra) => Err(UsageError {
            argument: extra.to_string_lossy().into_owned(),
            problem: "unexpected argument",
        }),
    }
}

/// The usage: what a wrong argument is answered with (on stderr), and the head of `--help`.
pub const USAGE: &str = "\
Usage: ackd             consume the topics the environment names, until SIGTERM
       ackd check       check the settings, the brokers, the credentials, the topics and
                        the group, one line each; exit 0, or 78 / 77 / 69 as ackd would
       ackd status      per partition: committed offset, log end, lag, the member holding it
       ackd --help      every setting with its default (also -h)
       ackd --version   the version (also -V)

ackd takes its settings from environment variables only; `ackd --help` lists them.";

/// `ackd --version`: ackd's version and the librdkafka it runs on.
pub fn version() -> String {
    let (_, rdkafka) = rdkafka::util::get_rdkafka_version();
    format!("ackd {} (librdkafka {rdkafka})", env!("CARGO_PKG_VERSION"))
}

/// `ackd --help`: the usage, then every setting with its default (from
/// `config/default.toml`, see [`settings::documented`]) and what it does.
pub fn help() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ackd {}: a Kafka consumer daemon; at-least-once, no redelivery after a graceful stop.\n",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(out, "{USAGE}\n");
    let _ = writeln!(
        out,
        "Settings (a TOML file named by ACKD_CONFIG_FILE takes the same keys, lower-cased,\n\
         without ACKD_; the environment wins). NAME  DEFAULT  MEANING:"
    );
    let rows: Vec<(String, String, &str)> = settings::documented()
        .into_iter()
        .map(|(name, default)| {
            let default = match default {
                DefaultValue::Required => "required".to_string(),
                DefaultValue::None if name.ends_with("<NAME>") => "(below)".to_string(),
                DefaultValue::None => "none".to_string(),
                DefaultValue::Value(v) => v,
            };
            let meaning = meaning(&name).unwrap_or("");
            (name, default, meaning)
        })
        .collect();
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let default_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    for (name, default, meaning) in &rows {
        let _ = writeln!(
            out,
            "  {name:name_width$}  {default:default_width$}  {meaning}"
        );
    }
    let _ = writeln!(
        out,
        "\nlibrdkafka properties ackd sets unless ACKD_RDKAFKA_<NAME> or [rdkafka] does:"
    );
    for (property, value) in settings::rdkafka_defaults() {
        let _ = writeln!(out, "    {property}={value}");
    }
    let _ = writeln!(
        out,
        "\nMore in docs/ beside the README: settings.md, guarantees.md, observability.md (log\nlines, exit codes), exec.md, http.md."
    );
    out
}

/// One line per setting for `--help` (declared with the setting, see
/// [`settings::help_line`]); docs/settings.md has the long form.
fn meaning(name: &str) -> Option<&'static str> {
    settings::help_line(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn flags_and_errors() {
        assert_eq!(parse(args(&[])), Ok(Command::Run));
        for a in ["--help", "-h", "help"] {
            assert_eq!(parse(args(&[a])), Ok(Command::Help));
        }
        for a in ["--version", "-V"] {
            assert_eq!(parse(args(&[a])), Ok(Command::Version));
        }
        assert_eq!(parse(args(&["check"])), Ok(Command::Check));
        assert_eq!(parse(args(&["status"])), Ok(Command::Status));
        assert_eq!(
            parse(args(&["status", "--all"])).unwrap_err().problem,
            "unexpected argument"
        );
        for bad in [
            &["-x"][..],
            &["--version=1"],
            &["run"],
            &["-hV"],
            &[""],
            &["Check"],
        ] {
            assert_eq!(parse(args(bad)).unwrap_err().problem, "unknown argument");
        }
        let e = parse(args(&["--help", "more"])).unwrap_err();
        assert_eq!(e.to_string(), "unexpected argument `more`");
        // Not UTF-8: named as well as it can be, no panic.
        use std::os::unix::ffi::OsStringExt;
        let e = parse(vec![OsString::from_vec(vec![0x66, 0xff])]).unwrap_err();
        assert_eq!(e.argument, "f\u{fffd}");
    }

    /// Every setting has a meaning, and a name that is no setting has none: a new
    /// setting cannot be left out of --help.
    #[test]
    fn every_setting_has_a_meaning() {
        let names: Vec<String> = settings::documented().into_iter().map(|(n, _)| n).collect();
        for name in &names {
            assert!(meaning(name).is_some(), "{name} has no line in MEANINGS");
        }
        for name in [
            "ACKD_TEST_DELAY_MS",
            "ACKD_NOT_A_SETTING",
            "ACKD_RDKAFKA_X",
            "HOSTNAME",
        ] {
            assert!(meaning(name).is_none(), "{name} is no setting");
        }
        let help = help();
        assert!(help.contains("ACKD_COMMIT_INTERVAL_MS"));
        assert!(help.contains("partition.assignment.strategy=cooperative-sticky"));
    }
}
