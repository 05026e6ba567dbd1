//! Command-line arguments: they never start consuming. `--help`
//! lists every setting with its default, `--version` prints the version, anything else
//! exits 64 (EX_USAGE) with the usage. Checked with the environment fully set against the
//! real broker, so that a binary that ignored its arguments would visibly consume.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

/// `ackd ARGS` with no environment but PATH: the help and the version need none.
fn bare(args: &[&str]) -> AckdProcess {
    let mut b = AckdBuilder::on("127.0.0.1:1", "t", "g")
        .env_remove("KAFKA_URL")
        .env_remove("ACKD_TOPICS")
        .env_remove("ACKD_GROUP_ID");
    for a in args {
        b = b.arg(*a);
    }
    b.spawn()
}

fn stdout_text(p: &AckdProcess) -> String {
    p.stdout_lines().join("\n")
}

#[test]
fn version_with_the_environment_set_consumes_nothing() {
    let (topic, group) = fresh_topic("cli-version", 2);
    let delivered = produce_keyed(&topic, 20, 0);
    assert_eq!(delivered.len(), 20);
    for flag in ["--version", "-V"] {
        // STOP_AT_END: a binary that ignored the flag would consume all, commit and exit 0.
        let ackd = AckdBuilder::new(&topic, &group)
            .env("ACKD_STOP_AT_END", "true")
            .env("ACKD_COMMIT_INTERVAL_MS", "100")
            .arg(flag)
            .spawn();
        let code = ackd.wait_exit(WAIT);
        let lines = ackd.lines();
        let all = lines.join("\n");
        assert_eq!(code, 0, "{flag}: {all}");
        let out = ackd.stdout_lines();
        assert_eq!(out.len(), 1, "{flag}: one line: {all}");
        let expected = format!("ackd {}", env!("CARGO_PKG_VERSION"));
        assert!(out[0].starts_with(&expected), "{flag}: {all}");
        assert!(out[0].contains("librdkafka 2."), "{flag}: {all}");
        assert!(processed(&lines).is_empty(), "{flag} processed messages");
        assert!(!lines.iter().any(|l| at(l, "start")), "{flag}: {all}");
        assert!(!lines.iter().any(|l| at(l, "assigned")), "{flag}: {all}");
    }
    let committed = committed(&group, &topic, 2);
    assert!(
        committed.values().all(Option::is_none),
        "the group committed: {committed:?}"
    );
}

/// The rows of the first table of `docs` whose header row starts with `header`, each as
/// its trimmed cells (the first one, before the leading `|`, empty).
fn table_rows<'d>(docs: &'d str, header: &str) -> Vec<Vec<&'d str>> {
    docs.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| row.split('|').map(str::trim).collect())
        .collect()
}

/// The settings table of docs/settings.md: every variable named in its first column, and
/// the default column as written.
fn readme_settings() -> Vec<(String, String)> {
    let readme = include_str!("../docs/settings.md");
    let start = readme
        .find("# Settings\n")
        .expect("docs/settings.md has # Settings");
    let mut rows = Vec::new();
    for cells in table_rows(&readme[start..], "| Variable |") {
        let (names, default) = (cells[1], cells[2]);
        for name in names.split('`').skip(1).step_by(2) {
            rows.push((name.to_string(), default.trim_matches('`').to_string()));
        }
    }
    assert!(rows.len() > 30, "{rows:?}");
    rows
}

/// The variables `--help` lists: the first word of each indented line that names one.
fn help_settings(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("ACKD_") || w.starts_with("KAFKA_"))
        .map(str::to_string)
        .collect()
}

