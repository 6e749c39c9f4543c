//! Several QUIC endpoints on one UDP port, one per thread, so that the relay
//! uses every core ([`crate::QuicConfig::endpoints`]).
//!
//! Each endpoint (a *shard*) owns a socket of one `SO_REUSEPORT` group and
//! runs on a thread of its own with a single-threaded Tokio runtime: its
//! endpoint driver, its connections' drivers and the sessions accepted on it
//! all run there, so a connection's packets are received, decrypted, handled
//! and sent on one core without hand-offs between threads.
//!
//! Which socket gets a datagram is the kernel's choice; two rules make it the
//! endpoint that owns the connection:
//! - A connection's first packets (long header: Initial, Handshake, 0-RTT)
//!   are spread by the kernel's hash of the 4-tuple, which is the same for
//!   every packet of a handshake.
//! - Every connection ID a shard issues has its first byte congruent to the
//!   shard's index modulo the number of shards ([`ShardCids`]), and a classic
//!   BPF program on the group ([`steering_program`]) sends short-header
//!   packets (everything after the handshake) to socket `DCID[0] mod N`. So
//!   a client that migrates or is rebound by a NAT (new 4-tuple) still
//!   reaches the endpoint holding its connection, instead of one that would
//!   drop its packets.
//!
//! Stateless resets: each endpoint has its own reset key. A packet can only
//! reach a shard other than its connection's when the process restarted with
//! fewer shards; that shard answers with a reset the client does not accept
//! (its token is another key's), and the client times out as it would after
//! any restart.
//!
//! The first byte of a connection ID is visible on the wire. It tells an
//! on-path observer the shard (as QUIC-LB's plaintext server IDs do), no more:
//! the other bytes and the multiple of N in the first are random.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use quinn::{ConnectionId, ConnectionIdGenerator};

/// Most endpoints one port may have (the shard index must fit in the first
/// byte of a connection ID).
pub const MAX_SHARDS: usize = 128;

/// Length of the connection IDs the shards issue (quinn's default).
const CID_LEN: usize = 8;

