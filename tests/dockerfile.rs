//! The container image. No container engine runs here, so this
//! checks what the Dockerfile says: PID 1 is an init that reaps orphans (the exec
//! processor's handlers may leave some) and forwards SIGTERM to ackd, in exec form;
//! the runtime image can take a handler's runtime (EXTRA_PACKAGES), as docs/deploying.md shows.

const DOCKERFILE: &str = include_str!("../Dockerfile");
const README: &str = include_str!("../docs/deploying.md");

/// The instructions after the last `FROM` (the runtime stage), comments dropped and
/// continuation lines joined.
fn runtime_stage() -> Vec<String> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in DOCKERFILE.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let last_from = instructions
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("a FROM");
    instructions.split_off(last_from)
}

#[test]
fn pid_1_is_tini_in_exec_form_with_ackd_its_child() {
    let stage = runtime_stage();
    let entrypoints: Vec<&String> = stage
        .iter()
        .filter(|i| i.starts_with("ENTRYPOINT"))
        .collect();
    assert_eq!(entrypoints.len(), 1, "{stage:#?}");
    let json = entrypoints[0].trim_start_matches("ENTRYPOINT").trim();
    let argv: Vec<String> = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("ENTRYPOINT must be the exec form (a JSON array): {json}: {e}"));
    assert_eq!(
        argv,
        ["/usr/bin/tini", "--", "/usr/local/bin/ackd"],
        "tini as PID 1, ackd its child; no -g: ackd stops its handlers itself"
    );
    let installs_tini = stage.iter().any(|i| {
        i.starts_with("RUN ")
            && i.contains("apt-get install")
            && i.split_whitespace().any(|w| w == "tini")
    });
    assert!(installs_tini, "the runtime stage installs tini: {stage:#?}");
    assert!(
        !stage.iter().any(|i| i.starts_with("CMD")),
        "no CMD: arguments go to ackd"
    );
}

#[test]
fn a_handler_runtime_can_be_added_and_the_readme_says_how() {
    let stage = runtime_stage();
    assert!(
        stage.iter().any(|i| i.starts_with("ARG EXTRA_PACKAGES")),
        "{stage:#?}"
    );
    assert!(
        stage
            .iter()
            .any(|i| i.contains("apt-get install") && i.contains("${EXTRA_PACKAGES}")),
        "{stage:#?}"
    );
    assert!(README.contains("--build-arg EXTRA_PACKAGES=python3"));
    assert!(README.contains("ACKD_EXEC_COMMAND=\"python3 -u /app/handler.py\""));
    assert!(README.contains("tini"));
}
