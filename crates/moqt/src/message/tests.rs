//! Control message tests: a round trip for every message, byte vectors written
//! from the draft's field layouts (and from moq-net's draft-18 encoder and test
//! vectors), negative cases, and proptest round trips.

use super::*;
use crate::deviation::Deviations;
use crate::error::request_error;
use crate::params::{kind, GroupOrder, SubscriptionFilter};

use proptest::collection::vec;
use proptest::prelude::*;

/// Parses hex with optional spaces: `"af 00 00 08"`.
fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Frames a payload: vi64 type, 16-bit length, payload.
fn frame(t: u64, payload: &[u8]) -> Bytes {
    let mut b = Vec::new();
    put_vi64(&mut b, t);
    b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    b.extend_from_slice(payload);
    Bytes::from(b)
}

fn decode(b: &[u8]) -> Result<Message, DecodeError> {
    let src = Bytes::copy_from_slice(b);
    let (m, used) = Message::decode_bytes(&src)?;
    assert_eq!(used, src.len(), "trailing bytes after the frame");
    Ok(m)
}

/// Encodes, checks the frame header, decodes, and compares.
fn roundtrip(m: Message) -> Bytes {
    let b = m.to_bytes();
    let mut s = &b[..];
    assert_eq!(get_vi64(&mut s).unwrap(), m.type_id());
    let len = get_u16(&mut s).unwrap() as usize;
    assert_eq!(
        len,
        s.len(),
        "{}: Length must equal the payload size",
        m.name()
    );
    let (d, used) = Message::decode_bytes(&b).unwrap();
    assert_eq!(used, b.len());
    assert_eq!(d, m);
    // Decoding must not depend on the buffer being exactly one frame.
    let mut two = BytesMut::new();
    m.encode(&mut two);
    m.encode(&mut two);
    let two = two.freeze();
    let mut s = &two[..];
    assert_eq!(Message::decode(&mut s, &two).unwrap(), m);
    assert_eq!(Message::decode(&mut s, &two).unwrap(), m);
    assert!(s.is_empty());
    b
}

fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

fn all_subscribe_params() -> Parameters {
    Parameters {
        object_delivery_timeout: Some(100),
        authorization_tokens: vec![
            Bytes::from_static(b"\x03\x00tok"),
            Bytes::from_static(b"\x01\x05\x00jwt"),
        ],
        rendezvous_timeout: Some(5000),
        subgroup_delivery_timeout: Some(2000),
        forward: Some(false),
        subscriber_priority: Some(7),
        subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
            start: Location::new(5, 1),
            end_group_delta: 3,
        }),
        group_order: Some(GroupOrder::Descending),
        new_group_request: Some(0),
        ..Default::default()
    }
}

fn properties() -> Vec<KeyValue> {
    vec![
        KeyValue::int(0x04, 2_186_796_243),
        KeyValue::bytes(0x0b, Bytes::from_static(b"\x00\x01")),
        KeyValue::int(0x0e, 64),
        KeyValue::int(0x22, 2),
        KeyValue::bytes(0x3f, Bytes::new()),
        KeyValue::int(0x4000, 1),
        KeyValue::bytes(0x1_0001, b("unknown but kept")),
    ]
}

// ---------------------------------------------------------------------------
// Round trips of every message.
// ---------------------------------------------------------------------------

#[test]
fn setup_roundtrip() {
    roundtrip(Message::Setup(Setup::default()));
    let s = Setup {
        options: vec![
            KeyValue::bytes(setup_option::PATH, b("/moq?x=1")),
            KeyValue::bytes(
                setup_option::AUTHORIZATION_TOKEN,
                Bytes::from_static(b"\x03\x00t"),
            ),
            KeyValue::int(setup_option::MAX_AUTH_TOKEN_CACHE_SIZE, 4096),
            KeyValue::bytes(setup_option::AUTHORITY, b("relay.example:4443")),
            KeyValue::bytes(setup_option::MOQT_IMPLEMENTATION, b("quichub/0.1")),
            // Unknown options are kept, including duplicates of unknown types.
            KeyValue::int(0x3e, 9),
            KeyValue::bytes(0x3f, b("a")),
            KeyValue::bytes(0x3f, b("b")),
            KeyValue::int(0x2F00, u64::MAX),
            KeyValue::bytes(0x1234_5679, Bytes::new()),
        ],
    };
    roundtrip(Message::Setup(s.clone()));
    assert_eq!(s.path().unwrap(), "/moq?x=1");
    assert_eq!(s.authority().unwrap(), "relay.example:4443");
    assert_eq!(s.implementation().unwrap(), "quichub/0.1");
}

#[test]
fn goaway_roundtrip() {
    roundtrip(Message::GoAway(GoAway::default()));
    roundtrip(Message::GoAway(GoAway {
        new_session_uri: b("moqt://other.example/relay"),
        timeout: 30_000,
        request_id: Some(6),
    }));
    // On a request stream GOAWAY has no Request ID.
    roundtrip(Message::GoAway(GoAway {
        new_session_uri: Bytes::new(),
        timeout: 0,
        request_id: None,
    }));
    roundtrip(Message::GoAway(GoAway {
        new_session_uri: Bytes::from(vec![b'u'; MAX_URI]),
        timeout: u64::MAX,
        request_id: Some(u64::MAX),
    }));
}

#[test]
fn subscribe_roundtrip() {
    roundtrip(Message::Subscribe(Subscribe {
        request_id: 4,
        track: FullTrackName::new("moq-test/interop", "test-track"),
        params: Parameters {
            subscription_filter: Some(SubscriptionFilter::LargestObject),
            subscriber_priority: Some(1),
            ..Default::default()
        },
    }));
    roundtrip(Message::Subscribe(Subscribe {
        request_id: 0,
        track: FullTrackName::default(),
        params: Parameters::default(),
    }));
    roundtrip(Message::Subscribe(Subscribe {
        request_id: 1_000_000,
        track: FullTrackName::new("a/b/c", ""),
        params: all_subscribe_params(),
    }));
    for f in [
        SubscriptionFilter::NextGroupStart,
        SubscriptionFilter::LargestObject,
        SubscriptionFilter::AbsoluteStart(Location::new(0, 0)),
        SubscriptionFilter::AbsoluteStart(Location::new(u64::MAX, u64::MAX)),
        SubscriptionFilter::AbsoluteRange {
            start: Location::new(u64::MAX - 1, 0),
            end_group_delta: 1,
        },
    ] {
        roundtrip(Message::Subscribe(Subscribe {
            request_id: 2,
            track: FullTrackName::new("ns", "t"),
            params: Parameters {
                subscription_filter: Some(f),
                ..Default::default()
            },
        }));
    }
}

#[test]
fn subscribe_ok_roundtrip() {
    roundtrip(Message::SubscribeOk(SubscribeOk::default()));
    roundtrip(Message::SubscribeOk(SubscribeOk {
        track_alias: 0xdead_beef,
        params: Parameters {
            expires: Some(60_000),
            largest_object: Some(Location::new(427, 12)),
            ..Default::default()
        },
        properties: properties(),
    }));
}

#[test]
fn publish_roundtrip() {
    roundtrip(Message::Publish(Publish {
        request_id: 3,
        track: FullTrackName::new("live/alice", "video"),
        track_alias: 9,
        params: Parameters {
            authorization_tokens: vec![Bytes::from_static(b"\x03\x00x")],
            expires: Some(0),
            largest_object: Some(Location::new(9, 0)),
            forward: Some(true),
            ..Default::default()
        },
        properties: properties(),
    }));
    roundtrip(Message::Publish(Publish::default()));
}

#[test]
fn publish_ok_roundtrip() {
    roundtrip(Message::PublishOk(RequestOk::default()));
    roundtrip(Message::PublishOk(RequestOk {
        params: Parameters {
            object_delivery_timeout: Some(1),
            subgroup_delivery_timeout: Some(2),
            expires: Some(3),
            forward: Some(false),
            subscriber_priority: Some(255),
            subscription_filter: Some(SubscriptionFilter::NextGroupStart),
            group_order: Some(GroupOrder::Ascending),
            new_group_request: Some(17),
            ..Default::default()
        },
        properties: Vec::new(),
    }));
}

