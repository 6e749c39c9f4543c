//! A server's ACK frequency request reaches its peers and thins out their
//! ACKs, over a real quinn connection on loopback.

use std::time::Duration;

use bytes::Bytes;
use quichub_net::client::Client;
use quichub_net::server::Server;
use quichub_net::tls::{Identity, Verify};
use quichub_net::AckFrequency;

/// Datagrams the server sends, `GAP` apart: a sparse stream like 20 ms audio,
/// where every packet arrives on its own and only the receiver's ACK policy
/// decides how many ACKs go back.
const DATAGRAMS: u64 = 60;
const GAP: Duration = Duration::from_millis(10);
/// Datagrams received before counting ACKs: the request arrives after the
/// handshake, and the first packets are acknowledged the default way.
const WARM_UP: u64 = 10;

struct Seen {
    /// ACK_FREQUENCY frames the client received.
    ack_frequency_frames: u64,
    /// ACK frames the client sent while receiving the datagrams after `WARM_UP`.
    acks_sent: u64,
}

async fn receive_datagrams(ack: Option<AckFrequency>) -> Seen {
    let id = Identity::self_signed(&["localhost"]).unwrap();
    let server = Server::bind_with("127.0.0.1:0".parse().unwrap(), &id, ack).unwrap();
    let addr = server.local_addr().unwrap();
    let sender = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        for i in 0..DATAGRAMS {
            conn.send_datagram(Bytes::from(vec![i as u8; 120])).unwrap();
            tokio::time::sleep(GAP).await;
        }
        // Keep the connection (and the server) until the client is done.
        conn.closed().await;
    });

    let client = Client::new("127.0.0.1:0".parse().unwrap(), Verify::Insecure).unwrap();
    let dialed = client
        .dial(addr, "localhost", b"mqtt", false)
        .await
        .unwrap();
    let conn = dialed.connection().clone();
    let mut before = 0;
    for i in 0..DATAGRAMS {
        if i == WARM_UP {
            before = conn.stats().frame_tx.acks;
        }
        tokio::time::timeout(Duration::from_secs(10), conn.read_datagram())
            .await
            .expect("datagram within 10 s")
            .unwrap();
    }
    let stats = conn.stats();
    conn.close(0u32.into(), b"done");
    sender.await.unwrap();
    Seen {
        ack_frequency_frames: stats.frame_rx.ack_frequency,
        acks_sent: stats.frame_tx.acks - before,
    }
}

#[tokio::test]
async fn peers_acknowledge_less_when_asked() {
    let asked = receive_datagrams(Some(AckFrequency {
        threshold: 9,
        max_delay: Duration::from_millis(100),
    }))
    .await;
    assert!(
        asked.ack_frequency_frames >= 1,
        "the server sent ACK_FREQUENCY"
    );
    // 50 packets over 500 ms: one ACK per 10 packets or 100 ms is about 5.
    // QUIC's default (every other packet) is about 25, and a request capped at
    // the path RTT (25 ms on loopback, quinn's upstream behaviour) about 17.
    // A loaded machine that bunches packets only lowers the count.
    assert!(
        asked.acks_sent <= 10,
        "{} ACKs for {} datagrams",
        asked.acks_sent,
        DATAGRAMS - WARM_UP
    );

    let default = receive_datagrams(None).await;
    assert_eq!(
        default.ack_frequency_frames, 0,
        "nothing asked, nothing sent"
    );
}

#[test]
fn parses_packets_and_milliseconds() {
    let a: AckFrequency = "9,100".parse().unwrap();
    assert_eq!(a, AckFrequency::default());
    let a: AckFrequency = " 0 , 1 ".parse().unwrap();
    assert_eq!(
        a,
        AckFrequency {
            threshold: 0,
            max_delay: Duration::from_millis(1)
        }
    );
    for bad in [
        "", "9", "9,", ",100", "x,100", "9,y", "9,0", "9,1001", "1001,100", "-1,5",
    ] {
        assert!(bad.parse::<AckFrequency>().is_err(), "{bad:?} accepted");
    }
}
