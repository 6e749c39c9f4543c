//! `mqtt-quic-probe`: MQTT over QUIC in EMQX's multi-stream mode, for tests.
//!
//! The MQTT and QUIC protocol work is flowsdk's `QuicMqttEngine` (EMQX's SDK);
//! this program drives its UDP socket and prints what happens, one line each:
//!
//! ```text
//! connected control=<stream>
//! subscribed <filter> stream=<stream> codes=<codes>
//! published <topic> stream=<stream> qos=<qos>
//! message stream=<stream|control> qos=<qos> <topic> <payload>
//! ```
//!
//! Each `--sub` gets its own bidirectional data stream, and so does each
//! `--pub` (opened after every SUBACK has arrived). The program exits 0 once
//! every publish is acknowledged and `--count` messages have arrived, and 1
//! on an error or at `--timeout`.
//!
//! ```text
//! mqtt-quic-probe --addr 127.0.0.1:4443 (--ca cert.pem | --insecure)
//!     [--server-name localhost] [--version 4|5] [--qos 0|1|2]
//!     [--sub FILTER]... [--pub TOPIC=PAYLOAD]... [--count N] [--timeout SECS]
//!     [--client-id ID]
//! ```

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowsdk::mqtt_client::commands::{PublishCommand, SubscribeCommand};
use flowsdk::mqtt_client::engine::{MqttEvent, QuicMqttEngine};
use flowsdk::mqtt_client::opts::MqttClientOptions;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

#[derive(Default)]
struct Args {
    addr: Option<SocketAddr>,
    ca: Option<String>,
    insecure: bool,
    server_name: String,
    version: u8,
    qos: u8,
    subs: Vec<String>,
    pubs: Vec<(String, String)>,
    count: usize,
    timeout: u64,
    client_id: String,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        server_name: "localhost".into(),
        version: 5,
        timeout: 10,
        client_id: format!("mqtt-quic-probe-{}", std::process::id()),
        ..Args::default()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--addr" => a.addr = Some(val()?.parse().map_err(|e| format!("--addr: {e}"))?),
            "--ca" => a.ca = Some(val()?),
            "--insecure" => a.insecure = true,
            "--server-name" => a.server_name = val()?,
            "--version" => a.version = val()?.parse().map_err(|e| format!("--version: {e}"))?,
            "--qos" => a.qos = val()?.parse().map_err(|e| format!("--qos: {e}"))?,
            "--sub" => a.subs.push(val()?),
            "--pub" => {
                let v = val()?;
                let (t, p) = v.split_once('=').ok_or("--pub takes TOPIC=PAYLOAD")?;
                a.pubs.push((t.into(), p.into()));
            }
            "--count" => a.count = val()?.parse().map_err(|e| format!("--count: {e}"))?,
            "--timeout" => a.timeout = val()?.parse().map_err(|e| format!("--timeout: {e}"))?,
            "--client-id" => a.client_id = val()?,
            "--version-info" | "-V" => {
                println!(
                    "mqtt-quic-probe {} (flowsdk 0.7.0)",
                    env!("CARGO_PKG_VERSION")
                );
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("see the comment at the top of tools/mqtt-quic-probe/src/main.rs");
                std::process::exit(0);
            }
            f => return Err(format!("unknown argument {f}")),
        }
    }
    if a.addr.is_none() {
        return Err("--addr is required".into());
    }
    if a.ca.is_none() && !a.insecure {
        return Err("give --ca PEM or --insecure".into());
    }
    Ok(a)
}