#[test]
fn publish_ok_never_sends_properties() {
    // PUBLISH_OK's Track Properties are always empty (§10.5): the encoder omits
    // them and the decoder refuses them.
    let m = Message::PublishOk(RequestOk {
        params: Parameters::default(),
        properties: properties(),
    });
    assert_eq!(&m.to_bytes()[..], &hex("1e 00 01 00")[..]);
    assert!(matches!(
        decode(&hex("1e 00 03 00 0e 05")),
        Err(DecodeError::Invalid(_))
    ));
    // The same bytes as REQUEST_OK (TRACK_STATUS_OK may carry properties) decode.
    assert_eq!(
        decode(&hex("07 00 03 00 0e 05")).unwrap(),
        Message::RequestOk(RequestOk {
            params: Parameters::default(),
            properties: vec![KeyValue::int(0x0e, 5)],
        })
    );
}

#[test]
fn publish_done_roundtrip() {
    roundtrip(Message::PublishDone(PublishDone::default()));
    roundtrip(Message::PublishDone(PublishDone {
        status: crate::error::publish_done::TRACK_ENDED,
        stream_count: (1 << 62) - 1,
        reason: Bytes::from(vec![b'r'; MAX_REASON]),
    }));
}

#[test]
fn fetch_roundtrip_all_kinds() {
    let params = Parameters {
        authorization_tokens: vec![Bytes::from_static(b"\x02\x07")],
        fill_timeout: Some(0),
        subscriber_priority: Some(64),
        group_order: Some(GroupOrder::Descending),
        ..Default::default()
    };
    roundtrip(Message::Fetch(Fetch {
        request_id: 8,
        kind: FetchKind::Standalone {
            track: FullTrackName::new("broadcast", "video"),
            start: Location::new(1, 0),
            end: Location::new(2, 0),
        },
        params: params.clone(),
    }));
    roundtrip(Message::Fetch(Fetch {
        request_id: 10,
        kind: FetchKind::RelativeJoining {
            joining_request_id: 4,
            joining_start: 2,
        },
        params: Parameters::default(),
    }));
    roundtrip(Message::Fetch(Fetch {
        request_id: 12,
        kind: FetchKind::AbsoluteJoining {
            joining_request_id: 4,
            joining_start: 100,
        },
        params,
    }));
    roundtrip(Message::Fetch(Fetch::default()));
}

#[test]
fn fetch_ok_roundtrip() {
    roundtrip(Message::FetchOk(FetchOk::default()));
    roundtrip(Message::FetchOk(FetchOk {
        end_of_track: true,
        end_location: Location::new(10, 6),
        params: Parameters::default(),
        properties: properties(),
    }));
}

#[test]
fn track_status_roundtrip() {
    roundtrip(Message::TrackStatus(Subscribe {
        request_id: 14,
        track: FullTrackName::new("ns", "t"),
        params: Parameters {
            authorization_tokens: vec![Bytes::from_static(b"\x03\x00a"); 2],
            rendezvous_timeout: Some(10),
            ..Default::default()
        },
    }));
}

#[test]
fn namespace_requests_roundtrip() {
    let auth = Parameters {
        authorization_tokens: vec![Bytes::from_static(b"\x03\x00a")],
        ..Default::default()
    };
    roundtrip(Message::PublishNamespace(NamespaceRequest {
        request_id: 2,
        namespace: TrackNamespace::from_path("example.com/meeting=123"),
        params: auth.clone(),
    }));
    // A prefix may have zero fields.
    roundtrip(Message::SubscribeNamespace(NamespaceRequest {
        request_id: 4,
        namespace: TrackNamespace::default(),
        params: auth.clone(),
    }));
    roundtrip(Message::SubscribeTracks(NamespaceRequest {
        request_id: 6,
        namespace: TrackNamespace::from_path("example.com"),
        params: Parameters {
            forward: Some(false),
            ..auth
        },
    }));
}

#[test]
fn namespace_and_done_roundtrip() {
    roundtrip(Message::Namespace(TrackNamespace::from_path(
        "participant=100",
    )));
    roundtrip(Message::Namespace(TrackNamespace::default()));
    roundtrip(Message::NamespaceDone(TrackNamespace::from_strs(&[
        "a", "b\0c",
    ])));
    let max = TrackNamespace((0..32).map(|i| Bytes::from(vec![i as u8 + 1; 3])).collect());
    roundtrip(Message::NamespaceDone(max));
}

#[test]
fn publish_blocked_roundtrip() {
    roundtrip(Message::PublishBlocked(PublishBlocked {
        suffix: TrackNamespace::from_path("alice"),
        name: b("audio"),
    }));
    roundtrip(Message::PublishBlocked(PublishBlocked::default()));
}

#[test]
fn request_update_roundtrip() {
    roundtrip(Message::RequestUpdate(RequestUpdate {
        request_id: 16,
        params: Parameters {
            object_delivery_timeout: Some(5),
            authorization_tokens: vec![Bytes::from_static(b"\x00\x01")],
            subgroup_delivery_timeout: Some(6),
            forward: Some(true),
            subscriber_priority: Some(0),
            subscription_filter: Some(SubscriptionFilter::AbsoluteStart(Location::new(3, 4))),
            new_group_request: Some(0),
            track_namespace_prefix: Some(TrackNamespace::from_path("x/y")),
            ..Default::default()
        },
    }));
    roundtrip(Message::RequestUpdate(RequestUpdate::default()));
}

#[test]
fn request_ok_roundtrip() {
    roundtrip(Message::RequestOk(RequestOk::default()));
    roundtrip(Message::RequestOk(RequestOk {
        params: Parameters {
            expires: Some(1000),
            largest_object: Some(Location::new(1, 2)),
            ..Default::default()
        },
        properties: properties(),
    }));
}

#[test]
fn request_error_roundtrip() {
    roundtrip(Message::RequestError(RequestError {
        code: request_error::DOES_NOT_EXIST,
        retry_interval: 0,
        reason: b("no such track"),
        redirect: None,
    }));
    roundtrip(Message::RequestError(RequestError {
        code: request_error::REDIRECT,
        retry_interval: 1001,
        reason: Bytes::new(),
        redirect: Some(Redirect {
            connect_uri: b("moqt://elsewhere.example"),
            track: FullTrackName::new("other", "video"),
        }),
    }));
    // Both empty: "same track as the original request".
    roundtrip(Message::RequestError(RequestError {
        code: request_error::REDIRECT,
        retry_interval: 1,
        reason: b("moved"),
        redirect: Some(Redirect::default()),
    }));
}

#[test]
fn every_type_code_is_distinct_and_named() {
    let all = sample_messages();
    let mut codes: Vec<u64> = all.iter().map(|m| m.type_id()).collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), 19);
    for m in &all {
        assert!(!m.name().is_empty());
        roundtrip(m.clone());
    }
    let first: Vec<&str> = all
        .iter()
        .filter(|m| m.opens_request_stream())
        .map(|m| m.name())
        .collect();
    assert_eq!(
        first,
        [
            "SUBSCRIBE",
            "PUBLISH",
            "FETCH",
            "TRACK_STATUS",
            "PUBLISH_NAMESPACE",
            "SUBSCRIBE_NAMESPACE",
            "SUBSCRIBE_TRACKS"
        ]
    );
}

