//! Per-client rate limits through the real listeners: an MQTT client over
//! its `[mqtt] publish_rate` or `publish_bytes_rate` is throttled (read more
//! slowly, nothing lost, keep alive kept), an HTTP client address over
//! `[http] publish_rate` gets 429 with `Retry-After`, and a MoQT session over
//! `[relay] max_requests_per_second` gets EXCESSIVE_LOAD and stays up; each
//! counted in `/metrics`. Assertions are on counts and order, not on how long
//! anything took.

use quichub_testkit as common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use common::mqtt::Raw;
use common::{mqtt_tools, test_config, within, TestGateway, TestRelay};
use moqt::message::Message;
use moqt::{FullTrackName, Location, Parameters, TrackNamespace};
use quichub_gateway::metrics::ThrottleReason;
use quichub_mqtt::{Packet, Publish, QoS, Version};
use quichub_relay::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A gateway whose MQTT connections are limited as `limit` sets.
async fn gateway(limit: impl FnOnce(&mut quichub_hub::MqttSection)) -> TestGateway {
    let mut c = test_config();
    c.mqtt.tcp = "127.0.0.1:0".into();
    c.metrics.address = "127.0.0.1:0".into();
    limit(&mut c.mqtt);
    TestGateway::with_hub_config(c).await
}

fn publish(topic: &str, qos: QoS, id: u16, payload: Vec<u8>) -> Packet {
    Packet::Publish(Publish {
        qos,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(id),
        payload: Bytes::from(payload),
        ..Publish::default()
    })
}

/// Reads `n` PUBLISHes from `sub` and returns their payloads.
async fn payloads(sub: &mut Raw, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    while got.len() < n {
        match sub.recv().await {
            Some(Packet::Publish(p)) => got.push(p.payload.to_vec()),
            Some(_) => {}
            None => panic!("subscriber closed after {} messages", got.len()),
        }
    }
    got
}

/// `GET /metrics` from the hub's metrics listener.
async fn metrics(hub: &quichub_hub::Hub) -> String {
    let mut s = TcpStream::connect(hub.metrics_addr().unwrap())
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    within(10, s.read_to_end(&mut out)).await.unwrap();
    String::from_utf8(out).unwrap()
}

/// publish_rate 50 with a burst of 5: 50 QoS 0 messages written at once are
/// all delivered, in order, and the connection was throttled on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_flood_is_throttled_and_delivered_in_order() {
    let gw = gateway(|m| {
        m.publish_rate = 50;
        m.publish_burst = 5;
    })
    .await;
    let mut sub = Raw::connect(&gw, Version::V5, "flood-sub").await;
    sub.subscribe("flood", QoS::AtMostOnce).await;
    let mut publisher = Raw::connect(&gw, Version::V5, "flood-pub").await;
    let mut burst = bytes::BytesMut::new();
    for i in 0..50u32 {
        let p = publish("flood", QoS::AtMostOnce, 0, i.to_be_bytes().to_vec());
        quichub_mqtt::encode(&p, Version::V5, &mut burst).unwrap();
    }
    publisher.send_raw(&burst).await;
    let got = within(30, payloads(&mut sub, 50)).await;
    let want: Vec<Vec<u8>> = (0..50u32).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(got, want);
    let m = &gw.broker.metrics;
    assert!(m.throttled(ThrottleReason::Messages) >= 1);
    assert_eq!(m.throttled(ThrottleReason::Bytes), 0);
    // The connection is still served: a PINGREQ is answered.
    publisher.send(&Packet::PingReq).await;
    assert!(matches!(publisher.recv().await, Some(Packet::PingResp)));
    let text = metrics(&gw.relay.hub).await;
    let line = text
        .lines()
        .find(|l| l.starts_with("quichub_mqtt_throttled_total{limit=\"messages\"}"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_ne!(line, "quichub_mqtt_throttled_total{limit=\"messages\"} 0");
}

/// The same with the third-party clients: `mosquitto_pub -l` publishes 30
/// lines at QoS 1 as fast as its PUBACKs come; `mosquitto_sub` gets them all,
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_pub_is_throttled_not_refused() {
    if mqtt_tools().is_none() {
        return;
    }
    use std::process::Stdio;
    use tokio::process::Command;
    let gw = gateway(|m| {
        m.publish_rate = 40;
        m.publish_burst = 2;
    })
    .await;
    let port = gw.mqtt.port().to_string();
    let sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port, "-i", "msub", "-t", "lines"])
        .args(["-q", "1", "-C", "30", "-V", "mqttv5"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    within(10, async {
        while gw.broker.client_subscriptions("msub") == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut publisher = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "lines",
            "-q",
            "1",
            "-l",
        ])
        .args(["-V", "mqttv5"])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines: String = (0..30).map(|i| format!("line {i}\n")).collect();
    let mut stdin = publisher.stdin.take().unwrap();
    stdin.write_all(lines.as_bytes()).await.unwrap();
    drop(stdin);
    let out = within(30, sub.wait_with_output()).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), lines);
    assert!(within(10, publisher.wait()).await.unwrap().success());
    assert!(gw.broker.metrics.throttled(ThrottleReason::Messages) >= 1);
}