/// Accepts any server certificate (`--insecure`), still checking handshake signatures.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls(a: &Args) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    Ok(if a.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let path = a.ca.as_deref().unwrap_or_default();
        for c in CertificateDer::pem_file_iter(path).map_err(|e| format!("{path}: {e}"))? {
            roots
                .add(c.map_err(|e| format!("{path}: {e}"))?)
                .map_err(|e| format!("{path}: {e}"))?;
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    })
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mqtt-quic-probe: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mqtt-quic-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let server = a.addr.expect("checked");
    let opts = MqttClientOptions::builder()
        .client_id(a.client_id.clone())
        .peer(server.to_string())
        .mqtt_version(a.version)
        .keep_alive(30)
        .clean_start(true)
        .build();
    let mut engine = QuicMqttEngine::new(opts).map_err(|e| format!("{e:?}"))?;
    let bind: SocketAddr = if server.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("valid");
    let socket = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_millis(2)))
        .map_err(|e| e.to_string())?;
    engine
        .connect(server, &a.server_name, tls(a)?, Instant::now())
        .map_err(|e| format!("connect: {e:?}"))?;

    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let mut connected = false;
    // SUBSCRIBE packet id → (filter, stream); PUBLISH packet id → (topic, stream).
    let mut subs_waiting: HashMap<u16, (String, u64)> = HashMap::new();
    let mut pubs_waiting: HashMap<u16, (String, u64)> = HashMap::new();
    let mut published = false;
    let mut received = 0usize;
    let mut last_stream: Option<u64> = None;
    let mut closing: Option<Instant> = None;
    let mut buf = vec![0u8; 65536];
    loop {
        let now = Instant::now();
        if now > deadline && closing.is_none() {
            return Err(format!(
                "timeout: connected={connected} subs_waiting={} pubs_waiting={} received={received}/{}",
                subs_waiting.len(),
                pubs_waiting.len(),
                a.count
            ));
        }
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            if from == server {
                engine.handle_datagram(buf[..n].to_vec(), from, Instant::now());
            }
        }
        for ev in engine.handle_tick(Instant::now()) {
            match ev {
                MqttEvent::Connected(r) => {
                    if !r.is_success() {
                        return Err(format!("CONNACK refused: {r:?}"));
                    }
                    connected = true;
                    let control = engine
                        .control_stream_id()
                        .map_or("?".into(), |s| s.to_string());
                    println!("connected control={control}");
                    for f in &a.subs {
                        let stream = engine.open_data_stream().map_err(|e| format!("{e:?}"))?;
                        let cmd = SubscribeCommand::builder()
                            .add_topic(f.clone(), a.qos)
                            .build()
                            .map_err(|e| format!("{e:?}"))?;
                        let id = engine
                            .subscribe_on(stream, cmd)
                            .map_err(|e| format!("subscribe: {e:?}"))?;
                        subs_waiting.insert(id, (f.clone(), stream));
                    }
                }
                MqttEvent::Subscribed(r) => {
                    if let Some((f, s)) = subs_waiting.remove(&r.packet_id) {
                        if !r.is_success() {
                            return Err(format!("SUBACK refused {f}: {:?}", r.reason_codes));
                        }
                        println!("subscribed {f} stream={s} codes={:?}", r.reason_codes);
                    }
                }
                MqttEvent::Published(r) => {
                    if let Some(id) = r.packet_id {
                        if let Some((t, s)) = pubs_waiting.remove(&id) {
                            if !r.is_success() {
                                return Err(format!("publish {t} refused: {r:?}"));
                            }
                            println!("published {t} stream={s} qos={}", r.qos);
                        }
                    }
                }
                MqttEvent::PublishReceived { stream, .. } => last_stream = stream,
                MqttEvent::MessageReceived(m) => {
                    let s = last_stream
                        .take()
                        .map_or("control".into(), |s| s.to_string());
                    println!(
                        "message stream={s} qos={} {} {}",
                        m.qos,
                        m.topic_name,
                        String::from_utf8_lossy(&m.payload)
                    );
                    received += 1;
                }
                MqttEvent::Disconnected(r) => {
                    if closing.is_some() {
                        return Ok(());
                    }
                    return Err(format!("disconnected: {r:?}"));
                }
                MqttEvent::DisconnectReceived { reason_code, .. } => {
                    return Err(format!("DISCONNECT from the server: {reason_code:#x}"));
                }
                MqttEvent::TransportClosed { reason, .. } => {
                    if closing.is_some() {
                        return Ok(());
                    }
                    return Err(format!("connection closed: {reason}"));
                }
                MqttEvent::Error(e) => eprintln!("mqtt-quic-probe: {e:?}"),
                MqttEvent::OperationFailed { error, .. } => {
                    return Err(format!("operation failed: {error:?}"));
                }
                _ => {}
            }
        }
        if connected && subs_waiting.is_empty() && !published {
            published = true;
            for (t, p) in &a.pubs {
                let stream = engine.open_data_stream().map_err(|e| format!("{e:?}"))?;
                let cmd = PublishCommand::builder()
                    .topic(t.clone())
                    .payload(p.clone().into_bytes())
                    .qos(a.qos)
                    .build()
                    .map_err(|e| format!("{e:?}"))?;
                match engine
                    .publish_on(stream, cmd)
                    .map_err(|e| format!("publish: {e:?}"))?
                {
                    Some(id) => {
                        pubs_waiting.insert(id, (t.clone(), stream));
                    }
                    None => println!("published {t} stream={stream} qos=0"),
                }
            }
        }
        for (dest, data) in engine.take_outgoing_datagrams() {
            let _ = socket.send_to(&data, dest);
        }
        if published && pubs_waiting.is_empty() && received >= a.count && closing.is_none() {
            let _ = engine.disconnect_and_close(0, b"done");
            closing = Some(Instant::now());
            for (dest, data) in engine.take_outgoing_datagrams() {
                let _ = socket.send_to(&data, dest);
            }
        }
        if closing.is_some_and(|c| c.elapsed() > Duration::from_millis(300)) {
            return Ok(());
        }
    }
}