/// One instance of each of the 19 messages.
fn sample_messages() -> Vec<Message> {
    let ns = NamespaceRequest::default();
    vec![
        Message::Setup(Setup::default()),
        Message::GoAway(GoAway::default()),
        Message::Subscribe(Subscribe::default()),
        Message::SubscribeOk(SubscribeOk::default()),
        Message::Publish(Publish::default()),
        Message::PublishOk(RequestOk::default()),
        Message::PublishDone(PublishDone::default()),
        Message::Fetch(Fetch::default()),
        Message::FetchOk(FetchOk::default()),
        Message::TrackStatus(Subscribe::default()),
        Message::PublishNamespace(ns.clone()),
        Message::SubscribeNamespace(ns.clone()),
        Message::SubscribeTracks(ns),
        Message::Namespace(TrackNamespace::default()),
        Message::NamespaceDone(TrackNamespace::default()),
        Message::PublishBlocked(PublishBlocked::default()),
        Message::RequestUpdate(RequestUpdate::default()),
        Message::RequestOk(RequestOk::default()),
        Message::RequestError(RequestError::default()),
    ]
}

// ---------------------------------------------------------------------------
// Byte vectors written by hand from the draft's field layouts.
// ---------------------------------------------------------------------------

#[test]
fn vector_setup() {
    // SETUP: Type 0x2F00 (vi64 0xaf00), Length 8, PATH (1) "/x", then
    // MOQT_IMPLEMENTATION (delta 6) "qh". The type is written once: it is both the
    // unidirectional stream type and the message type (§3.3, §10.3), exactly as
    // moq-net's `setup::Setup` encodes it.
    let bytes = hex("af00 0008 01 02 2f78 06 02 7168");
    let m = Message::Setup(Setup {
        options: vec![
            KeyValue::bytes(setup_option::PATH, b("/x")),
            KeyValue::bytes(setup_option::MOQT_IMPLEMENTATION, b("qh")),
        ],
    });
    assert_eq!(&m.to_bytes()[..], &bytes[..]);
    assert_eq!(decode(&bytes).unwrap(), m);
    assert_eq!(
        crate::data::StreamType::peek(&bytes).unwrap(),
        (crate::data::StreamType::Control, 2)
    );
}

#[test]
fn vector_setup_non_minimal_and_unknown() {
    // Non-minimal vi64 encodings are valid anywhere (§1.4.1): type 0x2F00 as three
    // bytes, option type 7 as two, and an unknown even option 0x40 (delta 0x39).
    let bytes = hex("c02f00 0007 8007 01 71 39 8001");
    assert_eq!(
        decode(&bytes).unwrap(),
        Message::Setup(Setup {
            options: vec![KeyValue::bytes(7, b("q")), KeyValue::int(0x40, 1),],
        })
    );
}

#[test]
fn vector_subscribe() {
    // SUBSCRIBE: Request ID 4, namespace ("ns"), name "t", 2 parameters:
    // SUBSCRIBER_PRIORITY (0x20, uint8) = 1, SUBSCRIPTION_FILTER (delta 1,
    // length-prefixed) = Largest Object (0x2).
    let bytes = hex("03 000d 04 01 02 6e73 01 74 02 20 01 01 01 02");
    let m = Message::Subscribe(Subscribe {
        request_id: 4,
        track: FullTrackName::new("ns", "t"),
        params: Parameters {
            subscriber_priority: Some(1),
            subscription_filter: Some(SubscriptionFilter::LargestObject),
            ..Default::default()
        },
    });
    assert_eq!(&m.to_bytes()[..], &bytes[..]);
    assert_eq!(decode(&bytes).unwrap(), m);
}

#[test]
fn vector_subscribe_absolute_range_filter() {
    // SUBSCRIPTION_FILTER is length-prefixed: 0x21, Length 4, type 4, {300, 0},
    // end group delta 2. 300 is a 2-byte vi64 (0x812c).
    let bytes = hex("03 000b 00 00 00 01 21 05 04 812c 00 02");
    assert_eq!(
        decode(&bytes).unwrap(),
        Message::Subscribe(Subscribe {
            request_id: 0,
            track: FullTrackName::default(),
            params: Parameters {
                subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
                    start: Location::new(300, 0),
                    end_group_delta: 2,
                }),
                ..Default::default()
            },
        })
    );
    // A filter whose length disagrees with its body is rejected.
    assert!(decode(&hex("03 000a 00 00 00 01 21 04 04 812c 00 02")).is_err());
    assert!(decode(&hex("03 000c 00 00 00 01 21 06 04 812c 00 02 00")).is_err());
}

#[test]
fn vector_moqnet_subscribe_draft18() {
    // What moq-net 0.3.18's `Subscribe::encode_msg` writes for draft-18: FORWARD=1,
    // SUBSCRIBER_PRIORITY=128 (a raw byte, not a vi64), SUBSCRIPTION_FILTER=Largest
    // Object (tag form, length-prefixed), GROUP_ORDER=Descending (raw byte).
    let payload = hex("01 01 04 6c697665 05 766964656f 04 10 01 10 80 01 01 02 01 02");
    assert_eq!(
        decode(&frame(ty::SUBSCRIBE, &payload)).unwrap(),
        Message::Subscribe(Subscribe {
            request_id: 1,
            track: FullTrackName::new("live", "video"),
            params: Parameters {
                forward: Some(true),
                subscriber_priority: Some(128),
                subscription_filter: Some(SubscriptionFilter::LargestObject),
                group_order: Some(GroupOrder::Descending),
                ..Default::default()
            },
        })
    );
    // moq-net's `subscribe_accepts_a_token_on_every_draft`: one AUTHORIZATION
    // TOKEN, length 3, USE_VALUE / type 0 / 0xAA.
    let payload = hex("01 01 04 6c697665 05 766964656f 01 03 03 03 00 aa");
    let Message::Subscribe(s) = decode(&frame(ty::SUBSCRIBE, &payload)).unwrap() else {
        panic!()
    };
    assert_eq!(
        s.params.authorization_tokens,
        [Bytes::from_static(&[3, 0, 0xaa])]
    );
}

#[test]
fn vector_moqnet_subscribe_ok_draft18() {
    // moq-net `test_subscribe_ok_largest_object_wire_vectors` (draft-18): alias 42,
    // one parameter, LARGEST_OBJECT as two bare vi64s {9, 3}.
    assert_eq!(
        decode(&frame(ty::SUBSCRIBE_OK, &hex("2a 01 09 09 03"))).unwrap(),
        Message::SubscribeOk(SubscribeOk {
            track_alias: 42,
            params: Parameters {
                largest_object: Some(Location::new(9, 3)),
                ..Default::default()
            },
            properties: vec![],
        })
    );
    // `test_subscribe_ok_largest_object_multibyte_group_draft18`: group 427.
    let Message::SubscribeOk(ok) =
        decode(&frame(ty::SUBSCRIBE_OK, &hex("04 01 09 81ab 00"))).unwrap()
    else {
        panic!()
    };
    assert_eq!(ok.params.largest_object, Some(Location::new(427, 0)));
    // `test_param_location_wire_vectors` (draft-18): {255, 128}.
    let Message::SubscribeOk(ok) =
        decode(&frame(ty::SUBSCRIBE_OK, &hex("00 01 09 80ff 8080"))).unwrap()
    else {
        panic!()
    };
    assert_eq!(ok.params.largest_object, Some(Location::new(255, 128)));
    // `test_subscribe_ok_v18_group_order_is_a_property`: DEFAULT_PUBLISHER_GROUP_ORDER
    // (0x22) as a Track Property after zero parameters.
    let m = Message::SubscribeOk(SubscribeOk {
        track_alias: 42,
        params: Parameters::default(),
        properties: vec![KeyValue::int(0x22, 2)],
    });
    assert_eq!(&m.to_bytes()[3..], &hex("2a 00 22 02")[..]);
    // GROUP_ORDER as a SUBSCRIBE_OK *parameter* is not allowed in draft-18;
    // moq-net 0.1 sends it, so it is read and dropped, and said so
    // (`moq_net_0_1_subscribe_ok_with_group_order`).
    let (m, d) = decode_noted(&frame(ty::SUBSCRIBE_OK, &hex("2a 01 22 02"))).unwrap();
    assert_eq!(
        m,
        Message::SubscribeOk(SubscribeOk {
            track_alias: 42,
            ..Default::default()
        })
    );
    assert!(!d.is_empty());
}

