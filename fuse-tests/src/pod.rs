//! A Kubernetes pod on one machine, for tests that need the mount topology drainfs really runs
//! in:
//!
//! - every volume is a directory bind-mounted onto itself on the "node" (the test's own mount
//!   namespace), as the kubelet's emptyDirs reach containers as bind mounts ([`BindMount`]);
//!   the volume drainfs mounts over is made `shared` on the node;
//! - the sidecar container ([`Container::sidecar`]) gets its own mount namespace whose copies of
//!   the volume mounts keep their propagation (`unshare --propagation unchanged`): the shared
//!   volume is a peer of the node's (Kubernetes `Bidirectional`), so drainfs's mount propagates
//!   to the node; the lower's volume stays private to the container;
//! - the application container ([`Container::app`]) gets a mount namespace whose mounts are
//!   slaves of the node's (`--propagation slave`, Kubernetes `HostToContainer`): it sees
//!   drainfs's mount appear and go, and cannot propagate anything back;
//! - each container has its own PID namespace (`unshare --pid --fork --mount-proc`), so
//!   drainfs runs as PID 1, as it does as a container's entrypoint.
//!
//! Every guard cleans up on drop, also when a test panics: containers are killed (PID 1 first,
//! which takes its whole PID namespace with it), then anything stacked on a volume is detached,
//! then the volume's bind mount itself.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{make_dirs, scratch_dir};
pub use crate::mounts::{Mnt, mountinfo_of, mounts_at, parse_mountinfo, top_at};
use crate::mounts::{detach_down_to, mount_id_at};
use crate::process::{Proc, first_child};
use crate::wait::{wait_for, wait_until};

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A directory bind-mounted onto itself on the node (the test's mount namespace), optionally
/// made `shared`. On drop, whatever is stacked on it is detached first, then the bind mount,
/// identified by its mount ID.
pub struct BindMount {
    /// The directory (absolute, canonical).
    pub path: PathBuf,
    /// The bind mount's ID in the node's mount namespace.
    pub id: u64,
}

impl BindMount {
    /// `mount --bind path path` (+ `mount --make-shared path` when `shared`).
    pub fn new(path: &Path, shared: bool) -> BindMount {
        let path = path.canonicalize().expect("volume directory");
        run(Command::new("mount").arg("--bind").arg(&path).arg(&path)).expect("bind mount");
        let id = mount_id_at(&path).expect("the bind mount is in mountinfo");
        let b = BindMount { path, id };
        if shared {
            run(Command::new("mount").arg("--make-shared").arg(&b.path)).expect("make-shared");
        }
        b
    }

    /// Whether the bind mount (this mount ID) is still mounted at its path on the node.
    pub fn present(&self) -> bool {
        mountinfo_of("self")
            .iter()
            .any(|m| m.id == self.id && m.mount_point == self.path)
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        detach_down_to(&self.path, self.id);
    }
}

/// A container: a process in its own mount and PID namespaces, started through util-linux
/// `unshare --fork --kill-child`, whose PID 1 is the container's command. Dropping it kills
/// PID 1 (and with it the whole PID namespace).
pub struct Container {
    /// The `unshare` process (its exit status is PID 1's).
    pub proc: Proc,
    /// PID 1 of the container, as the node sees it.
    pub pid1: i32,
    /// An open handle on the container's mount namespace, which keeps it (and its mounts)
    /// alive after its processes exit, so tests can inspect what was left mounted there.
    mnt_ns: Option<File>,
}

impl Container {
    /// The sidecar: volume mounts keep their propagation (`shared` ones are peers of the
    /// node's: Bidirectional). Runs `argv` as PID 1 with `env` added.
    pub fn sidecar(argv: &[String], env: &[(String, String)]) -> Container {
        Self::start("unchanged", argv, env)
    }

    /// The application: every mount is a slave of the node's (HostToContainer). Runs `sh -c
    /// script` as PID 1.
    pub fn app(script: &str) -> Container {
        Self::start(
            "slave",
            &["sh".into(), "-c".into(), script.to_string()],
            &[],
        )
    }

    fn start(propagation: &str, argv: &[String], env: &[(String, String)]) -> Container {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", propagation])
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"])
            .args(argv)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut proc = Proc::spawn(cmd);
        // PID 1 is unshare's only child. A command that fails at once (drainfs refusing its
        // arguments) may be gone before it is seen: then `pid1` is -1 and the exit status tells.
        let unshare = proc.pid();
        let pid1 = wait_for(Duration::from_secs(10), || match first_child(unshare) {
            Some(c) => Some(c),
            None => proc.exited().then_some(-1),
        })
        .unwrap_or(-1);
        // The mount namespace is the unshare process's own (it unshared before forking).
        let ns = format!("/proc/{}/ns/mnt", proc.pid());
        let ino = |p: &str| {
            std::fs::metadata(p)
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .ok()
        };
        let own = ino("/proc/self/ns/mnt");
        let entered = pid1 > 0 && ino(&ns).is_some_and(|i| Some(i) != own);
        let mnt_ns = if entered { File::open(&ns).ok() } else { None };
        Container { proc, pid1, mnt_ns }
    }

    /// Sends `sig` to the container's PID 1 (as the kubelet does; the `unshare` parent does not
    /// forward signals).
    pub fn signal(&self, sig: Signal) {
        crate::process::send(self.pid1, sig);
    }

    /// Waits up to `timeout` for PID 1's exit status.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.proc.wait_timeout(timeout)
    }

    /// The container's mount table, read from inside its mount namespace (also after its
    /// processes exited: the namespace is held open).
    pub fn mountinfo(&self) -> Vec<Mnt> {
        let Some(ns) = &self.mnt_ns else {
            return Vec::new();
        };
        let path = format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd());
        // A process parked in the namespace; its table is read through the node's /proc (the
        // container's own /proc belongs to its PID namespace, which is gone).
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={path}"))
            .args(["--", "sleep", "30"]);
        let mut parked = Proc::spawn(cmd);
        let target = std::fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        let pid = parked.pid();
        let inside = wait_until(Duration::from_secs(15), || {
            std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .ok()
                == target.as_ref().ok().copied()
        });
        let table = mountinfo_of(&pid.to_string());
        parked.stop(&[(Signal::SIGKILL, Duration::from_secs(5))]);
        assert!(
            inside,
            "nsenter did not enter the container's mount namespace"
        );
        table
    }
}

