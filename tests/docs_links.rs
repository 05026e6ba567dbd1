//! The docs link to each other (README.md, ARCHITECTURE.md, docs/*.md): every relative
//! link must name a file that exists and, for `#anchor`, a heading of that file (GitHub's
//! anchor rules), so that moving a section never leaves a dead link behind.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(ROOT).expect("under the root").to_path_buf())
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks (links and headings there are code).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                ""
            } else if fenced {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// GitHub's anchors of a file's headings: lower case, punctuation but `-` and `_`
/// dropped, spaces to `-`; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut result = HashSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let anchor: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(anchor.clone()).or_default();
        result.insert(if *n == 0 {
            anchor.clone()
        } else {
            format!("{anchor}-{n}")
        });
        *n += 1;
    }
    result
}

/// The targets of `[text](target)` links on a line, outside inline code.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'`' => in_code = !in_code,
            b']' if !in_code && bytes.get(i + 1) == Some(&b'(') => {
                if let Some(len) = line[i + 2..].find(')') {
                    let target = &line[i + 2..i + 2 + len];
                    if !target.contains(char::is_whitespace) {
                        targets.push(target.to_string());
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_lowercase())
    })
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let root = Path::new(ROOT);
    let mut checked = 0;
    let mut dead = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(root.join(&file)).expect("a doc file");
        for (n, line) in prose(&text).into_iter().enumerate() {
            for target in link_targets(line).into_iter().filter(|t| !is_external(t)) {
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let dest = if path.is_empty() {
                    root.join(&file)
                } else {
                    root.join(file.parent().unwrap_or(Path::new(""))).join(path)
                };
                let where_ = format!("{}:{}: {target}", file.display(), n + 1);
                if !dest.exists() {
                    dead.push(format!("{where_}: no such file"));
                } else if !anchor.is_empty() {
                    let headings = std::fs::read_to_string(&dest)
                        .map(|t| anchors(&t))
                        .unwrap_or_default();
                    if !headings.contains(anchor) {
                        dead.push(format!("{where_}: no heading for #{anchor}"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parsing broken?"
    );
    assert!(
        dead.is_empty(),
        "dead links in the docs:\n{}",
        dead.join("\n")
    );
}

#[test]
fn the_anchor_rules_are_githubs() {
    let a = anchors("# Memory budget (`ACKD_MEMORY_MB`)\n## At-least-once\n## At-least-once\n```\n# not a heading\n```\n");
    assert!(a.contains("memory-budget-ackd_memory_mb"), "{a:?}");
    assert!(
        a.contains("at-least-once") && a.contains("at-least-once-1"),
        "{a:?}"
    );
    assert!(!a.contains("not-a-heading"), "{a:?}");
    assert_eq!(
        link_targets("see [a](docs/x.md#y) and `[b](not)` and [c](#z)"),
        vec!["docs/x.md#y", "#z"]
    );
}