#[test]
fn vector_fetch_ok_matches_moqnet() {
    // moq-net `test_fetch_ok_v18_omits_group_order`: End Of Track 0, End {5, 3},
    // zero parameters, no properties.
    let bytes = hex("18 0004 00 05 03 00");
    let m = Message::FetchOk(FetchOk {
        end_of_track: false,
        end_location: Location::new(5, 3),
        params: Parameters::default(),
        properties: vec![],
    });
    assert_eq!(&m.to_bytes()[..], &bytes[..]);
    assert_eq!(decode(&bytes).unwrap(), m);
    // End Of Track is an 8-bit 0/1.
    assert!(decode(&hex("18 0004 02 05 03 00")).is_err());
}

#[test]
fn vector_fetch_joining() {
    // FETCH: Request ID 1, Fetch Type 2 (relative joining), Joining Request ID 3,
    // Joining Start 0, one parameter FILL_TIMEOUT (0x0A) = 32. The same bytes as
    // moq-net's `test_fetch_parameters_follow_their_draft` draft-18 case.
    let bytes = hex("16 0007 01 02 03 00 01 0a 20");
    let m = Message::Fetch(Fetch {
        request_id: 1,
        kind: FetchKind::RelativeJoining {
            joining_request_id: 3,
            joining_start: 0,
        },
        params: Parameters {
            fill_timeout: Some(32),
            ..Default::default()
        },
    });
    assert_eq!(&m.to_bytes()[..], &bytes[..]);
    assert_eq!(decode(&bytes).unwrap(), m);
    // Range filters (0x25) are draft-19: unknown here.
    assert_eq!(
        decode(&hex("16 0007 01 02 03 00 01 25 00")),
        Err(DecodeError::UnknownParameter(0x25))
    );
    // Fetch Type 4 does not exist.
    assert!(matches!(
        decode(&hex("16 0004 01 04 03 00")),
        Err(DecodeError::Invalid(_))
    ));
}

#[test]
fn vector_goaway() {
    // Control-stream GOAWAY with Request ID: exactly what moq-net writes for
    // draft-18 (empty URI, timeout, Request ID 0).
    let m = Message::GoAway(GoAway {
        new_session_uri: Bytes::new(),
        timeout: 0,
        request_id: Some(0),
    });
    assert_eq!(&m.to_bytes()[..], &hex("10 0003 00 00 00")[..]);
    // Request-stream GOAWAY: no Request ID.
    assert_eq!(
        decode(&hex("10 0004 01 2f 8bb8")).unwrap(),
        Message::GoAway(GoAway {
            new_session_uri: b("/"),
            timeout: 3000,
            request_id: None,
        })
    );
    // Two trailing vi64s is one too many.
    assert_eq!(
        decode(&hex("10 0004 00 00 00 00")),
        Err(DecodeError::LengthMismatch)
    );
}

#[test]
fn vector_request_error() {
    // Without REDIRECT: code, retry interval, reason phrase.
    let bytes = hex("05 0005 10 00 02 6e6f");
    assert_eq!(
        decode(&bytes).unwrap(),
        Message::RequestError(RequestError {
            code: request_error::DOES_NOT_EXIST,
            retry_interval: 0,
            reason: b("no"),
            redirect: None,
        })
    );
    // REDIRECT (0x34): empty reason, then the Redirect structure: empty Connect
    // URI, namespace ("a"), name "b".
    let bytes = hex("05 0009 34 00 00 00 01 01 61 01 62");
    let m = Message::RequestError(RequestError {
        code: request_error::REDIRECT,
        retry_interval: 0,
        reason: Bytes::new(),
        redirect: Some(Redirect {
            connect_uri: Bytes::new(),
            track: FullTrackName::new("a", "b"),
        }),
    });
    assert_eq!(&m.to_bytes()[..], &bytes[..]);
    assert_eq!(decode(&bytes).unwrap(), m);
    // A REDIRECT without its structure is short (length mismatch), and a Redirect
    // after another code is trailing garbage.
    assert_eq!(
        decode(&hex("05 0003 34 00 00")),
        Err(DecodeError::LengthMismatch)
    );
    assert_eq!(
        decode(&hex("05 0009 10 00 00 00 01 01 61 01 62")),
        Err(DecodeError::LengthMismatch)
    );
}

#[test]
fn vector_publish_with_properties() {
    // PUBLISH: Request ID 1, ("ns"), "t", alias 5, 2 parameters: LARGEST_OBJECT
    // (0x09, Location {2,3}), FORWARD (delta 7, uint8 0); Track Properties: type
    // 0x0e = 64, type 0x0f (delta 1) bytes "x".
    let payload = hex("01 01 02 6e73 01 74 05 02 09 02 03 07 00 0e 40 01 01 78");
    let m = Message::Publish(Publish {
        request_id: 1,
        track: FullTrackName::new("ns", "t"),
        track_alias: 5,
        params: Parameters {
            largest_object: Some(Location::new(2, 3)),
            forward: Some(false),
            ..Default::default()
        },
        properties: vec![KeyValue::int(0x0e, 64), KeyValue::bytes(0x0f, b("x"))],
    });
    assert_eq!(&m.to_bytes()[..], &frame(ty::PUBLISH, &payload)[..]);
    assert_eq!(decode(&frame(ty::PUBLISH, &payload)).unwrap(), m);
}

#[test]
fn vector_namespace_messages() {
    assert_eq!(
        decode(&hex("08 0004 01 02 6162")).unwrap(),
        Message::Namespace(TrackNamespace::from_strs(&["ab"]))
    );
    assert_eq!(
        decode(&hex("0e 0001 00")).unwrap(),
        Message::NamespaceDone(TrackNamespace::default())
    );
    assert_eq!(
        decode(&hex("0f 0005 01 01 61 01 62")).unwrap(),
        Message::PublishBlocked(PublishBlocked {
            suffix: TrackNamespace::from_strs(&["a"]),
            name: b("b"),
        })
    );
    // SUBSCRIBE_TRACKS with FORWARD (0x10) = 0.
    assert_eq!(
        decode(&hex("51 0005 02 00 01 10 00")).unwrap(),
        Message::SubscribeTracks(NamespaceRequest {
            request_id: 2,
            namespace: TrackNamespace::default(),
            params: Parameters {
                forward: Some(false),
                ..Default::default()
            },
        })
    );
}

#[test]
fn vector_request_update_prefix() {
    // REQUEST_UPDATE: Request ID 2, TRACK_NAMESPACE_PREFIX (0x34) = ("x").
    let bytes = hex("02 0006 02 01 34 01 01 78");
    assert_eq!(
        decode(&bytes).unwrap(),
        Message::RequestUpdate(RequestUpdate {
            request_id: 2,
            params: Parameters {
                track_namespace_prefix: Some(TrackNamespace::from_strs(&["x"])),
                ..Default::default()
            },
        })
    );
}

// ---------------------------------------------------------------------------
// Negative cases.
// ---------------------------------------------------------------------------

#[test]
fn length_mismatch() {
    let good = Message::Subscribe(Subscribe {
        request_id: 4,
        track: FullTrackName::new("ns", "t"),
        params: Parameters::default(),
    })
    .to_bytes();
    // Length one too large: the extra byte is trailing garbage inside the frame.
    let mut long = good.to_vec();
    long[2] += 1;
    long.push(0);
    assert_eq!(decode(&long), Err(DecodeError::LengthMismatch));
    // Length one too small: the payload runs out.
    let mut short = good.to_vec();
    short[2] -= 1;
    short.pop();
    assert_eq!(decode(&short), Err(DecodeError::LengthMismatch));
    // Empty payloads of messages that need fields.
    for t in [
        ty::GOAWAY,
        ty::SUBSCRIBE,
        ty::SUBSCRIBE_OK,
        ty::PUBLISH,
        ty::PUBLISH_OK,
        ty::PUBLISH_DONE,
        ty::FETCH,
        ty::FETCH_OK,
        ty::TRACK_STATUS,
        ty::PUBLISH_NAMESPACE,
        ty::SUBSCRIBE_NAMESPACE,
        ty::SUBSCRIBE_TRACKS,
        ty::NAMESPACE,
        ty::NAMESPACE_DONE,
        ty::PUBLISH_BLOCKED,
        ty::REQUEST_UPDATE,
        ty::REQUEST_OK,
        ty::REQUEST_ERROR,
    ] {
        assert_eq!(
            decode(&frame(t, &[])),
            Err(DecodeError::LengthMismatch),
            "{t:#x}"
        );
    }
    // An empty SETUP is fine: no options.
    assert_eq!(
        decode(&frame(ty::SETUP, &[])).unwrap(),
        Message::Setup(Setup::default())
    );
}

