//! The memory limit a container, a Kubernetes pod or a Heroku dyno puts on the process:
//! its cgroup's `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1), of the
//! cgroup `/proc/self/cgroup` names and of every ancestor up to the mount (a parent's
//! limit holds its children too): the lowest wins.

use std::path::{Path, PathBuf};

/// A limit at or above this is "no limit" (cgroup v1 writes 2^63 rounded to a page).
const NO_LIMIT: u64 = 1 << 60;

/// The lowest memory limit found, and the file that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimit {
    pub bytes: u64,
    pub file: PathBuf,
}

/// The process's cgroup memory limit, read under `root` (`/`; a test stages a tree of
/// its own). `None`: no cgroup with a memory limit (or none readable).
pub fn read(root: &Path) -> Option<CgroupLimit> {
    let own = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    let fs = root.join("sys/fs/cgroup");
    let mut found: Vec<CgroupLimit> = Vec::new();
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            // v2: mounted at /sys/fs/cgroup, or at .../unified beside v1.
            for mount in [fs.clone(), fs.join("unified")] {
                found.extend(lowest_on_the_way_up(&mount, path, "memory.max"));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            found.extend(lowest_on_the_way_up(
                &fs.join("memory"),
                path,
                "memory.limit_in_bytes",
            ));
        }
    }
    found.into_iter().min_by_key(|l| l.bytes)
}

/// The lowest limit in `file` from the cgroup at `path` under `mount` up to the mount.
/// A container without its own cgroup namespace sees the host's path in
/// /proc/self/cgroup but its own cgroup mounted as the root: then the root is read.
fn lowest_on_the_way_up(mount: &Path, path: &str, file: &str) -> Option<CgroupLimit> {
    // Only a cgroup file system (v2's root has no memory.max of its own).
    let mounted = [file, "cgroup.controllers", "cgroup.procs"];
    if !mounted.iter().any(|f| mount.join(f).exists()) {
        return None;
    }
    let own = mount.join(path.trim_start_matches('/'));
    let mut dir = if own.is_dir() {
        own
    } else {
        mount.to_path_buf()
    };
    let mut lowest: Option<CgroupLimit> = None;
    loop {
        let at = dir.join(file);
        if let Some(bytes) = std::fs::read_to_string(&at).ok().and_then(|s| parse(&s)) {
            if lowest.as_ref().is_none_or(|l| bytes < l.bytes) {
                lowest = Some(CgroupLimit { bytes, file: at });
            }
        }
        if dir == mount || !dir.pop() || !dir.starts_with(mount) {
            return lowest;
        }
    }
}

/// A limit file's content: bytes, or `None` for "max" and the unlimited values.
fn parse(content: &str) -> Option<u64> {
    content
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|&b| b > 0 && b < NO_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "ackd-cgroup-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        for (path, content) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        root
    }

    #[test]
    fn reads_cgroup_v2_memory_max_of_its_own_cgroup() {
        let root = stage(&[
            ("proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
            ("sys/fs/cgroup/cgroup.controllers", "memory"),
            ("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "536870912\n"),
        ]);
        let l = read(&root).unwrap();
        assert_eq!(l.bytes, 512 << 20);
        assert!(l.file.ends_with("kubepods/pod1/ctr/memory.max"), "{l:?}");
    }

    #[test]
    fn a_parent_limit_lower_than_its_own_wins_and_max_is_no_limit() {
        let root = stage(&[
            ("proc/self/cgroup", "0::/pod/ctr\n"),
            ("sys/fs/cgroup/cgroup.controllers", "memory"),
            ("sys/fs/cgroup/pod/memory.max", "268435456"),
            ("sys/fs/cgroup/pod/ctr/memory.max", "max"),
        ]);
        assert_eq!(read(&root).unwrap().bytes, 256 << 20);
        let unlimited = stage(&[
            ("proc/self/cgroup", "0::/pod/ctr\n"),
            ("sys/fs/cgroup/cgroup.controllers", "memory"),
            ("sys/fs/cgroup/pod/ctr/memory.max", "max"),
        ]);
        assert_eq!(read(&unlimited), None);
    }

    #[test]
    fn reads_cgroup_v1_and_a_container_mounted_as_the_root() {
        // Docker without a cgroup namespace: the host's path, the container's cgroup
        // mounted at the root; v1's "unlimited" in the parent is no limit.
        let root = stage(&[
            (
                "proc/self/cgroup",
                "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
            ),
            ("sys/fs/cgroup/memory/cgroup.procs", ""),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n"),
        ]);
        assert_eq!(read(&root).unwrap().bytes, 1 << 30);
        let unlimited = stage(&[
            ("proc/self/cgroup", "4:memory:/\n"),
            ("sys/fs/cgroup/memory/cgroup.procs", ""),
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        assert_eq!(read(&unlimited), None);
    }

    #[test]
    fn no_cgroup_file_is_no_limit() {
        assert_eq!(read(&stage(&[])), None);
        assert_eq!(read(&stage(&[("proc/self/cgroup", "garbage\n")])), None);
    }
}