thread_local! {
    static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The shard whose thread this is (`None` outside the shards' threads, for
/// example with a single endpoint on the caller's runtime).
pub fn current() -> Option<usize> {
    SHARD.with(Cell::get)
}

/// Connection IDs whose first byte is congruent to `shard` modulo `shards`,
/// everything else random.
#[derive(Debug, Clone, Copy)]
pub struct ShardCids {
    shard: u8,
    shards: u8,
}

impl ShardCids {
    /// The generator of shard `shard` of `shards` (`shard < shards <= MAX_SHARDS`).
    pub fn new(shard: usize, shards: usize) -> Self {
        assert!(shard < shards && shards <= MAX_SHARDS, "shard out of range");
        Self {
            shard: shard as u8,
            shards: shards as u8,
        }
    }

    /// The CID whose random bytes are `random`: its first byte is moved to
    /// the nearest value congruent to the shard.
    fn cid_with(&self, mut random: [u8; CID_LEN]) -> ConnectionId {
        let (n, s) = (u16::from(self.shards), u16::from(self.shard));
        // How many first bytes ≡ s (mod n) there are in 0..=255.
        let choices = (255 - s) / n + 1;
        random[0] = ((u16::from(random[0]) % choices) * n + s) as u8;
        ConnectionId::new(&random)
    }

    /// The shard a connection ID of this group belongs to.
    pub fn shard_of(&self, cid: &[u8]) -> Option<usize> {
        cid.first().map(|b| usize::from(*b % self.shards))
    }
}

impl ConnectionIdGenerator for ShardCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut random = [0u8; CID_LEN];
        // ring's system RNG: a CID must not be guessable (it keys stateless
        // resets and routing).
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
            .expect("system RNG");
        self.cid_with(random)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The classic BPF program that picks a socket of the group for a datagram
/// (the kernel runs it with the UDP payload at offset 0): a short-header
/// packet (first bit 0) goes to socket `DCID[0] mod shards`; for a long-header
/// packet it returns an index past the group, which makes the kernel fall
/// back to its 4-tuple hash.
#[cfg(target_os = "linux")]
pub fn steering_program(shards: u32) -> Vec<libc::sock_filter> {
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const MOD_K: u16 = (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16;
    const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    vec![
        op(LD_B_ABS, 0, 0, 0),          // A = first byte
        op(JSET_K, 3, 0, 0x80),         // long header: to the last
        op(LD_B_ABS, 0, 0, 1),          // A = DCID[0]
        op(MOD_K, 0, 0, shards.max(1)), // A %= shards
        op(RET_A, 0, 0, 0),             // that socket
        op(RET_K, 0, 0, u32::MAX),      // past the group: hash
    ]
}

/// Binds `shards` UDP sockets to `addr` in one `SO_REUSEPORT` group (port 0:
/// the port the first one got) and installs [`steering_program`] on it.
/// Socket `i` of the result is index `i` of the group.
pub fn bind_group(addr: SocketAddr, shards: usize) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    anyhow::ensure!(
        cfg!(target_os = "linux"),
        "[quic] endpoints above 1 need Linux (SO_REUSEPORT with a BPF program)"
    );
    anyhow::ensure!(
        (1..=MAX_SHARDS).contains(&shards),
        "[quic] endpoints must be between 1 and {MAX_SHARDS}"
    );
    if addr.port() != 0 {
        // Sockets still bound to the port (another relay, or an earlier one
        // still closing) would join our group and take part of its traffic,
        // with their own steering: refuse the port, as one socket's bind
        // would. (A plain bind fails while any socket holds the port.)
        crate::server::bind_udp_with(addr, false)
            .with_context(|| format!("bind UDP {addr} (is another relay still on it?)"))?;
    }
    let mut sockets: Vec<std::net::UdpSocket> = Vec::with_capacity(shards);
    let mut at = addr;
    for _ in 0..shards {
        let s = crate::server::bind_udp_with(at, true).with_context(|| format!("bind UDP {at}"))?;
        at = s.local_addr()?;
        sockets.push(s);
    }
    attach_steering(&sockets[0], shards as u32)
        .context("attach the connection-ID steering program (SO_ATTACH_REUSEPORT_CBPF)")?;
    Ok(sockets)
}

#[cfg(not(target_os = "linux"))]
fn attach_steering(_: &std::net::UdpSocket, _: u32) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(target_os = "linux")]
fn attach_steering(socket: &std::net::UdpSocket, shards: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut program = steering_program(shards);
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `program`, alive for the call; the kernel
    // copies the filter.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &prog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A shard's thread: its runtime lives until the [`ShardThread`] is dropped.
#[derive(Debug)]
pub struct ShardThread {
    /// The shard's runtime (spawn the shard's tasks here).
    pub handle: tokio::runtime::Handle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts shard `index`'s thread and runs `make` on its runtime (for the
/// endpoint, which must be created there so its tasks are spawned there).
pub fn spawn<T: Send + 'static>(
    index: usize,
    make: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<(ShardThread, T)> {
    let (made_tx, made_rx) = std::sync::mpsc::sync_channel(1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("quichub-quic-{index}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = made_tx.send(Err(anyhow::Error::from(e)));
                    return;
                }
            };
            SHARD.with(|s| s.set(Some(index)));
            rt.block_on(async move {
                let made = make().map(|t| (t, tokio::runtime::Handle::current()));
                let ok = made.is_ok();
                let _ = made_tx.send(made);
                if ok {
                    // Ends when the ShardThread is dropped.
                    let _ = stopped.await;
                }
            });
        })
        .context("start a QUIC endpoint thread")?;
    let (t, handle) = made_rx
        .recv()
        .context("QUIC endpoint thread ended before starting")??;
    Ok((
        ShardThread {
            handle,
            _stop: stop,
        },
        t,
    ))
}

/// The shard count `requested` means: 0 is one per CPU this process may run
/// on (1 where several endpoints are not supported).
pub fn resolve(requested: usize) -> usize {
    if requested == 0 && !cfg!(target_os = "linux") {
        return 1;
    }
    if requested > 0 {
        return requested.min(MAX_SHARDS);
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(MAX_SHARDS)
}

/// What a shard's endpoint needs beside its socket.
pub(crate) fn endpoint_config(shard: usize, shards: usize) -> quinn::EndpointConfig {
    let mut c = quinn::EndpointConfig::default();
    c.cid_generator(move || Box::new(ShardCids::new(shard, shards)));
    c
}

/// Keeps the shards' threads alive (dropped with the server).
pub(crate) type Threads = Arc<Vec<ShardThread>>;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn cids_land_on_their_shard_whatever_the_random_bytes() {
        for shards in [1usize, 2, 3, 7, 8, 128] {
            for shard in 0..shards {
                let g = ShardCids::new(shard, shards);
                for b in 0..=255u8 {
                    let cid = g.cid_with([b, 1, 2, 3, 4, 5, 6, 7]);
                    assert_eq!(cid.len(), CID_LEN);
                    assert_eq!(g.shard_of(&cid), Some(shard), "{shards}/{shard}/{b}");
                    // The remaining bytes are the random ones.
                    assert_eq!(&cid[1..], &[1, 2, 3, 4, 5, 6, 7]);
                }
            }
        }
    }

    #[test]
    fn first_byte_keeps_randomness() {
        // With 2 shards, shard 1 still gets 128 distinct first bytes.
        let g = ShardCids::new(1, 2);
        let firsts: std::collections::HashSet<u8> = (0..=255u8)
            .map(|b| g.cid_with([b, 0, 0, 0, 0, 0, 0, 0])[0])
            .collect();
        assert_eq!(firsts.len(), 128);
    }

    #[test]
    fn generated_cids_name_their_shard() {
        let mut b = ShardCids::new(3, 4);
        for _ in 0..64 {
            let cid = b.generate_cid();
            assert_eq!(b.shard_of(&cid), Some(3));
        }
    }

    /// Runs the steering program the way the kernel does, on a UDP payload.
    fn run(program: &[libc::sock_filter], payload: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = program[pc];
            let code = u32::from(i.code);
            match code {
                c if c == libc::BPF_LD | libc::BPF_B | libc::BPF_ABS => {
                    match payload.get(i.k as usize) {
                        Some(b) => a = u32::from(*b),
                        None => return 0, // an out-of-bounds load ends with 0
                    }
                }
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => {
                    pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf });
                }
                c if c == libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K => a %= i.k,
                c if c == libc::BPF_RET | libc::BPF_A => return a,
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                _ => panic!("unexpected instruction {code:#x}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn program_steers_short_headers_and_hashes_long_ones() {
        let p = steering_program(4);
        let mut g = ShardCids::new(2, 4);
        let cid = g.generate_cid();
        let mut short = vec![0x40];
        short.extend_from_slice(&cid);
        short.extend_from_slice(&[0; 20]);
        assert_eq!(run(&p, &short), 2);
        // Initial, Handshake, 0-RTT: past the group, so the kernel hashes.
        for first in [0xc0u8, 0xe0, 0xd0] {
            assert_eq!(run(&p, &[first, 0, 0, 0, 1, 8, 1, 2]), u32::MAX);
        }
    }
}
