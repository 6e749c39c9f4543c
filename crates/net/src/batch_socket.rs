//! A UDP socket for quinn that batches single-datagram transmits of *all*
//! connections into `sendmmsg` calls.
//!
//! Why: a relay fans one object out to many connections, and quinn's stock
//! socket makes one `sendmsg` per packet (GSO only helps several packets to
//! one peer). Here each connection's driver copies its packet into a queue
//! (`try_send`), and one flusher task, woken by the first packet queued,
//! sends the whole queue with `sendmmsg`, up to [`BATCH`] packets per
//! system call. On a current-thread runtime the flusher runs after the
//! drivers that a fan-out woke, so a fan-out's packets leave together.
//!
//! Order per destination is kept: transmits that are not batched (GSO
//! bursts, a chosen source address) flush the queue first. ECN marks go in a
//! per-message control message, as quinn-udp does. Receiving is quinn-udp's
//! (`recvmmsg`, GRO). Linux only.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::Interest;
use tokio::sync::Notify;

/// Packets per `sendmmsg` call.
pub const BATCH: usize = 64;

/// Packets queued at most; beyond, `try_send` says `WouldBlock` and quinn
/// waits for [`UdpPoller::poll_writable`].
const MAX_QUEUED: usize = 4096;

/// Sent packets' buffers kept for reuse.
const FREE_BUFFERS: usize = 256;

/// A queued datagram.
struct Packet {
    dest: SocketAddr,
    /// IP TOS / traffic class byte (ECN codepoint), 0 for none.
    tos: u8,
    /// Source address to send from (a server on a wildcard address answers
    /// from the address it was reached at).
    src: Option<IpAddr>,
    data: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    packets: VecDeque<Packet>,
    /// Buffers of sent packets, reused.
    free: Vec<Vec<u8>>,
}

/// See the module docs.
pub struct BatchSocket {
    io: tokio::net::UdpSocket,
    state: UdpSocketState,
    v6: bool,
    queue: Mutex<Queue>,
    /// Wakes the flusher (a stored permit: no wake-up is lost).
    flush: Arc<Notify>,
    /// Wakes pollers waiting for room in the queue.
    space: Notify,
}

