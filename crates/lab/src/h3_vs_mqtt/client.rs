//! quichub's own publishers for `quichub-lab h3-vs-mqtt`, run as a child
//! process (`quichub-lab h3-vs-mqtt --client PROTOCOL ...`) so that the
//! experiment can read its CPU time and peak memory with `wait4`, as for the
//! third-party clients.
//!
//! Each opens one connection, publishes `--count` messages of `--payload`
//! bytes to `--topic` and closes the connection cleanly. Every MQTT client
//! speaks MQTT 3.1.1 and publishes at QoS 1 with every PUBLISH sent at once
//! (pipelined) after CONNECT, then waits for every PUBACK; the HTTP/3 client
//! sends every `POST /v1/t/{topic}` at once (one request stream each) and
//! waits for every response.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use quichub_mqtt::QoS;

use super::types::{H3VsMqttArgs, Protocol};
use crate::common::mqtt::{self, PacketReader};

/// Longest a client run may take.
const LIMIT: Duration = Duration::from_secs(120);

/// Runs the client `a.client` names; prints one summary line on stdout.
pub fn main(a: &H3VsMqttArgs) -> anyhow::Result<i32> {
    let proto = a.client.context("no --client")?;
    let server: SocketAddr = a
        .server
        .as_deref()
        .context("--client needs --server ADDR")?
        .parse()
        .context("--server")?;
    let topic = a.topic.clone().unwrap_or_else(|| "hvm/own".into());
    // The MoQT publisher runs as `quichub pub` does: a worker per CPU.
    let rt = if proto == Protocol::Moqt {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    };
    let count = a.count;
    let payload = vec![b'x'; a.payload];
    let fingerprint = a.fingerprint.clone();
    let acked = rt.block_on(async move {
        let fut = async {
            match proto {
                Protocol::MqttTcp => mqtt_tcp(server, &topic, count, &payload).await,
                Protocol::MqttTls => mqtt_tls(server, &topic, count, &payload, fingerprint).await,
                Protocol::MqttQuicSingle => {
                    mqtt_quic_single(server, &topic, count, &payload, fingerprint).await
                }
                Protocol::MqttQuicMulti => {
                    mqtt_quic_multi(server, &topic, count, &payload, fingerprint).await
                }
                Protocol::Http3 => http3(server, &topic, count, &payload, fingerprint).await,
                Protocol::Moqt => moqt(server, &topic, fingerprint).await,
            }
        };
        match tokio::time::timeout(LIMIT, fut).await {
            Ok(r) => r,
            Err(_) => bail!("timed out after {LIMIT:?}"),
        }
    })?;
    println!("acknowledged {acked} of {count}");
    Ok(if acked == count { 0 } else { 1 })
}

fn verify(fingerprint: Option<String>) -> anyhow::Result<quichub_net::tls::Verify> {
    Ok(match fingerprint {
        Some(f) => quichub_net::tls::Verify::Fingerprints(vec![
            quichub_net::tls::unhex(&f).context("--fingerprint is not hex")?
        ]),
        None => bail!("--fingerprint is required"),
    })
}

fn connect() -> Vec<u8> {
    mqtt::connect(&format!("hvm-{}", std::process::id()))
}

fn publish(topic: &str, id: u16, payload: &[u8]) -> Vec<u8> {
    mqtt::publish(topic, QoS::AtLeastOnce, id, payload)
}

/// Packet id of publish `i` (1-based, wrapping below 65536).
fn pid(i: u64) -> u16 {
    (i % 65535 + 1) as u16
}

/// CONNECT and every PUBLISH on one byte stream, then CONNACK and every
/// PUBACK, then DISCONNECT; the PUBACKs read.
async fn mqtt_stream(
    s: &mut (impl AsyncRead + AsyncWrite + Unpin),
    topic: &str,
    count: u64,
    payload: &[u8],
) -> anyhow::Result<u64> {
    let mut first = connect();
    for i in 0..count {
        first.extend(publish(topic, pid(i), payload));
    }
    s.write_all(&first).await?;
    s.flush().await?;
    let mut packets = PacketReader::default();
    packets.connack(s).await.context("CONNACK")?;
    let mut acked = 0;
    while acked < count {
        packets.puback(s).await.context("PUBACK")?;
        acked += 1;
    }
    s.write_all(&mqtt::disconnect()).await?;
    s.flush().await?;
    Ok(acked)
}