/// publish_bytes_rate: a message larger than the burst still passes (it
/// goes into debt), the next waits for the debt, longer than the keep
/// alive, and the connection is not taken for idle meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_bandwidth_is_throttled_without_a_keep_alive_timeout() {
    let gw = gateway(|m| {
        m.publish_bytes_rate = 200;
        m.publish_bytes_burst = 100;
    })
    .await;
    let mut sub = Raw::connect(&gw, Version::V311, "bytes-sub").await;
    sub.subscribe("big", QoS::AtMostOnce).await;
    // Keep alive 1 s: the broker gives up on a silent client after 1.5 s.
    let (mut publisher, ack) = Raw::connect_with(
        gw.mqtt,
        quichub_mqtt::Connect {
            version: Version::V311,
            client_id: "bytes-pub".into(),
            clean_start: true,
            keep_alive: 1,
            ..common::mqtt::persistent_connect(Version::V311, "x", true)
        },
    )
    .await;
    assert_eq!(ack.code, 0);
    let mut both = bytes::BytesMut::new();
    for b in [b'a', b'b'] {
        let p = publish("big", QoS::AtMostOnce, 0, vec![b; 500]);
        quichub_mqtt::encode(&p, Version::V311, &mut both).unwrap();
    }
    publisher.send_raw(&both).await;
    // The first 500-odd bytes leave a debt of about 400: 2 s at 200 a
    // second before the second message is read.
    let got = within(30, payloads(&mut sub, 2)).await;
    assert_eq!(got, [vec![b'a'; 500], vec![b'b'; 500]]);
    assert!(gw.broker.metrics.throttled(ThrottleReason::Bytes) >= 1);
    publisher.send(&Packet::PingReq).await;
    assert!(matches!(publisher.recv().await, Some(Packet::PingResp)));
}

/// One HTTP/1.1 request on a connection of its own: the status and the
/// `Retry-After` header.
async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, Option<u64>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        addr.port()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    within(10, s.read_to_end(&mut out)).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let retry = text.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("retry-after:")
            .map(|v| v.trim().parse().unwrap())
    });
    (status, retry)
}

