//! The formats the docs quote and the code owns stay equal, as tests/cli.rs keeps
//! `--help` and docs/settings.md: docs/observability.md's exit-code table against
//! src/exit.rs, and the `at=` names of the log lines against the lines src/ writes, both
//! ways. (The commit metadata's version: `the_guarantees_quote_the_format_written` in
//! src/consumer/handover/commit_metadata.rs.) No broker: these read files only.

use std::collections::BTreeMap;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const OBSERVABILITY: &str = include_str!("../docs/observability.md");
const EXIT_RS: &str = include_str!("../src/exit.rs");

/// The rows of the table that follows the line `heading`, each as its trimmed cells
/// (without the empty ones outside the outer `|`s).
fn table_after<'d>(doc: &'d str, heading: &str) -> Vec<Vec<&'d str>> {
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .skip_while(|l| *l != heading)
        .skip_while(|l| !l.starts_with('|'))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
            inner.split('|').map(str::trim).collect()
        })
        .collect();
    assert!(!rows.is_empty(), "no table after {heading:?}");
    rows
}

/// `code → name` of docs/observability.md's exit-code table (`| 64 | `USAGE` | ... |`).
fn documented_exit_codes() -> BTreeMap<i32, String> {
    let mut codes = BTreeMap::new();
    for row in table_after(OBSERVABILITY, "## Exit codes") {
        let code: i32 = row[0]
            .parse()
            .unwrap_or_else(|_| panic!("not a code: {row:?}"));
        let name = row[1].trim_matches('`').to_string();
        assert!(
            codes.insert(code, name).is_none(),
            "{code} is in the table twice"
        );
    }
    codes
}

/// `code → name` of every `pub const NAME: i32 = N;` in src/exit.rs: a constant added
/// there is found without this test naming it.
fn declared_exit_codes() -> BTreeMap<i32, String> {
    let mut codes = BTreeMap::new();
    for line in EXIT_RS.lines() {
        let Some(rest) = line.strip_prefix("pub const ") else {
            continue;
        };
        let (name, value) = rest
            .split_once(": i32 = ")
            .unwrap_or_else(|| panic!("an exit code that is no i32 literal: {line}"));
        let code: i32 = value
            .trim_end_matches(';')
            .parse()
            .unwrap_or_else(|_| panic!("an exit code that is no literal: {line}"));
        assert!(
            codes.insert(code, name.to_string()).is_none(),
            "two constants are {code}"
        );
    }
    codes
}

#[test]
fn the_exit_code_table_is_the_code_s() {
    let declared = declared_exit_codes();
    // The source as read is what compiles: the constants themselves agree.
    let compiled = [
        ("OK", ackd::exit::OK),
        ("INCOMPLETE", ackd::exit::INCOMPLETE),
        ("USAGE", ackd::exit::USAGE),
        ("UNAVAILABLE", ackd::exit::UNAVAILABLE),
        ("SOFTWARE", ackd::exit::SOFTWARE),
        ("NOPERM", ackd::exit::NOPERM),
        ("CONFIG", ackd::exit::CONFIG),
        ("FORCED", ackd::exit::FORCED),
    ];
    for (name, code) in compiled {
        assert_eq!(
            declared.get(&code).map(String::as_str),
            Some(name),
            "{code}"
        );
    }
    assert_eq!(
        documented_exit_codes(),
        declared,
        "docs/observability.md's exit codes (left) differ from src/exit.rs's (right)"
    );
}

/// Every `.rs` file under `dir`, as text.
fn sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(std::fs::read_to_string(&path).expect("a source file"));
        }
    }
}

/// The text of every source file of src/ without its unit tests (`#[cfg(test)] mod
/// tests`, at the end of a file), whose lines ackd never writes.
fn shipped_sources() -> Vec<String> {
    let mut src = Vec::new();
    sources(&Path::new(ROOT).join("src"), &mut src);
    for text in &mut src {
        if let Some(tests) = text.find("#[cfg(test)]\nmod tests") {
            text.truncate(tests);
        }
    }
    src
}

/// The names of the lines `text` writes with an `at = "name"` field.
fn written_names(text: &str) -> Vec<&str> {
    text.match_indices("at = \"")
        .filter(|(i, _)| {
            // `at`, not the end of a longer name (`format = "…"`).
            let before = text[..*i].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .filter_map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let name = &rest[..rest.find('"')?];
            let plain =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            plain.then_some(name)
        })
        .collect()
}

/// Every line src/ writes (`at = "name"`, outside unit tests) is named in docs/ or the
/// README (`at=name` or `` `name` ``), so that a new line cannot go undocumented.
#[test]
fn every_line_written_is_documented() {
    let mut docs = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).expect("docs/") {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push_str(&std::fs::read_to_string(&path).expect("a doc"));
        }
    }
    let src = shipped_sources();
    let mut names: Vec<&str> = src.iter().flat_map(|t| written_names(t)).collect();
    names.sort_unstable();
    names.dedup();
    assert!(
        names.len() > 50,
        "the sources were not read whole: {names:?}"
    );
    let undocumented: Vec<&str> = names
        .into_iter()
        .filter(|n| !docs.contains(&format!("at={n}")) && !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "lines src/ writes that no doc names (docs/observability.md's table lists the \
         daemon's): {undocumented:?}"
    );
}

/// Every name in the first column of docs/observability.md's table of `at=` lines is a
/// line src/ writes (`at = "name"`, a literal `at=name`, or librdkafka's target), so
/// that a renamed or removed line cannot stay documented.
#[test]
fn every_documented_line_is_written() {
    let src = shipped_sources().join("\n");
    let mut names = Vec::new();
    for row in table_after(OBSERVABILITY, "| `at=` | When |") {
        for cell in row[0].split(',') {
            let name = cell.trim().trim_matches('`');
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "not a line's name: {cell:?} in {row:?}"
            );
            names.push(name);
        }
    }
    assert!(names.len() > 50, "the table was not read whole: {names:?}");
    let missing: Vec<&str> = names
        .into_iter()
        .filter(|n| !src.contains(&format!("\"{n}\"")) && !src.contains(&format!("at={n} ")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/observability.md names lines src/ does not write: {missing:?}"
    );
}