async fn mqtt_tcp(
    server: SocketAddr,
    topic: &str,
    count: u64,
    payload: &[u8],
) -> anyhow::Result<u64> {
    let mut s = tokio::net::TcpStream::connect(server).await?;
    s.set_nodelay(true)?;
    let acked = mqtt_stream(&mut s, topic, count, payload).await?;
    s.shutdown().await?;
    // The broker closes its side after DISCONNECT: read to the end.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest)).await;
    Ok(acked)
}

async fn mqtt_tls(
    server: SocketAddr,
    topic: &str,
    count: u64,
    payload: &[u8],
    fingerprint: Option<String>,
) -> anyhow::Result<u64> {
    let config = quichub_net::client::tcp_client_config(verify(fingerprint)?, &[b"mqtt"])?;
    let tcp = tokio::net::TcpStream::connect(server).await?;
    tcp.set_nodelay(true)?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost")?;
    let mut s = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let acked = mqtt_stream(&mut s, topic, count, payload).await?;
    s.shutdown().await?;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest)).await;
    Ok(acked)
}

async fn quic(
    server: SocketAddr,
    alpn: &[u8],
    fingerprint: Option<String>,
) -> anyhow::Result<(quichub_net::client::Client, quinn::Connection)> {
    let client = quichub_net::client::Client::new(
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        verify(fingerprint)?,
    )?;
    let conn = match client.dial(server, "localhost", alpn, false).await? {
        quichub_net::client::Dialed::Full(c) => c,
        quichub_net::client::Dialed::Early { conn, .. } => conn,
    };
    Ok((client, conn))
}

/// Closes `conn` and waits until the CONNECTION_CLOSE is sent.
async fn close(client: quichub_net::client::Client, conn: quinn::Connection) {
    conn.close(0u32.into(), b"");
    client.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), client.wait_idle()).await;
}

/// MQTT over QUIC, single-stream mode: every packet on one bidirectional stream.
async fn mqtt_quic_single(
    server: SocketAddr,
    topic: &str,
    count: u64,
    payload: &[u8],
    fingerprint: Option<String>,
) -> anyhow::Result<u64> {
    let (client, conn) = quic(server, quichub_net::server::ALPN_MQTT, fingerprint).await?;
    let (send, recv) = conn.open_bi().await?;
    let mut s = tokio::io::join(recv, send);
    let acked = mqtt_stream(&mut s, topic, count, payload).await?;
    let (_, mut send) = s.into_inner();
    let _ = send.finish();
    close(client, conn).await;
    Ok(acked)
}

/// MQTT over QUIC, multi-stream mode: CONNECT on the control stream, then
/// each PUBLISH on a stream of its own (its PUBACK comes back there).
async fn mqtt_quic_multi(
    server: SocketAddr,
    topic: &str,
    count: u64,
    payload: &[u8],
    fingerprint: Option<String>,
) -> anyhow::Result<u64> {
    let (client, conn) = quic(server, quichub_net::server::ALPN_MQTT, fingerprint).await?;
    let (mut ctl_tx, mut ctl_rx) = conn.open_bi().await?;
    ctl_tx.write_all(&connect()).await?;
    PacketReader::default()
        .connack(&mut ctl_rx)
        .await
        .context("CONNACK")?;
    let mut tasks = Vec::new();
    for i in 0..count {
        let (mut tx, mut rx) = conn.open_bi().await?;
        tx.write_all(&publish(topic, pid(i), payload)).await?;
        tasks.push(tokio::spawn(async move {
            let acked = PacketReader::default().puback(&mut rx).await;
            let _ = tx.finish();
            acked
        }));
    }
    let mut acked = 0;
    for t in tasks {
        t.await??;
        acked += 1;
    }
    ctl_tx.write_all(&mqtt::disconnect()).await?;
    let _ = ctl_tx.finish();
    close(client, conn).await;
    Ok(acked)
}