/// `[http] publish_rate` 2 a second, burst 3: of ten POSTs at once from one
/// address the burst passes and the rest get 429 with `Retry-After`; other
/// methods are not counted; after the Retry-After a POST passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_posts_beyond_the_burst_get_429() {
    let mut c = test_config();
    c.http.address = "127.0.0.1:0".into();
    c.metrics.address = "127.0.0.1:0".into();
    c.http.publish_rate = 2;
    c.http.publish_burst = 3;
    let gw = TestGateway::with_hub_config(c).await;
    let hub = &gw.relay.hub;
    let http = hub.http_addr().unwrap();
    assert_eq!(request(http, "PUT", "/v1/t/rate").await.0, 201);
    let (mut ok, mut refused, mut retry) = (0, 0, 0);
    for _ in 0..10 {
        match request(http, "POST", "/v1/t/rate").await {
            (204, None) => ok += 1,
            (429, Some(r)) => {
                assert!(r >= 1, "Retry-After {r}");
                retry = retry.max(r);
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    // The burst, and a few more had the machine taken seconds over these.
    assert!(ok >= 3 && refused >= 1, "{ok} passed, {refused} refused");
    assert_eq!(hub.http_api().publish_rate().refused(), refused);
    // Reads and topic management are not publishes.
    for _ in 0..5 {
        assert_eq!(request(http, "PUT", "/v1/t/rate").await.0, 200);
    }
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(request(http, "POST", "/v1/t/rate").await.0, 204);
    let text = metrics(hub).await;
    assert!(
        text.contains(&format!("quichub_http_rate_limited_total {refused}\n")),
        "{text}"
    );
}

/// Past `max_requests_per_second` (after its burst) a request of any type
/// gets REQUEST_ERROR EXCESSIVE_LOAD with a Retry Interval, and the session
/// stays up; a REQUEST_UPDATE is not refused (that would end its request) but
/// waits its turn; once the Retry Interval has passed a request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_rate_get_excessive_load_and_the_session_stays() {
    use moqt::error::request_error;
    use moqt::message::{Fetch, FetchKind, NamespaceRequest, RequestUpdate, Subscribe};
    use quichub_net::io::MessageReader;
    let relay = TestRelay::with_config(Config {
        max_requests_per_second: 2,
        request_burst: 3,
        ..Config::default()
    })
    .await;
    let session = relay.raw("moqt").await;
    let mut control = session.open_uni().await.unwrap();
    let setup = moqt::session::make_setup("raw", Some("127.0.0.1"), Some("/"));
    control
        .write_all(&Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    let mut ids = (0u64..).step_by(2);
    let track = |i: u64| FullTrackName::new(&format!("rate/{i}"), "t");
    // Every request type, in turn; the first, a SUBSCRIBE_NAMESPACE, stays
    // open for the REQUEST_UPDATEs below.
    let request = |kind: u64, id: u64| match kind % 5 {
        0 => Message::SubscribeNamespace(NamespaceRequest {
            request_id: id,
            namespace: TrackNamespace::from_path(&format!("rate/ns{id}")),
            params: Parameters::default(),
        }),
        1 => Message::PublishNamespace(NamespaceRequest {
            request_id: id,
            namespace: TrackNamespace::from_path(&format!("rate/pub{id}")),
            params: Parameters::default(),
        }),
        2 => Message::TrackStatus(Subscribe {
            request_id: id,
            track: track(id),
            params: Parameters::default(),
        }),
        3 => Message::Fetch(Fetch {
            request_id: id,
            kind: FetchKind::Standalone {
                track: track(id),
                start: Location::new(0, 0),
                end: Location::new(1, 0),
            },
            params: Parameters::default(),
        }),
        _ => Message::Subscribe(Subscribe {
            request_id: id,
            track: track(id),
            params: Parameters::default(),
        }),
    };
    let mut streams = Vec::new();
    for kind in 0..10 {
        let (mut send, recv) = session.open_bi().await.unwrap();
        send.write_all(&request(kind, ids.next().unwrap()).to_bytes())
            .await
            .unwrap();
        let mut reader = MessageReader::new(recv, &[]);
        if kind == 0 {
            // The updates below go on this SUBSCRIBE_NAMESPACE: it is
            // answered before the burst, so it is among the requests served
            // (streams opened together reach the relay in any order).
            match within(10, reader.next()).await.unwrap() {
                Message::RequestOk(_) => {}
                other => panic!("REQUEST_OK expected: {other:?}"),
            }
        }
        streams.push((send, reader));
    }
    let (mut refused, mut retry) = (0, 0);
    for (_, reader) in &mut streams[1..] {
        match within(10, reader.next()).await.unwrap() {
            Message::RequestError(e) if e.code == request_error::EXCESSIVE_LOAD => {
                assert_eq!(&e.reason[..], b"too many requests per second");
                assert!(e.retry_interval > 1, "{e:?}");
                refused += 1;
                retry = retry.max(e.retry_interval);
            }
            _ => {}
        }
    }
    // The burst of three passes (and at most a few more, had the machine
    // taken seconds over these); the rest are refused.
    assert!((1..=7).contains(&refused), "{refused} refused");
    let m = &relay.relay.metrics;
    assert_eq!(m.requests_refused_rate.load(Relaxed), refused);
    // The bucket is empty: each REQUEST_UPDATE waits for a token, and is
    // acknowledged.
    let (send, reader) = &mut streams[0];
    let mut updates = Vec::new();
    for _ in 0..3 {
        let u = Message::RequestUpdate(RequestUpdate {
            request_id: ids.next().unwrap(),
            params: Parameters::default(),
        });
        updates.extend_from_slice(&u.to_bytes());
    }
    send.write_all(&updates).await.unwrap();
    for _ in 0..3 {
        match within(10, reader.next()).await.unwrap() {
            Message::RequestOk(_) => {}
            other => panic!("REQUEST_OK expected: {other:?}"),
        }
    }
    assert!(m.requests_delayed.load(Relaxed) >= 1);
    // After the Retry Interval (of the last refusal, plus the updates'
    // tokens) a new request is served.
    tokio::time::sleep(Duration::from_millis(retry)).await;
    let served = within(10, async {
        loop {
            let (mut send, recv) = session.open_bi().await.unwrap();
            let id = ids.next().unwrap();
            send.write_all(&request(2, id).to_bytes()).await.unwrap();
            match MessageReader::new(recv, &[]).next().await.unwrap() {
                Message::RequestError(e) if e.code == request_error::EXCESSIVE_LOAD => {
                    tokio::time::sleep(Duration::from_millis(e.retry_interval)).await;
                }
                other => return other,
            }
        }
    })
    .await;
    assert!(
        matches!(&served, Message::RequestError(e) if e.code == request_error::DOES_NOT_EXIST),
        "{served:?}"
    );
    assert!(session.close_reason().is_none(), "the session stays up");
    let text = m.render();
    assert!(
        text.contains(&format!(
            "quichub_requests_rate_limited_total{{action=\"refused\"}} {}\n",
            m.requests_refused_rate.load(Relaxed)
        )),
        "{text}"
    );
}