#[test]
fn incomplete_frames_are_short() {
    let full = Message::Publish(Publish {
        request_id: 1,
        track: FullTrackName::new("a/b", "c"),
        track_alias: 2,
        params: Parameters::default(),
        properties: properties(),
    })
    .to_bytes();
    for n in 0..full.len() {
        let src = full.slice(..n);
        let mut s = &src[..];
        assert_eq!(
            Message::decode(&mut s, &src),
            Err(DecodeError::Short),
            "{n}"
        );
        assert_eq!(s.len(), n, "Short must not consume");
    }
}

#[test]
fn unknown_message_types() {
    for t in [
        0x0,
        0x1,
        0x9,
        0xA,
        0x20,
        0x21,
        0x40,
        0x41,
        0x1F,
        0x52,
        0x2F01,
        u64::MAX,
    ] {
        assert_eq!(
            decode(&frame(t, &[0])),
            Err(DecodeError::UnknownMessage(t)),
            "{t:#x}"
        );
    }
}

#[test]
fn reason_phrase_limit() {
    let ok = |n: usize| {
        Message::PublishDone(PublishDone {
            status: 0,
            stream_count: 0,
            reason: Bytes::from(vec![b'x'; n]),
        })
    };
    roundtrip(ok(MAX_REASON));
    // 1025 bytes: PROTOCOL_VIOLATION, in PUBLISH_DONE and REQUEST_ERROR.
    assert_eq!(
        decode(&ok(MAX_REASON + 1).to_bytes()),
        Err(DecodeError::TooLong)
    );
    let e = Message::RequestError(RequestError {
        code: 0,
        retry_interval: 0,
        reason: Bytes::from(vec![b'x'; MAX_REASON + 1]),
        redirect: None,
    });
    assert_eq!(decode(&e.to_bytes()), Err(DecodeError::TooLong));
    assert_eq!(
        DecodeError::TooLong.session_code(),
        crate::SessionErrorCode::ProtocolViolation
    );
}

#[test]
fn goaway_uri_limit() {
    let m = Message::GoAway(GoAway {
        new_session_uri: Bytes::from(vec![b'u'; MAX_URI + 1]),
        timeout: 0,
        request_id: None,
    });
    assert_eq!(decode(&m.to_bytes()), Err(DecodeError::TooLong));
}

#[test]
fn namespace_field_limits() {
    let ns = |n: usize| TrackNamespace((0..n).map(|_| Bytes::from_static(b"f")).collect());
    roundtrip(Message::Namespace(ns(32)));
    // 33 fields: PROTOCOL_VIOLATION, wherever a namespace appears.
    for m in [
        Message::Namespace(ns(33)),
        Message::NamespaceDone(ns(33)),
        Message::SubscribeNamespace(NamespaceRequest {
            request_id: 0,
            namespace: ns(33),
            params: Parameters::default(),
        }),
        Message::Subscribe(Subscribe {
            request_id: 0,
            track: FullTrackName {
                namespace: ns(33),
                name: Bytes::new(),
            },
            params: Parameters::default(),
        }),
    ] {
        assert_eq!(
            decode(&m.to_bytes()),
            Err(DecodeError::TooLong),
            "{}",
            m.name()
        );
    }
    // An empty field is a PROTOCOL_VIOLATION.
    assert!(matches!(
        decode(&hex("08 0004 02 01 61 00")),
        Err(DecodeError::Invalid(_))
    ));
    // A Full Track Name over 4096 bytes.
    let big = Message::Subscribe(Subscribe {
        request_id: 0,
        track: FullTrackName {
            namespace: TrackNamespace(vec![Bytes::from(vec![b'n'; 2048]); 2]),
            name: b("t"),
        },
        params: Parameters::default(),
    });
    assert_eq!(decode(&big.to_bytes()), Err(DecodeError::TooLong));
    let at_limit = Message::Subscribe(Subscribe {
        request_id: 0,
        track: FullTrackName {
            namespace: TrackNamespace(vec![Bytes::from(vec![b'n'; 2048]); 2]),
            name: Bytes::new(),
        },
        params: Parameters::default(),
    });
    roundtrip(at_limit);
}

#[test]
fn disallowed_parameters() {
    // Each message with a parameter that is defined in draft-18 but not allowed
    // in it (PROTOCOL_VIOLATION, §10.2.1).
    let cases: Vec<(u64, Vec<u8>)> = vec![
        // SUBSCRIBE with FILL_TIMEOUT.
        (ty::SUBSCRIBE, hex("00 00 00 01 0a 05")),
        // SUBSCRIBE with LARGEST_OBJECT.
        (ty::SUBSCRIBE, hex("00 00 00 01 09 01 01")),
        // SUBSCRIBE_OK with FORWARD.
        (ty::SUBSCRIBE_OK, hex("00 01 10 01")),
        // PUBLISH with SUBSCRIBER_PRIORITY.
        (ty::PUBLISH, hex("00 00 00 00 01 20 01")),
        // PUBLISH_OK with LARGEST_OBJECT (it is REQUEST_UPDATE_OK/TRACK_STATUS_OK only).
        (ty::PUBLISH_OK, hex("01 09 01 01")),
        // REQUEST_UPDATE with EXPIRES (that belongs in REQUEST_UPDATE_OK).
        (ty::REQUEST_UPDATE, hex("00 01 08 05")),
        // REQUEST_UPDATE with GROUP_ORDER.
        (ty::REQUEST_UPDATE, hex("00 01 22 01")),
        // FETCH with FORWARD.
        (ty::FETCH, hex("00 02 00 00 01 10 01")),
        // FETCH_OK with any parameter.
        (ty::FETCH_OK, hex("00 00 00 01 22 01")),
        // TRACK_STATUS with SUBSCRIBER_PRIORITY.
        (ty::TRACK_STATUS, hex("00 00 00 01 20 01")),
        // PUBLISH_NAMESPACE with FORWARD.
        (ty::PUBLISH_NAMESPACE, hex("00 00 01 10 01")),
        // SUBSCRIBE_NAMESPACE with FORWARD (only SUBSCRIBE_TRACKS takes it).
        (ty::SUBSCRIBE_NAMESPACE, hex("00 00 01 10 01")),
        // SUBSCRIBE_TRACKS with TRACK_NAMESPACE_PREFIX.
        (ty::SUBSCRIBE_TRACKS, hex("00 00 01 34 00")),
    ];
    for (t, payload) in cases {
        let r = decode(&frame(t, &payload));
        assert!(
            matches!(
                r,
                Err(DecodeError::Invalid(
                    "parameter not allowed in this message"
                ))
            ),
            "{t:#x} {payload:02x?}: {r:?}"
        );
        assert_eq!(
            r.unwrap_err().session_code(),
            crate::SessionErrorCode::ProtocolViolation
        );
    }
}

