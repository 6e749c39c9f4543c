//! What the emulator needs from the system, and exactly what is missing.
//!
//! Creating network namespaces needs `CAP_SYS_ADMIN` and creating TUN
//! interfaces `CAP_NET_ADMIN`, plus a usable `/dev/net/tun`. Root has all of
//! them. A normal user can get both capabilities inside an unprivileged user
//! namespace where the kernel allows it; the CLI then re-executes itself in
//! one ([`run_in_user_namespace`]).

use std::ffi::CString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::sys;

/// Set (to `1`) in the environment of the copy of the program re-executed
/// inside a user namespace.
pub const USERNS_ENV: &str = "QUICHUB_NETEM_IN_USERNS";

/// Whether this process runs inside the user namespace made by
/// [`run_in_user_namespace`].
pub fn in_our_user_namespace() -> bool {
    std::env::var_os(USERNS_ENV).is_some_and(|v| v == "1")
}

fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Whether this process holds both capabilities the emulator needs.
pub fn has_capabilities() -> bool {
    sys::has_cap(sys::CAP_SYS_ADMIN) && sys::has_cap(sys::CAP_NET_ADMIN)
}

/// Tries, in a throw-away namespace, everything the emulator does that needs
/// privileges: create a network namespace and a TUN interface in it.
pub fn probe() -> Result<(), String> {
    if !Path::new("/proc/self/ns/net").exists() {
        return Err("this kernel has no network namespaces (CONFIG_NET_NS is off)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err("/dev/net/tun does not exist: load the tun module (modprobe tun) or create the node (mknod /dev/net/tun c 10 200)".into());
    }
    let h = std::thread::Builder::new()
        .name("netem-probe".into())
        .spawn(|| -> Result<(), sys::SysError> {
            sys::unshare_net()?;
            let _tun = sys::open_tun("qhprobe0")?;
            Ok(())
        })
        .map_err(|e| format!("starting a probe thread: {e}"))?;
    match h.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the privilege probe thread panicked".into()),
    }
}

/// `None` when this process can run the emulator directly; otherwise the
/// exact reason it cannot.
pub fn missing() -> Option<String> {
    if has_capabilities() {
        return probe().err();
    }
    let mut lacking = Vec::new();
    if !sys::has_cap(sys::CAP_SYS_ADMIN) {
        lacking.push("CAP_SYS_ADMIN (to create network namespaces)");
    }
    if !sys::has_cap(sys::CAP_NET_ADMIN) {
        lacking.push("CAP_NET_ADMIN (to create and configure TUN interfaces)");
    }
    Some(format!(
        "running as uid {} without {}",
        uid(),
        lacking.join(" and ")
    ))
}

fn read_sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// `None` when an unprivileged user namespace looks usable for the
/// emulator; otherwise what stands in the way.
pub fn user_namespace_blocker() -> Option<String> {
    if read_sysctl("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Some("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0; enable with `sysctl -w kernel.unprivileged_userns_clone=1`)".into());
    }
    if read_sysctl("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Some("user namespaces are disabled (user.max_user_namespaces = 0)".into());
    }
    if read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1")
    {
        return Some("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1; allow it for this program with an AppArmor profile, or `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`)".into());
    }
    if !Path::new("/proc/self/ns/user").exists() {
        return Some("this kernel has no user namespaces (CONFIG_USER_NS is off)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist (modprobe tun, or mknod /dev/net/tun c 10 200 && chmod 0666 /dev/net/tun)".into());
    }
    let tun = CString::new("/dev/net/tun").ok()?;
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::access(tun.as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
        return Some(format!(
            "/dev/net/tun is not readable and writable by uid {} (a user namespace cannot change that; `chmod 0666 /dev/net/tun` as root, or run as root)",
            uid()
        ));
    }
    None
}

/// The full explanation printed when the emulator cannot run.
pub fn explain(reason: &str) -> String {
    let userns = if in_our_user_namespace() {
        " (already inside an unprivileged user namespace)".to_string()
    } else {
        match user_namespace_blocker() {
            Some(b) => format!("; an unprivileged user namespace is not an option either: {b}"),
            None => String::new(),
        }
    };
    format!(
        "quichub-lab netem needs to create network namespaces and TUN devices: {reason}{userns}. Run it as root (e.g. `sudo quichub-lab netem ...`)."
    )
}

/// Re-executes this program (same arguments) inside a new user namespace in
/// which the current user is mapped to root, and returns its exit code
/// (128 + signal number when it was killed).
pub fn run_in_user_namespace() -> io::Result<i32> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let paths = [
        CString::new("/proc/self/setgroups")?,
        CString::new("/proc/self/uid_map")?,
        CString::new("/proc/self/gid_map")?,
    ];
    let contents = [
        b"deny".to_vec(),
        format!("0 {uid} 1").into_bytes(),
        format!("0 {gid} 1").into_bytes(),
    ];
    let mut cmd = Command::new("/proc/self/exe");
    cmd.args(std::env::args_os().skip(1)).env(USERNS_ENV, "1");
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls on buffers prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            for (path, data) in paths.iter().zip(contents.iter()) {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, data.as_ptr().cast(), data.len());
                libc::close(fd);
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let status = crate::cli::wait_forwarding_signals(&mut child)?;
    Ok(crate::cli::exit_code(status))
}