/// HTTP/3: `POST /v1/t/{topic}` per message, all at once.
async fn http3(
    server: SocketAddr,
    topic: &str,
    count: u64,
    payload: &[u8],
    fingerprint: Option<String>,
) -> anyhow::Result<u64> {
    let (client, conn) = quic(server, quichub_net::server::ALPN_H3, fingerprint).await?;
    let h3 = std::sync::Arc::new(quichub_net::h3::client::Client::new(conn.clone()).await?);
    let path = format!("/v1/t/{topic}");
    let mut tasks = Vec::new();
    for _ in 0..count {
        let (h3, path) = (h3.clone(), path.clone());
        let body = bytes::Bytes::copy_from_slice(payload);
        tasks.push(tokio::spawn(async move {
            let r = h3
                .request(
                    &http::Method::POST,
                    "localhost",
                    &path,
                    &http::HeaderMap::new(),
                    body,
                    4096,
                )
                .await?;
            anyhow::ensure!(r.status / 100 == 2, "POST answered {}", r.status);
            Ok::<_, anyhow::Error>(())
        }));
    }
    let mut acked = 0;
    for t in tasks {
        t.await??;
        acked += 1;
    }
    drop(h3);
    close(client, conn).await;
    Ok(acked)
}

/// MoQT: every line of stdin (without its `\n`) an object of track
/// `mqtt/NS` `NAME` (the topic `NS/NAME`), all on one subgroup stream,
/// pushed with PUBLISH; what `quichub pub --profile stdin` does (the lab
/// does not run the product binary, which is built apart from it). Returns
/// the objects sent once the relay has acknowledged them.
async fn moqt(server: SocketAddr, topic: &str, fingerprint: Option<String>) -> anyhow::Result<u64> {
    let (ns, name) = topic.rsplit_once('/').unwrap_or(("hvm", topic));
    let opts = quichub_client::ConnectOptions {
        verify: verify(fingerprint)?,
        ..Default::default()
    };
    let session =
        quichub_client::ClientSession::connect(&format!("moqt://{server}/"), opts).await?;
    let result = moqt_publish(&session, ns, name).await;
    let (code, reason) = match &result {
        Ok(_) => (0, "done"),
        Err(_) => (1, "error"),
    };
    session.shutdown(code, reason).await;
    result
}

async fn moqt_publish(
    session: &quichub_client::ClientSession,
    ns: &str,
    name: &str,
) -> anyhow::Result<u64> {
    let name = moqt::FullTrackName {
        namespace: moqt::TrackNamespace::from_path(&format!("mqtt/{ns}")),
        name: bytes::Bytes::from(name.to_string()),
    };
    let track = session
        .create_track(name, 128, quichub_client::TrackMode::Push)
        .await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(64);
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut input = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            let item = match input.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                    }
                    Ok(line)
                }
                Err(e) => Err(e),
            };
            let end = item.is_err();
            if tx.blocking_send(item).is_err() || end {
                break;
            }
        }
    });
    let mut w = None;
    let mut id = 0u64;
    while let Some(item) = rx.recv().await {
        let object = item.context("read stdin")?;
        if w.is_none() {
            w = track.open_subgroup(0, 0).await?;
        }
        if let Some(w) = w.as_mut() {
            w.write(id, bytes::Bytes::from(object)).await?;
        }
        id += 1;
    }
    // Every object reaches the relay before the session closes (closing
    // drops unacknowledged data).
    if let Some(w) = w {
        if !w.finish_and_wait(Duration::from_secs(30)).await {
            eprintln!("warning: the relay did not acknowledge every object within 30 s");
        }
    }
    track.finish(1).await?;
    eprintln!("published {id} objects from stdin");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(id)
}