#[test]
fn unknown_and_malformed_parameters() {
    // Unknown parameter types cannot be skipped: PROTOCOL_VIOLATION.
    for (t, payload, k) in [
        (ty::SUBSCRIBE, hex("00 00 00 01 0c 00"), 0x0c),
        (ty::SUBSCRIBE, hex("00 00 00 01 00 00"), 0x00),
        (ty::REQUEST_OK, hex("01 8123 00"), 0x123),
        (
            ty::FETCH,
            hex("00 02 00 00 01 ff ffffffffffffffff 00"),
            u64::MAX,
        ),
    ] {
        assert_eq!(
            decode(&frame(t, &payload)),
            Err(DecodeError::UnknownParameter(k))
        );
    }
    // Duplicate parameter (delta 0) other than AUTHORIZATION_TOKEN.
    assert!(matches!(
        decode(&frame(ty::SUBSCRIBE, &hex("00 00 00 02 20 01 00 02"))),
        Err(DecodeError::Invalid("duplicate parameter"))
    ));
    // Type overflow: 0x10 + (2^64 - 1).
    assert!(matches!(
        decode(&frame(
            ty::SUBSCRIBE,
            &hex("00 00 00 02 10 01 ff ffffffffffffffff 00")
        )),
        Err(DecodeError::Invalid(_))
    ));
    // Out-of-range uint8 values.
    for p in ["01 10 02", "01 22 00", "01 22 03"] {
        assert!(decode(&frame(ty::SUBSCRIBE, &[hex("00 00 00"), hex(p)].concat())).is_err());
    }
    // Unknown filter type, and an AbsoluteRange whose end group overflows.
    assert!(decode(&frame(ty::SUBSCRIBE, &hex("00 00 00 01 21 01 05"))).is_err());
    assert!(decode(&frame(
        ty::SUBSCRIBE,
        &hex("00 00 00 01 21 0c 04 ffffffffffffffffff 00 01")
    ))
    .is_err());
    // More than 64 parameters.
    assert_eq!(
        decode(&frame(ty::REQUEST_OK, &hex("41"))),
        Err(DecodeError::TooLong)
    );
}

#[test]
fn setup_option_errors() {
    // A value running past the end of the message: KEY_VALUE_FORMATTING_ERROR.
    let e = decode(&frame(ty::SETUP, &hex("01 05 2f"))).unwrap_err();
    assert_eq!(e, DecodeError::KeyValueFormat);
    assert_eq!(
        e.session_code(),
        crate::SessionErrorCode::KeyValueFormattingError
    );
    let e = decode(&frame(ty::SETUP, &hex("04"))).unwrap_err();
    assert_eq!(e, DecodeError::KeyValueFormat);
    // A byte value longer than 2^16-1: PROTOCOL_VIOLATION (§1.4.3).
    let e = decode(&frame(ty::SETUP, &hex("01 e0ffff00"))).unwrap_err();
    assert_eq!(e, DecodeError::TooLong);
    assert_eq!(e.session_code(), crate::SessionErrorCode::ProtocolViolation);
    // A delta type that overflows 2^64-1.
    assert!(decode(&frame(ty::SETUP, &hex("02 00 ff ffffffffffffffff 00"))).is_err());
}

#[test]
fn track_properties_errors() {
    // Track Properties run to the end of the message; a truncated one is a
    // KEY_VALUE_FORMATTING_ERROR.
    assert_eq!(
        decode(&frame(ty::SUBSCRIBE_OK, &hex("00 00 01 05 61"))),
        Err(DecodeError::KeyValueFormat)
    );
    assert_eq!(
        decode(&frame(ty::FETCH_OK, &hex("00 00 00 00 0e"))),
        Err(DecodeError::KeyValueFormat)
    );
}

#[test]
fn auth_token_limit() {
    let tok = |n: usize| {
        Message::Subscribe(Subscribe {
            request_id: 0,
            track: FullTrackName::default(),
            params: Parameters {
                authorization_tokens: vec![Bytes::from(vec![3u8; n])],
                ..Default::default()
            },
        })
    };
    roundtrip(tok(crate::params::MAX_TOKEN));
    assert_eq!(
        decode(&tok(crate::params::MAX_TOKEN + 1).to_bytes()),
        Err(DecodeError::TooLong)
    );
}

#[test]
#[should_panic(expected = "control message too large")]
fn encoder_refuses_oversized_messages() {
    let m = Message::Setup(Setup {
        options: vec![
            KeyValue::bytes(1, Bytes::from(vec![0; 40_000])),
            KeyValue::bytes(3, Bytes::from(vec![0; 40_000])),
        ],
    });
    let _ = m.to_bytes();
}

#[test]
fn request_ids_are_reported() {
    assert_eq!(
        Message::Fetch(Fetch {
            request_id: 7,
            ..Default::default()
        })
        .request_id(),
        Some(7)
    );
    assert_eq!(
        Message::RequestUpdate(RequestUpdate {
            request_id: 9,
            params: Parameters::default()
        })
        .request_id(),
        Some(9)
    );
    assert_eq!(Message::RequestOk(RequestOk::default()).request_id(), None);
    assert_eq!(
        Message::GoAway(GoAway {
            request_id: Some(3),
            ..Default::default()
        })
        .request_id(),
        None
    );
}

#[test]
fn decoded_fields_are_zero_copy() {
    let m = Message::PublishDone(PublishDone {
        status: 2,
        stream_count: 1,
        reason: b("zero copy reason"),
    });
    let src = m.to_bytes();
    let (d, _) = Message::decode_bytes(&src).unwrap();
    let Message::PublishDone(d) = d else { panic!() };
    let base = src.as_ptr() as usize;
    let p = d.reason.as_ptr() as usize;
    assert!(p >= base && p + d.reason.len() <= base + src.len());
}

// ---------------------------------------------------------------------------
// Proptest strategies and round trips.
// ---------------------------------------------------------------------------

/// Small values most of the time, any 64-bit value sometimes.
/// Decodes one whole frame, returning the deviations it needed.
fn decode_noted(b: &[u8]) -> Result<(Message, Deviations), DecodeError> {
    let src = Bytes::copy_from_slice(b);
    let mut s = &src[..];
    let r = Message::decode_noting(&mut s, &src)?;
    assert!(s.is_empty(), "trailing bytes after the frame");
    Ok(r)
}

#[test]
fn moq_net_0_1_subscribe_namespace_0x11() {
    use crate::deviation::Deviation;
    // moq-net 0.1.3 (moq-clock 0.10.21) at draft 18: type 0x11, Request ID
    // 0, an empty prefix, Subscribe Options 1 (NAMESPACE), no parameters
    // (`ietf::SubscribeNamespace::encode_msg`).
    let (m, d) = decode_noted(&frame(0x11, &hex("00 00 01 00"))).unwrap();
    assert_eq!(m, Message::SubscribeNamespace(NamespaceRequest::default()));
    assert_eq!(d, Deviation::SubscribeNamespace0x11.into());
    // A prefix, and a token, as draft 18 encodes parameters.
    let (m, _) =
        decode_noted(&frame(0x11, &hex("02 01 04 6c697665 01 01 03 03 03 00 aa"))).unwrap();
    let Message::SubscribeNamespace(n) = m else {
        panic!("{m:?}")
    };
    assert_eq!(n.request_id, 2);
    assert_eq!(n.namespace, TrackNamespace::from_path("live"));
    assert_eq!(n.params.authorization_tokens.len(), 1);
    // Options 0 (PUBLISH messages only) is SUBSCRIBE_TRACKS, FORWARD and all.
    let (m, _) = decode_noted(&frame(0x11, &hex("00 00 00 01 10 00"))).unwrap();
    let Message::SubscribeTracks(n) = m else {
        panic!("{m:?}")
    };
    assert_eq!(n.params.forward, Some(false));
    // Options 2 (both) has no one-stream form in draft 18; other values none.
    for o in ["02", "03"] {
        assert!(matches!(
            decode(&frame(0x11, &hex(&format!("00 00 {o} 00")))),
            Err(DecodeError::Invalid("subscribe options"))
        ));
    }
    // Parameters of another message are still refused.
    assert!(decode(&frame(0x11, &hex("00 00 01 01 10 01"))).is_err());
    // It is written as draft 18's SUBSCRIBE_NAMESPACE.
    assert_eq!(
        Message::SubscribeNamespace(NamespaceRequest::default()).to_bytes()[0],
        ty::SUBSCRIBE_NAMESPACE as u8
    );
}

