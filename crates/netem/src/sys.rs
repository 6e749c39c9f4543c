//! Thin Linux system layer: network namespaces, TUN devices, interface
//! configuration through ioctls, and small syscall wrappers.

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// A failed system operation, with what was being done and what would fix it.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}{hint}")]
pub struct SysError {
    /// What was being attempted.
    pub step: String,
    /// The OS error (part of the message, so not chained as a source).
    pub source: io::Error,
    /// A hint saying what is missing (starts with "; " when present).
    pub hint: String,
}

impl SysError {
    fn new(step: impl Into<String>, source: io::Error) -> Self {
        let step = step.into();
        let hint = hint_for(&step, &source);
        SysError { step, source, hint }
    }
}

fn hint_for(step: &str, e: &io::Error) -> String {
    let code = e.raw_os_error().unwrap_or(0);
    let s = if step.contains("network namespace") && (code == libc::EPERM || code == libc::EACCES) {
        "creating or entering a network namespace needs CAP_SYS_ADMIN: run as root (sudo), or where the kernel allows it as a normal user through an unprivileged user namespace"
    } else if step.contains("/dev/net/tun") && code == libc::ENOENT {
        "the TUN device node is missing: load the module (modprobe tun) or create the node (mknod /dev/net/tun c 10 200 && chmod 0666 /dev/net/tun)"
    } else if step.contains("/dev/net/tun") && (code == libc::EACCES || code == libc::EPERM) {
        "/dev/net/tun is not readable and writable by this user: run as root, or make it so (chmod 0666 /dev/net/tun)"
    } else if step.contains("TUNSETIFF") && code == libc::EPERM {
        "creating a TUN interface needs CAP_NET_ADMIN: run as root (sudo)"
    } else if step.contains("TUNSETIFF") && code == libc::EBUSY {
        "an interface of that name already exists in the namespace"
    } else if step.contains("/run/netns") && (code == libc::EPERM || code == libc::EACCES) {
        "naming a namespace under /run/netns needs root (CAP_SYS_ADMIN in the initial namespaces)"
    } else if (code == libc::EPERM || code == libc::EACCES) && step.contains("interface") {
        "configuring interfaces needs CAP_NET_ADMIN: run as root (sudo)"
    } else {
        ""
    };
    if s.is_empty() {
        String::new()
    } else {
        format!("; {s}")
    }
}

fn last(step: impl Into<String>) -> SysError {
    SysError::new(step, io::Error::last_os_error())
}

/// Moves the calling thread into a new, empty network namespace.
pub fn unshare_net() -> Result<(), SysError> {
    // SAFETY: plain syscall, affects only the calling thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(last("creating a network namespace (unshare CLONE_NEWNET)"));
    }
    Ok(())
}

/// Opens a handle to the calling thread's network namespace.
pub fn open_thread_netns() -> Result<OwnedFd, SysError> {
    let fd = open_path("/proc/thread-self/ns/net", libc::O_RDONLY | libc::O_CLOEXEC)
        .or_else(|_| {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            open_path(
                &format!("/proc/self/task/{tid}/ns/net"),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        })
        .map_err(|e| SysError::new("opening the network namespace handle", e))?;
    Ok(fd)
}

/// Moves the calling thread into the network namespace behind `ns`.
pub fn setns_net(ns: RawFd) -> Result<(), SysError> {
    // SAFETY: plain syscall on a caller-provided descriptor.
    if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } != 0 {
        return Err(last("entering a network namespace (setns)"));
    }
    Ok(())
}

fn open_path(path: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq_named(name: &str) -> Result<libc::ifreq, SysError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(SysError::new(
            format!("interface name {name:?}"),
            io::Error::from(io::ErrorKind::InvalidInput),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// Creates a TUN interface (layer 3, no packet-information header) in the
/// calling thread's network namespace; the descriptor is non-blocking.
pub fn open_tun(name: &str) -> Result<OwnedFd, SysError> {
    let fd = open_path(
        "/dev/net/tun",
        libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
    )
    .map_err(|e| SysError::new("opening /dev/net/tun", e))?;
    let mut req = ifreq_named(name)?;
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF takes a pointer to an ifreq that lives for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) };
    if rc != 0 {
        return Err(last(format!("creating TUN interface {name} (TUNSETIFF)")));
    }
    Ok(fd)
}

fn sockaddr_v4(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; the
    // kernel reads it back as sockaddr_in for AF_INET.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// An AF_INET datagram socket used only for interface ioctls.
struct CtlSocket(OwnedFd);

impl CtlSocket {
    fn new() -> Result<Self, SysError> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(last("opening a control socket for interface configuration"));
        }
        // SAFETY: fresh descriptor owned by nobody else.
        Ok(CtlSocket(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn ioctl(
        &self,
        req: libc::c_ulong,
        ifr: &mut libc::ifreq,
        what: &str,
        name: &str,
    ) -> Result<(), SysError> {
        // SAFETY: the interface ioctls used here take a pointer to an ifreq.
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), req as _, ifr as *mut libc::ifreq) };
        if rc != 0 {
            return Err(last(format!("{what} on interface {name}")));
        }
        Ok(())
    }

    fn set_up(&self, name: &str) -> Result<(), SysError> {
        let mut ifr = ifreq_named(name)?;
        self.ioctl(libc::SIOCGIFFLAGS, &mut ifr, "reading flags", name)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = unsafe { ifr.ifr_ifru.ifru_flags };
        ifr.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        self.ioctl(libc::SIOCSIFFLAGS, &mut ifr, "setting it up", name)
    }
}

