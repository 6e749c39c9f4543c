//! Several QUIC endpoints on one port (`[quic] endpoints`): connections
//! spread over the shards' threads, each is served where it was accepted,
//! and a client whose address changes (a NAT rebinding, a migration) keeps
//! reaching the shard that holds its connection.

use std::sync::Arc;
use std::time::Duration;

use quichub_net::client::Client;
use quichub_net::quic_config::QuicConfig;
use quichub_net::server::Server;
use quichub_net::tls::{Identity, Verify};

const SHARDS: usize = 4;

/// A server whose every shard answers each bidirectional stream with the
/// index of the shard (thread) that served it.
fn start() -> (Arc<Server>, std::net::SocketAddr) {
    let id = Identity::self_signed(&["localhost"]).unwrap();
    let quic = QuicConfig {
        endpoints: SHARDS,
        ..Default::default()
    };
    let server =
        Arc::new(Server::bind_config("127.0.0.1:0".parse().unwrap(), &id, None, &quic).unwrap());
    assert_eq!(server.shards(), SHARDS);
    for shard in 0..SHARDS {
        let s = server.clone();
        let rt = server.shard_runtime(shard).expect("a thread per shard");
        rt.spawn(async move {
            while let Some(pending) = s.accept_on(shard).await {
                tokio::spawn(async move {
                    let Ok(conn) = pending.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let _ = recv.read_to_end(64).await;
                        let here = quichub_net::shard::current().expect("on a shard thread");
                        let _ = send.write_all(&[here as u8]).await;
                        let _ = send.finish();
                    }
                });
            }
        });
    }
    let addr = server.local_addr().unwrap();
    (server, addr)
}

/// A client on its own UDP port, and its connection to `addr`.
async fn dial(addr: std::net::SocketAddr) -> (Client, quinn::Connection) {
    let client = Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure).unwrap();
    let conn = client
        .dial(addr, "localhost", b"mqtt", false)
        .await
        .unwrap()
        .connection()
        .clone();
    (client, conn)
}

/// Which shard served a request on `conn` (within 5 s).
async fn ask(conn: &quinn::Connection) -> u8 {
    tokio::time::timeout(Duration::from_secs(5), async {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"which").await.unwrap();
        send.finish().unwrap();
        recv.read_to_end(8).await.unwrap()[0]
    })
    .await
    .expect("an answer within 5 s: the packets reached the connection's shard")
}

#[tokio::test]
async fn connections_spread_over_the_shards() {
    let (server, addr) = start();
    let mut seen = std::collections::BTreeSet::new();
    let mut clients = Vec::new();
    // 32 clients on their own ports: the kernel's hash of the 4-tuple puts
    // all of them on one of 4 shards with a chance of 4 × 4^-32.
    for _ in 0..32 {
        let (client, conn) = dial(addr).await;
        seen.insert(ask(&conn).await);
        clients.push((client, conn));
    }
    assert!(seen.len() > 1, "every connection on shard {seen:?}");
    assert!(seen.iter().all(|s| usize::from(*s) < SHARDS));
    assert!(server
        .stats()
        .render()
        .contains(&format!("quichub_quic_endpoints {SHARDS}")));
}

#[tokio::test]
async fn a_client_whose_address_changes_keeps_its_connection() {
    let (_server, addr) = start();
    let (client, conn) = dial(addr).await;
    let home = ask(&conn).await;
    // Each rebinding is a new source port, so a new kernel hash: without
    // steering by connection ID, 3 in 4 of them would land on a shard that
    // does not know the connection, and the request would go unanswered.
    for _ in 0..12 {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client.endpoint().rebind(socket).unwrap();
        assert_eq!(ask(&conn).await, home, "served by the same shard");
    }
    assert!(conn.close_reason().is_none());
}

/// A port another socket holds is refused, as a single endpoint's bind would
/// be: sockets of one still-closing relay must not join the new group.
#[test]
fn a_port_in_use_is_refused() {
    let id = Identity::self_signed(&["localhost"]).unwrap();
    let quic = QuicConfig {
        endpoints: SHARDS,
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let first = Server::bind_config("127.0.0.1:0".parse().unwrap(), &id, None, &quic).unwrap();
    let taken = first.local_addr().unwrap();
    let e = Server::bind_config(taken, &id, None, &quic)
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("another relay"), "{e:#}");
    drop(first);
}