/// How a [`Container`]'s drop stops its PID 1 (as the kubelet would): SIGTERM, then SIGKILL.
const CONTAINER_LADDER: [(Signal, Duration); 2] = [
    (Signal::SIGTERM, Duration::from_secs(10)),
    (Signal::SIGKILL, Duration::from_secs(5)),
];

impl Drop for Container {
    fn drop(&mut self) {
        self.proc.stop_via(self.pid1, &CONTAINER_LADDER);
        // Closing the handle lets the namespace (and any mount left in it) go.
        self.mnt_ns = None;
    }
}

/// A pod's directories under one temporary directory: `data` (the volume drainfs mounts over,
/// shared with the application), `lower` (the lower's mountpoint, sidecar only), `signal` (the
/// exit and ready files, shared), and `bucket`, `run` for whatever else a test needs (plain
/// directories). Field order is drop order: volumes are unmounted before the directory goes.
pub struct Pod {
    /// The `data` volume (bind-mounted, shared: Bidirectional in the sidecar).
    pub data: BindMount,
    /// The `lower` volume (bind-mounted, private to the sidecar).
    pub lower: BindMount,
    /// The `signal` volume (bind-mounted).
    pub signal: BindMount,
    /// The pod's root directory.
    pub dir: tempfile::TempDir,
}

impl Pod {
    /// Creates the directories and the volumes' bind mounts.
    pub fn new() -> Pod {
        let dir = scratch_dir("/tmp", "drainfs-pod-");
        let [data, lower, signal, _, _] =
            make_dirs(dir.path(), ["data", "lower", "signal", "bucket", "run"]);
        let data = BindMount::new(&data, true);
        let lower = BindMount::new(&lower, false);
        let signal = BindMount::new(&signal, false);
        Pod {
            data,
            lower,
            signal,
            dir,
        }
    }

    /// A path under the pod's root.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join(rel)
    }

    /// Where an absolute path of the Kubernetes manifests (`/data`, `/gcs-lower`,
    /// `/drainfs-signal`, `/run/drainfs`, `/dev/termination-log`, `/tmp`, and paths under them)
    /// lands in this pod; any other value is returned as it is.
    pub fn remap(&self, value: &str) -> String {
        let map: [(&str, PathBuf); 6] = [
            ("/data", self.data.path.clone()),
            ("/gcs-lower", self.lower.path.clone()),
            ("/drainfs-signal", self.signal.path.clone()),
            ("/run/drainfs", self.path("run")),
            ("/dev/termination-log", self.path("run/termination-log")),
            ("/tmp", self.path("run")),
        ];
        for (from, to) in &map {
            if value == *from {
                return to.display().to_string();
            }
            if let Some(rest) = value.strip_prefix(&format!("{from}/")) {
                return to.join(rest).display().to_string();
            }
        }
        value.to_string()
    }

    /// The non-FUSE mount (the volume's bind mount) at `path` in `table`; panics if none.
    pub fn volume_mount(&self, table: &[Mnt], path: &Path) -> Mnt {
        mounts_at(table, path)
            .into_iter()
            .find(|m| !m.is_fuse())
            .unwrap_or_else(|| panic!("no volume bind mount at {}: {table:#?}", path.display()))
    }

    /// Asserts what must hold after the sidecar exited: the volumes' bind mounts are the same
    /// mounts as before, on the node (by the IDs taken at creation) and in the sidecar's
    /// namespace (`in_sidecar`, taken while it ran), and no FUSE mount is left anywhere in the
    /// pod.
    pub fn assert_volumes_intact(&self, sidecar: &Container, in_sidecar: &[Mnt]) {
        for v in [&self.data, &self.lower, &self.signal] {
            assert!(
                v.present(),
                "the volume's bind mount at {} (mount {}) is gone on the node",
                v.path.display(),
                v.id
            );
        }
        let node = mountinfo_of("self");
        assert_eq!(
            self.fuse_mounts_in(&node),
            vec![],
            "FUSE mounts left on the node"
        );
        let after = sidecar.mountinfo();
        for before in in_sidecar {
            assert!(
                after
                    .iter()
                    .any(|m| m.id == before.id && m.mount_point == before.mount_point),
                "the volume's bind mount at {} (mount {} in the sidecar) was removed: {after:#?}",
                before.mount_point.display(),
                before.id
            );
        }
        assert_eq!(
            self.fuse_mounts_in(&after),
            vec![],
            "FUSE mounts left in the sidecar's namespace"
        );
    }

    /// FUSE mounts anywhere under the pod's root in `table`.
    pub fn fuse_mounts_in(&self, table: &[Mnt]) -> Vec<Mnt> {
        let root = self.path("");
        table
            .iter()
            .filter(|m| m.is_fuse() && m.mount_point.starts_with(&root))
            .cloned()
            .collect()
    }
}

impl Default for Pod {
    fn default() -> Self {
        Self::new()
    }
}