/// Parameters of the TUN interface inside a namespace.
#[derive(Debug, Clone)]
pub struct IfaceConfig {
    /// Interface name (at most 15 bytes).
    pub name: String,
    /// IPv4 address.
    pub addr: Ipv4Addr,
    /// Prefix length of the on-link subnet.
    pub prefix: u8,
    /// MTU in bytes.
    pub mtu: u32,
    /// Kernel transmit queue length in packets.
    pub txqueuelen: u32,
}

/// Brings `lo` up and configures `cfg` (address, netmask, MTU, queue length,
/// up) in the calling thread's network namespace.
pub fn configure(cfg: &IfaceConfig) -> Result<(), SysError> {
    let sock = CtlSocket::new()?;
    sock.set_up("lo")?;
    let name = cfg.name.as_str();
    let mut ifr = ifreq_named(name)?;
    ifr.ifr_ifru.ifru_addr = sockaddr_v4(cfg.addr);
    sock.ioctl(libc::SIOCSIFADDR, &mut ifr, "setting the address", name)?;
    let mask = if cfg.prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(cfg.prefix.min(32)))
    };
    let mut ifr = ifreq_named(name)?;
    ifr.ifr_ifru.ifru_netmask = sockaddr_v4(Ipv4Addr::from(mask));
    sock.ioctl(libc::SIOCSIFNETMASK, &mut ifr, "setting the netmask", name)?;
    let mut ifr = ifreq_named(name)?;
    ifr.ifr_ifru.ifru_mtu = cfg.mtu as libc::c_int;
    sock.ioctl(libc::SIOCSIFMTU, &mut ifr, "setting the MTU", name)?;
    let mut ifr = ifreq_named(name)?;
    ifr.ifr_ifru.ifru_metric = cfg.txqueuelen as libc::c_int;
    // Best effort: a longer kernel queue absorbs bursts before the emulator
    // reads them, but changing it needs CAP_NET_ADMIN in the initial user
    // namespace, which an unprivileged user namespace does not have.
    let _ = sock.ioctl(
        libc::SIOCSIFTXQLEN,
        &mut ifr,
        "setting the queue length",
        name,
    );
    sock.set_up(name)?;
    // Keep IPv6 autoconfiguration chatter off the emulated link; best effort.
    let _ = fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    Ok(())
}

/// Makes the namespace behind `ns` visible as `/run/netns/<name>` (the place
/// `ip netns` looks), by bind-mounting it.
pub fn mount_named_netns(ns: RawFd, name: &str) -> Result<(), SysError> {
    let dir = Path::new("/run/netns");
    if !dir.exists() {
        fs::create_dir_all(dir).map_err(|e| SysError::new("creating /run/netns", e))?;
    }
    let target = dir.join(name);
    fs::File::create(&target)
        .map_err(|e| SysError::new(format!("creating {}", target.display()), e))?;
    let src = CString::new(format!("/proc/self/fd/{ns}"))
        .map_err(|_| SysError::new("mount source", io::Error::from(io::ErrorKind::InvalidInput)))?;
    let dst = CString::new(target.to_string_lossy().as_bytes())
        .map_err(|_| SysError::new("mount target", io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: valid NUL-terminated paths; a bind mount takes no data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = last(format!(
            "bind-mounting the namespace on {}",
            target.display()
        ));
        let _ = fs::remove_file(&target);
        return Err(e);
    }
    Ok(())
}

/// Removes `/run/netns/<name>` (unmounting it first).
pub fn unmount_named_netns(name: &str) -> Result<(), SysError> {
    let target = Path::new("/run/netns").join(name);
    if let Ok(dst) = CString::new(target.to_string_lossy().as_bytes()) {
        // SAFETY: valid NUL-terminated path.
        unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
    }
    match fs::remove_file(&target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SysError::new(format!("removing {}", target.display()), e)),
    }
}

/// Lowers the calling thread's timer slack to 1 ns so that timed wake-ups
/// are precise (the default slack is 50 µs).
pub fn precise_timers() {
    // SAFETY: prctl with PR_SET_TIMERSLACK only affects the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Waits until one of `fds` is readable or `timeout` passes; returns the
/// `revents` of each descriptor.
pub fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: pfds and ts are valid for the duration of the call.
    let rc = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
        .collect())
}

/// `read(2)` into `buf`; `Ok(None)` when it would block.
pub fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(n as usize))
}

/// `write(2)` of a whole packet.
pub fn write_fd(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of buf.len() bytes.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A non-blocking eventfd used to wake the forwarding threads.
pub fn eventfd() -> Result<OwnedFd, SysError> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(last("creating an eventfd"));
    }
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Signals an eventfd.
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Effective capabilities of this process (`CapEff` in /proc/self/status).
pub fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// CAP_NET_ADMIN bit.
pub const CAP_NET_ADMIN: u32 = 12;
/// CAP_SYS_ADMIN bit.
pub const CAP_SYS_ADMIN: u32 = 21;

/// Whether the process has capability `cap` in its effective set.
pub fn has_cap(cap: u32) -> bool {
    effective_caps() & (1u64 << cap) != 0
}

/// Whether process `pid` exists.
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
