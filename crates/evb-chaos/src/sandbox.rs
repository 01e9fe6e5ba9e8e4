//! Where a chaos run happens: as root, in a network namespace and a mount
//! namespace of its own (`unshare`), so that its nftables rules and its
//! tbf qdisc act on its own loopback only, and its event store is a small
//! tmpfs it can fill up. Without root, on the machine's loopback, with
//! the faults that need neither left out.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The sandbox a chaos run got.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// A network namespace of its own: network faults are possible.
    pub net: bool,
    /// The event store's directory; `small_fs`: a tmpfs of its own
    /// (`store-full` is possible).
    pub store: PathBuf,
    pub small_fs: bool,
    /// The scratch directory (removed by [`Sandbox::remove`]).
    pub dir: PathBuf,
}

/// Size of the store's tmpfs.
const STORE_FS: &str = "size=512m";

impl Sandbox {
    /// Enters the namespaces (root) and prepares the store. Call before
    /// any thread is started: a process with threads cannot leave its
    /// mount namespace.
    pub fn enter(want: bool) -> Result<Sandbox> {
        let dir = std::env::temp_dir().join(format!("evb-chaos-{}", std::process::id()));
        let store = dir.join("store");
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !(want && root) {
            return Ok(Sandbox {
                net: false,
                store,
                small_fs: false,
                dir,
            });
        }
        // SAFETY: unshare and mount with valid arguments; nothing else of
        // this process runs meanwhile (no thread yet).
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) != 0 {
                bail!(
                    "unshare (a network and mount namespace for the run): {}",
                    std::io::Error::last_os_error()
                );
            }
            let root = CString::new("/").expect("no NUL");
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                bail!("making mounts private: {}", std::io::Error::last_os_error());
            }
        }
        let out = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .output()
            .context("ip (scripts/setup.sh installs iproute2)")?;
        if !out.status.success() {
            bail!(
                "ip link set lo up: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        mount_tmpfs(&store)?;
        Ok(Sandbox {
            net: true,
            store,
            small_fs: true,
            dir,
        })
    }

    /// Empties the store for the next run.
    pub fn clear_store(&self) -> Result<()> {
        for entry in std::fs::read_dir(&self.store)? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Removes the scratch directory (the tmpfs goes with the namespace).
    pub fn remove(&self) {
        if self.small_fs {
            if let Ok(c) = CString::new(self.store.as_os_str().as_encoded_bytes()) {
                // SAFETY: unmounting our own mount point.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `store-full` and its end: the store's tmpfs (mounted by
/// [`Sandbox::enter`] at `at`) resized to `bytes` (None: back to its
/// size), in place (a remount): a tmpfs refuses a size below what it
/// holds (`EINVAL`), so `bytes` = what it holds fills it at once.
pub fn resize_store(at: &Path, bytes: Option<u64>) -> std::io::Result<()> {
    let data = bytes.map_or_else(|| STORE_FS.to_string(), |b| format!("size={b}"));
    let data = CString::new(data).expect("no NUL");
    let target = CString::new(at.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
    let fstype = CString::new("tmpfs").expect("no NUL");
    // SAFETY: valid NUL-terminated strings for the mount call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_REMOUNT,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(crate) fn mount_tmpfs(at: &Path) -> Result<()> {
    let target = CString::new(at.as_os_str().as_encoded_bytes()).context("store path")?;
    let fstype = CString::new("tmpfs").expect("no NUL");
    let data = CString::new(STORE_FS).expect("no NUL");
    // SAFETY: valid NUL-terminated strings for the mount call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting a tmpfs for the store at {}: {}",
            at.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
