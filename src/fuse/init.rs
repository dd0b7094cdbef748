//! INIT: the connection settings drainfs asks the kernel for, and the data path decision
//! (kernel passthrough for reads, writes, both or neither) from the `--passthrough` mode, what
//! the kernel grants and the lower's file system ([`crate::write_path::decide`]).
//!
//! Connection settings, each for a reason:
//! - `FUSE_PASSTHROUGH` + `max_stack_depth = 1` (kernel passthrough onto a lower that may itself
//!   be FUSE, Documentation/filesystems/fuse-passthrough.rst), with `FUSE_HANDLE_KILLPRIV_V2`:
//!   without it the kernel asks for `security.capability` before every passthrough write.
//! - No `FUSE_WRITEBACK_CACHE`: it silently disables passthrough, and it would acknowledge
//!   writes before the lower has them.
//! - `FUSE_PARALLEL_DIROPS` (lookups and readdirs in one directory run concurrently),
//!   `FUSE_DO_READDIRPLUS` + `FUSE_READDIRPLUS_AUTO` (one round trip fills `ls -l`),
//!   `FUSE_ATOMIC_O_TRUNC` (O_TRUNC rides on OPEN instead of a second SETATTR round trip),
//!   `FUSE_AUTO_INVAL_DATA` (the page cache is dropped when the lower's mtime or size changes),
//!   `FUSE_CACHE_SYMLINKS`, `FUSE_DIRECT_IO_ALLOW_MMAP` (shared mmap of the direct-io writable
//!   opens of `--passthrough reads`), `FUSE_ASYNC_DIO` (an application's large direct-io read
//!   or write is sent as several requests at once).
//! - `max_write` and `max_readahead` of [`MAX_IO`], `max_background` 64.

use fuser::{InitFlags, KernelConfig};

use super::{DrainFs, MAX_IO};
use crate::config::PassthroughMode;
use crate::mount::has_cap_sys_admin;
use crate::write_path::WritePath;

/// What INIT negotiated, for the start-up log line and `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct InitInfo {
    /// Kernel passthrough is in effect.
    pub passthrough: bool,
    /// Why passthrough is off, when it is.
    pub passthrough_off_reason: Option<String>,
    /// Kernel FUSE ABI, `major.minor`.
    pub kernel_abi: String,
    /// Writable opens use kernel passthrough (otherwise drainfs serves them).
    pub writes_passthrough: bool,
    /// Why the data path is what it is ([`crate::write_path::decide`]).
    pub data_path_reason: String,
    /// The lower's mount as the decision saw it: `fstype from source`.
    pub lower_fs: Option<String>,
}

impl DrainFs {
    /// INIT: asks for the connection settings (see the module doc), decides the data path
    /// and records what was negotiated in the [`InitInfo`] given to [`DrainFs::new`].
    ///
    /// # Errors
    /// `--passthrough always` when kernel passthrough is unavailable: the mount fails with
    /// why ([`crate::write_path::decide`]).
    pub(super) fn negotiate(&mut self, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        let mut info = InitInfo {
            kernel_abi: format!("{}.{}", config.kernel_abi().0, config.kernel_abi().1),
            ..InitInfo::default()
        };
        request_settings(config, caps);
        let kernel = self.request_passthrough(config, caps);
        let lower = self
            .lower_fs
            .as_ref()
            .map(|(t, s)| (t.as_str(), s.as_str()));
        info.lower_fs = lower.map(|(t, s)| format!("{t} from {s}"));
        match crate::write_path::decide(self.mode, lower, kernel.as_deref().map_or(Ok(()), Err)) {
            Ok(d) => self.take_data_path(&d, kernel, &mut info),
            Err(e) => {
                *self.init.lock() = Some(InitInfo {
                    passthrough_off_reason: kernel,
                    data_path_reason: e.clone(),
                    ..info
                });
                return Err(std::io::Error::other(e));
            }
        }
        info.passthrough = self.passthrough;
        *self.init.lock() = Some(info);
        Ok(())
    }

    /// Asks for `FUSE_PASSTHROUGH` with `max_stack_depth = 1`, unless `--passthrough never`.
    /// Returns why kernel passthrough is unavailable, or `None` when it was granted (or not
    /// asked for).
    fn request_passthrough(&self, config: &mut KernelConfig, caps: InitFlags) -> Option<String> {
        if self.mode == PassthroughMode::Never {
            None
        } else if !caps.contains(InitFlags::FUSE_PASSTHROUGH) {
            Some("the kernel does not offer FUSE_PASSTHROUGH (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)".to_string())
        } else if !has_cap_sys_admin() {
            Some("drainfs lacks CAP_SYS_ADMIN, which backing files need".to_string())
        } else if config.set_max_stack_depth(1).is_err() {
            Some("the kernel refused max_stack_depth 1".to_string())
        } else {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => None,
                Err(_) => Some("the kernel refused FUSE_PASSTHROUGH".to_string()),
            }
        }
    }

    /// Serves the data path `d`: passthrough for reads (and writes) or none. `kernel` is why
    /// kernel passthrough is unavailable, if it is.
    fn take_data_path(&mut self, d: &WritePath, kernel: Option<String>, info: &mut InitInfo) {
        self.passthrough = d.reads_passthrough;
        if d.reads_passthrough && !d.writes_passthrough {
            // Served exactly as `--passthrough reads`.
            self.mode = PassthroughMode::Reads;
        }
        info.writes_passthrough = d.writes_passthrough;
        info.data_path_reason = d.reason.clone();
        if !d.reads_passthrough {
            info.passthrough_off_reason = Some(kernel.unwrap_or_else(|| d.reason.clone()));
        }
    }
}

/// Asks for the connection flags the kernel offers among those drainfs wants, and the sizes.
fn request_settings(config: &mut KernelConfig, caps: InitFlags) {
    let wanted = InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_ATOMIC_O_TRUNC
        | InitFlags::FUSE_AUTO_INVAL_DATA
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2
        | InitFlags::FUSE_ASYNC_DIO;
    let _ = config.add_capabilities(wanted & caps);
    let _ = config.set_max_write(MAX_IO);
    let _ = config.set_max_readahead(MAX_IO);
    let _ = config.set_max_background(64);
}