impl fmt::Debug for BatchSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchSocket")
            .field("local", &self.io.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl BatchSocket {
    /// Wraps a bound socket; spawns the flusher on the current tokio runtime.
    pub fn new(sock: std::net::UdpSocket) -> io::Result<Arc<Self>> {
        let state = UdpSocketState::new((&sock).into())?;
        let v6 = sock.local_addr()?.is_ipv6();
        sock.set_nonblocking(true)?;
        let s = Arc::new(Self {
            io: tokio::net::UdpSocket::from_std(sock)?,
            state,
            v6,
            queue: Mutex::new(Queue::default()),
            flush: Arc::new(Notify::new()),
            space: Notify::new(),
        });
        tokio::spawn(flusher(Arc::downgrade(&s), s.flush.clone()));
        Ok(s)
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has_space(&self) -> bool {
        self.queue().packets.len() < MAX_QUEUED
    }

    /// Sends what is queued; `WouldBlock` when the socket buffer is full
    /// (what is left stays queued, in order).
    fn flush_now(&self) -> io::Result<()> {
        let mut q = self.queue();
        while !q.packets.is_empty() {
            let n = q.packets.len().min(BATCH);
            match self.send_batch(q.packets.range(..n)) {
                Ok(sent) => {
                    let Queue { packets, free } = &mut *q;
                    for p in packets.drain(..sent) {
                        if free.len() < FREE_BUFFERS {
                            let mut data = p.data;
                            data.clear();
                            free.push(data);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(e),
                Err(e) => {
                    // The first message failed (sendmmsg reports an error
                    // only then): it is lost, as a datagram may be.
                    tracing::debug!("sendmmsg: {e}");
                    q.packets.pop_front();
                }
            }
        }
        Ok(())
    }

    /// One `sendmmsg` of `packets`; the number sent (at least one) or the
    /// first one's error.
    fn send_batch<'a>(&self, packets: impl Iterator<Item = &'a Packet>) -> io::Result<usize> {
        // SAFETY: plain C structs, all-zero is a valid value for each.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        let mut iovs: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { std::mem::zeroed() };
        let mut cmsgs = [Cmsg::zeroed(); BATCH];
        let mut n = 0;
        for (i, p) in packets.enumerate() {
            iovs[i] = libc::iovec {
                iov_base: p.data.as_ptr() as *mut libc::c_void,
                iov_len: p.data.len(),
            };
            let addr_len = write_addr(&mut addrs[i], p.dest, self.v6);
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = &mut addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_namelen = addr_len;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            cmsgs[i].fill(h, p.tos, p.src, self.v6);
            n = i + 1;
        }
        let fd = self.io.as_raw_fd();
        self.io.try_io(Interest::WRITABLE, || {
            // SAFETY: `hdrs[..n]` point into `iovs`, `addrs` and `cmsgs`,
            // which outlive the call; the iovecs point into live packets.
            let r = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })
    }
}

impl Drop for BatchSocket {
    fn drop(&mut self) {
        // Lets the flusher see the socket is gone.
        self.flush.notify_one();
    }
}

async fn flusher(socket: Weak<BatchSocket>, flush: Arc<Notify>) {
    loop {
        flush.notified().await;
        let Some(s) = socket.upgrade() else {
            return;
        };
        loop {
            match s.flush_now() {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if s.io.writable().await.is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        s.space.notify_waiters();
    }
}

/// A control-message buffer for an `IP_TOS` / `IPV6_TCLASS` (an `int`) and
/// an `IP_PKTINFO` / `IPV6_PKTINFO`, as quinn-udp sends them.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Cmsg([u8; 64]);

impl Cmsg {
    const fn zeroed() -> Self {
        Self([0; 64])
    }

    /// Points `h` at this buffer holding the messages `tos` (if not 0) and
    /// `src` (if any) call for; leaves `h` without control data otherwise.
    fn fill(&mut self, h: &mut libc::msghdr, tos: u8, src: Option<IpAddr>, v6: bool) {
        if tos == 0 && src.is_none() {
            return;
        }
        let int = std::mem::size_of::<libc::c_int>() as u32;
        let pktinfo = if v6 {
            std::mem::size_of::<libc::in6_pktinfo>()
        } else {
            std::mem::size_of::<libc::in_pktinfo>()
        } as u32;
        // SAFETY: CMSG_SPACE(4) + CMSG_SPACE(20) = 16 + 40 bytes fit the
        // 64-byte, 8-aligned buffer; each header and payload is written
        // inside the space CMSG_FIRSTHDR/CMSG_NXTHDR hand out for it.
        unsafe {
            let mut space = 0usize;
            if tos != 0 {
                space += libc::CMSG_SPACE(int) as usize;
            }
            if src.is_some() {
                space += libc::CMSG_SPACE(pktinfo) as usize;
            }
            debug_assert!(space <= self.0.len());
            h.msg_control = self.0.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = space as _;
            let mut c = libc::CMSG_FIRSTHDR(h);
            if tos != 0 {
                (*c).cmsg_level = if v6 {
                    libc::IPPROTO_IPV6
                } else {
                    libc::IPPROTO_IP
                };
                (*c).cmsg_type = if v6 { libc::IPV6_TCLASS } else { libc::IP_TOS };
                (*c).cmsg_len = libc::CMSG_LEN(int) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c) as *mut libc::c_int,
                    tos as libc::c_int,
                );
                c = libc::CMSG_NXTHDR(h, c);
            }
            if let Some(ip) = src {
                (*c).cmsg_len = libc::CMSG_LEN(pktinfo) as _;
                if v6 {
                    let addr = match ip {
                        IpAddr::V4(a) => a.to_ipv6_mapped(),
                        IpAddr::V6(a) => a,
                    };
                    let info = libc::in6_pktinfo {
                        ipi6_addr: libc::in6_addr {
                            s6_addr: addr.octets(),
                        },
                        ipi6_ifindex: 0,
                    };
                    (*c).cmsg_level = libc::IPPROTO_IPV6;
                    (*c).cmsg_type = libc::IPV6_PKTINFO;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::in6_pktinfo, info);
                } else if let IpAddr::V4(a) = ip {
                    let info = libc::in_pktinfo {
                        ipi_ifindex: 0,
                        ipi_spec_dst: libc::in_addr {
                            s_addr: u32::from_ne_bytes(a.octets()),
                        },
                        ipi_addr: libc::in_addr { s_addr: 0 },
                    };
                    (*c).cmsg_level = libc::IPPROTO_IP;
                    (*c).cmsg_type = libc::IP_PKTINFO;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::in_pktinfo, info);
                }
            }
        }
    }
}

/// Writes `dest` (v4-mapped on an IPv6 socket) into `out`; returns its length.
fn write_addr(out: &mut libc::sockaddr_storage, dest: SocketAddr, v6: bool) -> libc::socklen_t {
    let dest = match (dest, v6) {
        (SocketAddr::V4(a), true) => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        (d, _) => d,
    };
    let sa: socket2::SockAddr = dest.into();
    // SAFETY: a SockAddr's storage is a sockaddr_storage of `len` valid bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sa.as_ptr() as *const u8,
            out as *mut _ as *mut u8,
            sa.len() as usize,
        );
    }
    sa.len()
}