#[test]
fn help_lists_every_setting_of_the_readme_with_its_default() {
    for flag in ["--help", "-h"] {
        let ackd = bare(&[flag]);
        let code = ackd.wait_exit(WAIT);
        let help = stdout_text(&ackd);
        assert_eq!(code, 0, "{flag}: {}", ackd.lines().join("\n"));
        assert!(help.contains("Usage: ackd"), "{help}");
        assert!(
            !ackd.lines().iter().any(|l| at(l, "config_error")),
            "{flag} asked for settings: {}",
            ackd.lines().join("\n")
        );

        let readme = readme_settings();
        let in_readme: BTreeSet<String> = readme.iter().map(|(n, _)| n.clone()).collect();
        let in_help = help_settings(&help);
        assert_eq!(
            in_help.difference(&in_readme).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "in --help, not in the settings table of docs/settings.md"
        );
        assert_eq!(
            in_readme.difference(&in_help).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "in the settings table of docs/settings.md, not in --help:\n{help}"
        );
        // Each default docs/settings.md gives as a value is the one --help shows.
        for (name, default) in &readme {
            let line = help
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name.as_str()))
                .unwrap();
            let shown = line.split_whitespace().nth(1).unwrap_or("");
            let expected = match default.as_str() {
                "required" => "required",
                "none" | "empty" => "none",
                // ACKD_RDKAFKA_<NAME>: its defaults are listed per property below.
                "see below" => continue,
                v => v,
            };
            assert!(
                shown.trim_matches(['[', ']']).starts_with(expected),
                "{name}: docs/settings.md says {default:?}, --help says {line:?}"
            );
        }
        // The librdkafka properties ackd sets by default are listed too, each in the
        // table of docs/settings.md with the value --help shows.
        assert!(
            help.contains("partition.assignment.strategy=cooperative-sticky"),
            "{help}"
        );
        let documented = readme_rdkafka_defaults();
        let listed: Vec<(String, String)> = help
            .lines()
            .skip_while(|l| !l.starts_with("librdkafka properties ackd sets"))
            .skip(1)
            .take_while(|l| l.starts_with("    "))
            .filter_map(|l| l.trim().split_once('='))
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect();
        assert!(listed.len() >= 5, "{help}");
        for (property, value) in &listed {
            assert_eq!(
                documented
                    .iter()
                    .find(|(p, _)| p == property)
                    .map(|(_, v)| v),
                Some(value),
                "{property}: --help sets {value}; the librdkafka table of docs/settings.md \
                 must give that default"
            );
        }
    }
}

/// The table of librdkafka properties ackd sets in docs/settings.md: each property and
/// the first value of its default column.
fn readme_rdkafka_defaults() -> Vec<(String, String)> {
    let docs = include_str!("../docs/settings.md");
    table_rows(docs, "| Property | Default |")
        .into_iter()
        .filter_map(|cells| {
            let property = cells.get(1)?.trim_matches('`');
            let default = cells.get(2)?.split('`').nth(1)?;
            Some((property.to_string(), default.to_string()))
        })
        .collect()
}

#[test]
fn unknown_arguments_exit_64_with_the_usage() {
    let (topic, group) = fresh_topic("cli-unknown", 1);
    produce_keyed(&topic, 5, 0);
    for args in [
        &["--frobnicate"][..],
        &["-x"],
        &["run"],
        &["--help", "extra"],
        &["--version=2"],
    ] {
        let mut b = AckdBuilder::new(&topic, &group).env("ACKD_STOP_AT_END", "true");
        for a in args {
            b = b.arg(*a);
        }
        let ackd = b.spawn();
        let code = ackd.wait_exit(WAIT);
        let lines = ackd.lines();
        let all = lines.join("\n");
        assert_eq!(code, 64, "{args:?}: {all}");
        assert!(
            ackd.stdout_lines().is_empty(),
            "{args:?}: usage goes to stderr: {all}"
        );
        assert!(all.contains("Usage: ackd"), "{args:?}: {all}");
        assert!(all.contains("ackd --help"), "{args:?}: {all}");
        assert!(processed(&lines).is_empty(), "{args:?}: {all}");
        assert!(!lines.iter().any(|l| at(l, "start")), "{args:?}: {all}");
    }
    assert!(committed(&group, &topic, 1).values().all(Option::is_none));
}