#[test]
fn moq_net_0_1_subscribe_ok_with_group_order() {
    use crate::deviation::Deviation;
    // moq-net 0.1.3's SUBSCRIBE_OK at draft 18: alias 1, GROUP_ORDER
    // Descending (raw byte), no properties.
    let (m, d) = decode_noted(&frame(ty::SUBSCRIBE_OK, &hex("01 01 22 02"))).unwrap();
    assert_eq!(
        m,
        Message::SubscribeOk(SubscribeOk {
            track_alias: 1,
            ..Default::default()
        })
    );
    assert_eq!(d, Deviation::SubscribeOkGroupOrder.into());
    // Beside LARGEST_OBJECT, which stays.
    let (m, _) = decode_noted(&frame(ty::SUBSCRIBE_OK, &hex("01 02 09 05 00 19 01"))).unwrap();
    let Message::SubscribeOk(ok) = m else {
        panic!()
    };
    assert_eq!(ok.params.largest_object, Some(Location::new(5, 0)));
    assert_eq!(ok.params.group_order, None);
    // GROUP_ORDER stays refused where no peer sends it.
    assert!(decode(&frame(ty::FETCH_OK, &hex("00 00 00 01 22 01"))).is_err());
    assert!(decode(&frame(ty::PUBLISH, &hex("00 00 00 00 01 22 01"))).is_err());
}

#[test]
fn moq_watch_uint8_parameters_as_varints() {
    use crate::deviation::Deviation;
    // @moq/watch 0.4.6 (@moq/net 0.2.8) subscribing to `catalog.json` of
    // `live/demo`: FORWARD 1, SUBSCRIBER_PRIORITY 155 as the vi64 0x809b,
    // SUBSCRIPTION_FILTER Largest Object, GROUP_ORDER 2 (INTEROP.md).
    let b = hex("03 0024 00 02 04 6c697665 04 64656d6f 0c 636174616c6f672e6a736f6e 04 10 01 10 809b 01 01 02 01 02");
    let (m, d) = decode_noted(&b).unwrap();
    assert_eq!(
        m,
        Message::Subscribe(Subscribe {
            request_id: 0,
            track: FullTrackName::new("live/demo", "catalog.json"),
            params: Parameters {
                forward: Some(true),
                subscriber_priority: Some(155),
                subscription_filter: Some(SubscriptionFilter::LargestObject),
                group_order: Some(GroupOrder::Descending),
                ..Default::default()
            },
        })
    );
    assert_eq!(d, Deviation::Uint8ParametersAsVarints.into());
    // Re-encoded, it is draft 18 and needs nothing.
    let (again, d) = decode_noted(&m.to_bytes()).unwrap();
    assert_eq!(again, m);
    assert!(d.is_empty());
    // Only uint8 parameters: LARGEST_OBJECT stays two bare vi64s (a
    // length-prefixed one, as @moq/net writes it, is not read so).
    assert!(decode(&frame(ty::SUBSCRIBE_OK, &hex("07 01 09 02 05 03"))).is_err());
    // Values out of range are refused either way.
    for p in ["01 20 8200", "01 10 02", "01 22 00"] {
        assert!(
            decode(&frame(ty::SUBSCRIBE, &[hex("00 00 00"), hex(p)].concat())).is_err(),
            "{p}"
        );
    }
    // A message that decodes neither way keeps the draft-18 reading's error.
    // (Here the second reading fails on GROUP_ORDER 5.)
    assert_eq!(
        decode(&frame(ty::SUBSCRIBE, &hex("00 00 00 02 20 809b 02 05"))),
        Err(DecodeError::UnknownParameter(0x1b22))
    );
}

#[test]
fn conforming_messages_need_no_deviation() {
    for m in sample_messages() {
        let (again, d) = decode_noted(&m.to_bytes()).unwrap();
        assert_eq!(again, m);
        assert!(d.is_empty(), "{m:?}: {d:?}");
    }
}

fn vint() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..300, 1 => any::<u64>()]
}

