//! Spawning children that die with the test process (PDEATHSIG from one spawner thread),
//! free ports, the log directory.

use std::fs::File;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from the harness's spawner thread, with PDEATHSIG = SIGKILL.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                // This thread must outlive every child: PDEATHSIG fires when it exits.
                // The `static` sender is never dropped, so `recv` never fails, but park
                // forever just in case rather than returning.
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
                loop {
                    thread::park();
                }
            })
            .expect("spawn harness-spawner thread");
        Mutex::new(tx)
    });

    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }

    let (reply_tx, reply_rx) = mpsc::channel();
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .expect("harness-spawner thread is gone");
    reply_rx
        .recv()
        .expect("harness-spawner thread did not reply")
}

/// A port nothing listens on right now (bound to :0 and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// The gauge `name` on the `/metrics` page of the health endpoint on `port` (127.0.0.1).
pub fn scraped_gauge(port: u16, name: &str) -> u64 {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).expect("read /metrics");
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} on /metrics:\n{page}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}\n{page}"))
}

/// Directory for logs: `<target>/tmp` (Cargo's CARGO_TARGET_TMPDIR), else the temp dir.
pub fn log_dir() -> PathBuf {
    let dir = option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// The variables every child inherits from the test process.
pub fn passthrough_env() -> Vec<(String, String)> {
    ["PATH", "HOME"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

/// A fresh directory under [`log_dir`] for one test's files (a handler, its markers).
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = log_dir().join(super::topics::unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn read_lossy(path: &Path) -> String {
    let mut buf = Vec::new();
    match File::open(path).and_then(|mut f| f.read_to_end(&mut buf)) {
        Ok(_) => String::from_utf8_lossy(&buf).into_owned(),
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// What `script` prints (a path), or `$var` when set.
pub fn installed(var: &str, script: &str) -> PathBuf {
    if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed with {}",
        script.display(),
        out.status
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