impl AsyncUdpSocket for BatchSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Poller {
            socket: self,
            fut: None,
        })
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        let single = t.segment_size.is_none_or(|s| s >= t.contents.len());
        // An IPv6 source on an IPv4 socket cannot be expressed: quinn-udp's path.
        let odd_src = matches!(t.src_ip, Some(IpAddr::V6(_))) && !self.v6;
        if !single || odd_src {
            // Not batched: what is queued goes first (order per peer).
            self.flush_now()?;
            return self
                .io
                .try_io(Interest::WRITABLE, || self.state.send((&self.io).into(), t));
        }
        let mut q = self.queue();
        if q.packets.len() >= MAX_QUEUED {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut data = q.free.pop().unwrap_or_default();
        data.extend_from_slice(t.contents);
        let was_empty = q.packets.is_empty();
        q.packets.push_back(Packet {
            dest: t.destination,
            tos: t.ecn.map_or(0, |e| e as u8),
            src: t.src_ip,
            data,
        });
        drop(q);
        if was_empty {
            self.flush.notify_one();
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.io.poll_recv_ready(cx))?;
            if let Ok(res) = self.io.try_io(Interest::READABLE, || {
                self.state.recv((&self.io).into(), bufs, meta)
            }) {
                return Poll::Ready(Ok(res));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }
}

type WritableFut = Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>;

/// Ready when the queue has room and the socket is writable.
struct Poller {
    socket: Arc<BatchSocket>,
    fut: Option<WritableFut>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl UdpPoller for Poller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        if self.fut.is_none() {
            let s = self.socket.clone();
            self.fut = Some(Box::pin(async move {
                loop {
                    let room = s.space.notified();
                    tokio::pin!(room);
                    room.as_mut().enable();
                    if s.has_space() {
                        return s.io.writable().await;
                    }
                    room.await;
                }
            }));
        }
        let r = ready!(self.fut.as_mut().expect("set above").as_mut().poll(cx));
        self.fut = None;
        Poll::Ready(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many transmits to several peers arrive complete, in order per peer,
    /// with their ECN marks, through `sendmmsg` batches.
    #[tokio::test(flavor = "current_thread")]
    async fn batched_transmits_arrive_in_order() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = BatchSocket::new(sock).unwrap();
        let peers: Vec<tokio::net::UdpSocket> = futures_peers(3).await;
        let total = 3 * (BATCH + 7);
        for i in 0..total {
            let peer = &peers[i % 3];
            let payload = (i as u32).to_be_bytes();
            let t = Transmit {
                destination: peer.local_addr().unwrap(),
                ecn: (i % 2 == 0).then_some(quinn::udp::EcnCodepoint::Ect0),
                contents: &payload,
                segment_size: None,
                src_ip: (i % 3 == 1).then(|| "127.0.0.1".parse().unwrap()),
            };
            s.try_send(&t).unwrap();
        }
        for (k, peer) in peers.iter().enumerate() {
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while got.len() < total / 3 {
                let n =
                    tokio::time::timeout(std::time::Duration::from_secs(5), peer.recv(&mut buf))
                        .await
                        .expect("datagram")
                        .unwrap();
                got.push(u32::from_be_bytes(buf[..n].try_into().unwrap()) as usize);
            }
            let want: Vec<usize> = (0..total).filter(|i| i % 3 == k).collect();
            assert_eq!(got, want);
        }
    }

    async fn futures_peers(n: usize) -> Vec<tokio::net::UdpSocket> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        }
        v
    }

    #[test]
    fn v4_destinations_are_mapped_on_v6_sockets() {
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = write_addr(&mut st, "127.0.0.1:9".parse().unwrap(), true);
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in6>());
        assert_eq!(st.ss_family as i32, libc::AF_INET6);
        let len = write_addr(&mut st, "127.0.0.1:9".parse().unwrap(), false);
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
    }
}