fn bytes_s(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

fn namespace_s() -> impl Strategy<Value = TrackNamespace> {
    vec(vec(any::<u8>(), 1..8).prop_map(Bytes::from), 0..5).prop_map(TrackNamespace)
}

fn track_s() -> impl Strategy<Value = FullTrackName> {
    (namespace_s(), bytes_s(8)).prop_map(|(namespace, name)| FullTrackName { namespace, name })
}

fn location_s() -> impl Strategy<Value = Location> {
    (vint(), vint()).prop_map(|(g, o)| Location::new(g, o))
}

/// Key-Value-Pairs sorted by type (the encoder writes deltas), duplicates allowed.
pub(crate) fn kvps_s() -> impl Strategy<Value = Vec<KeyValue>> {
    vec(
        (prop_oneof![0u64..0x80, any::<u64>()], vint(), bytes_s(12)),
        0..6,
    )
    .prop_map(|mut v| {
        v.sort_by_key(|(k, _, _)| *k);
        v.into_iter()
            .map(|(k, i, b)| {
                if k % 2 == 0 {
                    KeyValue::int(k, i)
                } else {
                    KeyValue::bytes(k, b)
                }
            })
            .collect()
    })
}

fn filter_s() -> impl Strategy<Value = SubscriptionFilter> {
    prop_oneof![
        Just(SubscriptionFilter::NextGroupStart),
        Just(SubscriptionFilter::LargestObject),
        location_s().prop_map(SubscriptionFilter::AbsoluteStart),
        (location_s(), vint()).prop_map(|(start, d)| SubscriptionFilter::AbsoluteRange {
            start,
            end_group_delta: d.min(u64::MAX - start.group),
        }),
    ]
}

/// Any parameters, then only those `set` accepts.
fn params_s(set: Allowed) -> impl Strategy<Value = Parameters> {
    let a = (
        proptest::option::of(vint()),
        vec(bytes_s(8), 0..3),
        proptest::option::of(vint()),
        proptest::option::of(vint()),
        proptest::option::of(vint()),
        proptest::option::of(location_s()),
    );
    let b = (
        proptest::option::of(vint()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<u8>()),
        proptest::option::of(filter_s()),
        proptest::option::of(prop_oneof![
            Just(GroupOrder::Ascending),
            Just(GroupOrder::Descending)
        ]),
        proptest::option::of(vint()),
        proptest::option::of(namespace_s()),
    );
    (a, b).prop_map(
        move |((odt, tokens, rt, sdt, exp, lo), (ft, fw, sp, sf, go, ngr, tnp))| {
            let k = |kind: u64| set.contains(kind);
            Parameters {
                object_delivery_timeout: odt.filter(|_| k(kind::OBJECT_DELIVERY_TIMEOUT)),
                authorization_tokens: if k(kind::AUTHORIZATION_TOKEN) {
                    tokens
                } else {
                    vec![]
                },
                rendezvous_timeout: rt.filter(|_| k(kind::RENDEZVOUS_TIMEOUT)),
                subgroup_delivery_timeout: sdt.filter(|_| k(kind::SUBGROUP_DELIVERY_TIMEOUT)),
                expires: exp.filter(|_| k(kind::EXPIRES)),
                largest_object: lo.filter(|_| k(kind::LARGEST_OBJECT)),
                fill_timeout: ft.filter(|_| k(kind::FILL_TIMEOUT)),
                forward: fw.filter(|_| k(kind::FORWARD)),
                subscriber_priority: sp.filter(|_| k(kind::SUBSCRIBER_PRIORITY)),
                subscription_filter: sf.filter(|_| k(kind::SUBSCRIPTION_FILTER)),
                group_order: go.filter(|_| k(kind::GROUP_ORDER)),
                new_group_request: ngr.filter(|_| k(kind::NEW_GROUP_REQUEST)),
                track_namespace_prefix: tnp.filter(|_| k(kind::TRACK_NAMESPACE_PREFIX)),
            }
        },
    )
}

fn ns_request_s(set: Allowed) -> impl Strategy<Value = NamespaceRequest> {
    (vint(), namespace_s(), params_s(set)).prop_map(|(request_id, namespace, params)| {
        NamespaceRequest {
            request_id,
            namespace,
            params,
        }
    })
}

fn subscribe_s(set: Allowed) -> impl Strategy<Value = Subscribe> {
    (vint(), track_s(), params_s(set)).prop_map(|(request_id, track, params)| Subscribe {
        request_id,
        track,
        params,
    })
}

fn fetch_kind_s() -> impl Strategy<Value = FetchKind> {
    prop_oneof![
        (track_s(), location_s(), location_s())
            .prop_map(|(track, start, end)| FetchKind::Standalone { track, start, end }),
        (vint(), vint()).prop_map(|(joining_request_id, joining_start)| {
            FetchKind::RelativeJoining {
                joining_request_id,
                joining_start,
            }
        }),
        (vint(), vint()).prop_map(|(joining_request_id, joining_start)| {
            FetchKind::AbsoluteJoining {
                joining_request_id,
                joining_start,
            }
        }),
    ]
}

/// Every message type.
pub(crate) fn message_s() -> BoxedStrategy<Message> {
    prop_oneof![
        kvps_s().prop_map(|options| Message::Setup(Setup { options })),
        (bytes_s(16), vint(), proptest::option::of(vint())).prop_map(|(u, t, r)| {
            Message::GoAway(GoAway {
                new_session_uri: u,
                timeout: t,
                request_id: r,
            })
        }),
        subscribe_s(allowed::SUBSCRIBE).prop_map(Message::Subscribe),
        (vint(), params_s(allowed::SUBSCRIBE_OK), kvps_s()).prop_map(|(a, p, k)| {
            Message::SubscribeOk(SubscribeOk {
                track_alias: a,
                params: p,
                properties: k,
            })
        }),
        (
            vint(),
            track_s(),
            vint(),
            params_s(allowed::PUBLISH),
            kvps_s()
        )
            .prop_map(|(request_id, track, track_alias, params, properties)| {
                Message::Publish(Publish {
                    request_id,
                    track,
                    track_alias,
                    params,
                    properties,
                })
            }),
        params_s(allowed::PUBLISH_OK).prop_map(|params| Message::PublishOk(RequestOk {
            params,
            properties: vec![]
        })),
        (vint(), vint(), bytes_s(32)).prop_map(|(status, stream_count, reason)| {
            Message::PublishDone(PublishDone {
                status,
                stream_count,
                reason,
            })
        }),
        (vint(), fetch_kind_s(), params_s(allowed::FETCH)).prop_map(
            |(request_id, kind, params)| {
                Message::Fetch(Fetch {
                    request_id,
                    kind,
                    params,
                })
            }
        ),
        (any::<bool>(), location_s(), kvps_s()).prop_map(|(e, l, k)| {
            Message::FetchOk(FetchOk {
                end_of_track: e,
                end_location: l,
                params: Parameters::default(),
                properties: k,
            })
        }),
        subscribe_s(allowed::TRACK_STATUS).prop_map(Message::TrackStatus),
        ns_request_s(allowed::PUBLISH_NAMESPACE).prop_map(Message::PublishNamespace),
        ns_request_s(allowed::SUBSCRIBE_NAMESPACE).prop_map(Message::SubscribeNamespace),
        ns_request_s(allowed::SUBSCRIBE_TRACKS).prop_map(Message::SubscribeTracks),
        namespace_s().prop_map(Message::Namespace),
        namespace_s().prop_map(Message::NamespaceDone),
        (namespace_s(), bytes_s(8)).prop_map(|(suffix, name)| {
            Message::PublishBlocked(PublishBlocked { suffix, name })
        }),
        (vint(), params_s(allowed::REQUEST_UPDATE)).prop_map(|(request_id, params)| {
            Message::RequestUpdate(RequestUpdate { request_id, params })
        }),
        (params_s(allowed::REQUEST_OK), kvps_s())
            .prop_map(|(params, properties)| Message::RequestOk(RequestOk { params, properties })),
        (
            prop_oneof![vint(), Just(request_error::REDIRECT)],
            vint(),
            bytes_s(32),
            bytes_s(16),
            track_s()
        )
            .prop_map(|(code, retry_interval, reason, uri, track)| {
                Message::RequestError(RequestError {
                    code,
                    retry_interval,
                    reason,
                    redirect: (code == request_error::REDIRECT).then_some(Redirect {
                        connect_uri: uri,
                        track,
                    }),
                })
            }),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn prop_message_roundtrip(m in message_s()) {
        let b = m.to_bytes();
        let (d, used) = Message::decode_bytes(&b).unwrap();
        prop_assert_eq!(used, b.len());
        prop_assert_eq!(&d, &m);
    }

    /// Several messages back to back decode one by one, and every proper prefix
    /// of the stream is Short at the message being cut.
    #[test]
    fn prop_message_stream(ms in vec(message_s(), 1..5), cut in any::<prop::sample::Index>()) {
        let mut b = BytesMut::new();
        for m in &ms {
            m.encode(&mut b);
        }
        let b = b.freeze();
        let mut s = &b[..];
        for m in &ms {
            prop_assert_eq!(&Message::decode(&mut s, &b).unwrap(), m);
        }
        prop_assert!(s.is_empty());
        let n = cut.index(b.len());
        let part = b.slice(..n);
        let mut s = &part[..];
        let mut got = 0;
        loop {
            match Message::decode(&mut s, &part) {
                Ok(_) => got += 1,
                Err(e) => {
                    prop_assert_eq!(e, DecodeError::Short);
                    break;
                }
            }
        }
        prop_assert!(got < ms.len());
    }

    /// The FrameReader yields the same messages whatever the chunking.
    #[test]
    fn prop_frame_reader_chunking(ms in vec(message_s(), 1..4), chunk in 1usize..40) {
        let mut b = BytesMut::new();
        for m in &ms {
            m.encode(&mut b);
        }
        let mut r = crate::session::FrameReader::new();
        let mut got = Vec::new();
        for piece in b.chunks(chunk) {
            r.push(piece);
            while let Some(m) = r.next().unwrap() {
                got.push(m);
            }
        }
        prop_assert_eq!(got, ms);
        prop_assert_eq!(r.pending(), 0);
    }

    /// Encoded messages with a few bytes changed: the decoder may accept or
    /// reject, but never panics, and what it accepts round-trips.
    #[test]
    fn prop_mutated_messages(
        m in message_s(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut b = m.to_bytes().to_vec();
        for (i, v) in edits {
            let i = i.index(b.len());
            b[i] = v;
        }
        crate::fuzz::fuzz_message(&b);
        let mut r = vec![7u8];
        r.extend_from_slice(&b);
        crate::fuzz::fuzz_frame_reader(&r);
    }

    /// Truncations and extensions of valid frames.
    #[test]
    fn prop_resized_messages(m in message_s(), cut in any::<prop::sample::Index>(), extra in vec(any::<u8>(), 0..8)) {
        let full = m.to_bytes();
        let mut b = full[..cut.index(full.len())].to_vec();
        b.extend_from_slice(&extra);
        crate::fuzz::fuzz_message(&b);
    }

    /// Parameter blocks round-trip on their own for every message's set.
    #[test]
    fn prop_parameters_roundtrip(
        (which, p) in (0usize..crate::fuzz::PARAMETER_SETS.len())
            .prop_flat_map(|w| (Just(w), params_s(crate::fuzz::PARAMETER_SETS[w])))
    ) {
        let set = crate::fuzz::PARAMETER_SETS[which];
        let mut enc = Vec::new();
        p.encode(&mut enc);
        let src = Bytes::from(enc);
        let mut s = &src[..];
        prop_assert_eq!(Parameters::decode(&mut s, &src, set).unwrap(), p);
        prop_assert!(s.is_empty());
    }
}
