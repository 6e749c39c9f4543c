use super::*;
use crate::message::Redirect;

fn frame(t: u64, payload: &[u8]) -> Bytes {
    let mut b = Vec::new();
    put_varint(&mut b, t);
    b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    b.extend_from_slice(payload);
    Bytes::from(b)
}

fn decode_as(draft: Draft, b: &Bytes) -> Result<Control, DecodeError> {
    let mut s = &b[..];
    let m = Control::decode(draft, &mut s, b)?;
    assert!(s.is_empty(), "trailing bytes");
    Ok(m)
}

fn decode(b: &Bytes) -> Result<Control, DecodeError> {
    decode_as(Draft::D16, b)
}

/// A reply's kind is the encoder's input; draft 16 cannot say it for most.
fn norm(c: Control) -> Control {
    match c {
        Control::Reply {
            request_id, msg, ..
        } => r(request_id, RequestKind::Unknown, msg),
        c => c,
    }
}

fn r(request_id: u64, to: RequestKind, msg: Message) -> Control {
    Control::Reply {
        request_id,
        to,
        msg,
    }
}

fn round_trip_as(draft: Draft, c: Control) {
    let b = c.to_bytes(draft).unwrap();
    assert_eq!(
        norm(decode_as(draft, &b).unwrap()),
        norm(c.clone()),
        "{} in {draft:?}",
        c.name()
    );
}

fn round_trip(c: Control) {
    round_trip_as(Draft::D16, c)
}

fn sub_params() -> Parameters {
    Parameters {
        object_delivery_timeout: Some(5000),
        authorization_tokens: vec![Bytes::from_static(b"\x01\x02tok")],
        forward: Some(true),
        subscriber_priority: Some(200),
        subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
            start: Location::new(70, 2),
            end_group_delta: 30,
        }),
        group_order: Some(GroupOrder::Descending),
        new_group_request: Some(0),
        ..Default::default()
    }
}

#[test]
fn subscribe_ok_matches_moq_dev_vector() {
    // moq-net 0.3.18 ietf/subscribe.rs: SUBSCRIBE_OK, draft 16, Request ID 7,
    // alias 42, LARGEST_OBJECT {9, 3} length-prefixed.
    let b = frame(0x4, &[7, 42, 1, 0x09, 0x02, 0x09, 0x03]);
    let c = decode(&b).unwrap();
    let Control::Reply {
        request_id: 7,
        msg: Message::SubscribeOk(ok),
        ..
    } = &c
    else {
        panic!("{c:?}")
    };
    assert_eq!(ok.track_alias, 42);
    assert_eq!(ok.params.largest_object, Some(Location::new(9, 3)));
    assert_eq!(c.to_bytes(Draft::D16).unwrap(), b);
}

#[test]
fn subscriber_priority_is_a_varint() {
    // moq-net parameters.rs: SUBSCRIBER_PRIORITY 255 is 0x40 0xff in draft 16
    // (a byte in 18).
    let mut out = Vec::new();
    put_params(
        &mut W(&mut out),
        &Parameters {
            subscriber_priority: Some(255),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(out, [0x01, 0x20, 0x40, 0xff]);
}

#[test]
fn requests_round_trip() {
    let track = FullTrackName::new("live/room", "video");
    round_trip(Control::Request(Message::Subscribe(Subscribe {
        request_id: 4,
        track: track.clone(),
        params: sub_params(),
    })));
    round_trip(Control::Request(Message::TrackStatus(Subscribe {
        request_id: 6,
        track: track.clone(),
        params: Parameters::default(),
    })));
    round_trip(Control::Request(Message::Publish(Publish {
        request_id: 8,
        track: track.clone(),
        track_alias: 3,
        params: Parameters {
            forward: Some(false),
            largest_object: Some(Location::new(100_000, 7)),
            expires: Some(1),
            ..Default::default()
        },
        properties: Vec::new(),
    })));
    for kind in [
        FetchKind::Standalone {
            track: track.clone(),
            start: Location::new(1, 0),
            end: Location::new(5, 0),
        },
        FetchKind::RelativeJoining {
            joining_request_id: 4,
            joining_start: 2,
        },
        FetchKind::AbsoluteJoining {
            joining_request_id: 4,
            joining_start: 9,
        },
    ] {
        round_trip(Control::Request(Message::Fetch(Fetch {
            request_id: 10,
            kind,
            params: Parameters {
                subscriber_priority: Some(1),
                group_order: Some(GroupOrder::Ascending),
                ..Default::default()
            },
        })));
    }
    round_trip(Control::Request(Message::PublishNamespace(
        NamespaceRequest {
            request_id: 12,
            namespace: TrackNamespace::from_path("live/room"),
            params: Parameters::default(),
        },
    )));
    for options in [
        SubscribeOptions::Publish,
        SubscribeOptions::Namespace,
        SubscribeOptions::Both,
    ] {
        round_trip(Control::SubscribeNamespace {
            request: NamespaceRequest {
                request_id: 14,
                namespace: TrackNamespace::default(),
                params: Parameters::default(),
            },
            options,
        });
    }
}

#[test]
fn replies_and_the_rest_round_trip() {
    round_trip(Control::ClientSetup {
        versions: vec![],
        options: vec![
            KeyValue::bytes(1, "/anon"),
            KeyValue::int(2, 100),
            KeyValue::bytes(7, "quichub"),
        ],
    });
    round_trip(Control::ServerSetup {
        version: None,
        options: vec![KeyValue::int(2, u32::MAX as u64)],
    });
    round_trip(Control::GoAway(Bytes::from_static(b"moqt://other:4443/")));
    round_trip(Control::MaxRequestId(1_000_000));
    round_trip(Control::RequestsBlocked(64));
    round_trip(r(
        4,
        RequestKind::Unknown,
        Message::SubscribeOk(SubscribeOk {
            track_alias: 1,
            params: Parameters {
                expires: Some(0),
                largest_object: Some(Location::new(3, 4)),
                ..Default::default()
            },
            properties: Vec::new(),
        }),
    ));
    round_trip(r(
        5,
        RequestKind::Unknown,
        Message::PublishOk(RequestOk {
            // No token: draft 18 allows none in PUBLISH_OK (and drops it).
            params: Parameters {
                authorization_tokens: vec![],
                ..sub_params()
            },
            properties: Vec::new(),
        }),
    ));
    round_trip(r(
        6,
        RequestKind::Unknown,
        Message::RequestOk(RequestOk::default()),
    ));
    round_trip(r(
        8,
        RequestKind::Unknown,
        Message::RequestError(RequestError {
            code: request_error::DOES_NOT_EXIST,
            retry_interval: 0,
            reason: Bytes::from_static(b"no such track"),
            redirect: None,
        }),
    ));
    round_trip(r(
        10,
        RequestKind::Unknown,
        Message::FetchOk(FetchOk {
            end_of_track: true,
            end_location: Location::new(5, 3),
            params: Parameters::default(),
            properties: Vec::new(),
        }),
    ));
    round_trip(r(
        4,
        RequestKind::Unknown,
        Message::PublishDone(PublishDone {
            status: publish_done::TRACK_ENDED,
            stream_count: 12,
            reason: Bytes::from_static(b"bye"),
        }),
    ));
    round_trip(Control::Update {
        request_id: 16,
        existing: 4,
        params: Parameters {
            forward: Some(false),
            ..Default::default()
        },
    });
    round_trip(Control::Unsubscribe(4));
    round_trip(Control::FetchCancel(10));
    round_trip(Control::PublishNamespaceDone(NamespaceRef::Id(12)));
    round_trip(Control::PublishNamespaceCancel {
        target: NamespaceRef::Id(12),
        code: 1,
        reason: Bytes::from_static(b"no"),
    });
    round_trip(Control::Namespace(TrackNamespace::from_path("a/b")));
    round_trip(Control::NamespaceDone(TrackNamespace::from_path("a")));
}

#[test]
fn differences_from_18_are_translated() {
    // End Group is absolute in 16, a delta in 18.
    let p = Parameters {
        subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
            start: Location::new(70, 0),
            end_group_delta: 30,
        }),
        ..Default::default()
    };
    let mut out = Vec::new();
    put_params(&mut W(&mut out), &p).unwrap();
    assert_eq!(out, [1, 0x21, 6, 4, 0x40, 70, 0, 0x40, 100]);

    // EXPIRED and TOO_FAR_BEHIND swap.
    let c = r(
        2,
        RequestKind::Unknown,
        Message::PublishDone(PublishDone {
            status: publish_done::TOO_FAR_BEHIND,
            stream_count: 0,
            reason: Bytes::new(),
        }),
    );
    assert_eq!(&c.to_bytes(Draft::D16).unwrap()[3..5], [2, 6]);

    // A redirect keeps its URI in the reason.
    let c = r(
        2,
        RequestKind::Unknown,
        Message::RequestError(RequestError {
            code: request_error::REDIRECT,
            retry_interval: 0,
            reason: Bytes::new(),
            redirect: Some(Redirect {
                connect_uri: Bytes::from_static(b"moqt://b/"),
                track: FullTrackName::default(),
            }),
        }),
    );
    let Control::Reply {
        msg: Message::RequestError(e),
        ..
    } = decode(&c.to_bytes(Draft::D16).unwrap()).unwrap()
    else {
        panic!()
    };
    assert_eq!(e.code, request_error::INTERNAL_ERROR);
    assert_eq!(&e.reason[..], b"redirect to moqt://b/");

    // Draft-18-only parameters are not sent to a draft-16 peer.
    let mut out = Vec::new();
    put_params(
        &mut W(&mut out),
        &Parameters {
            rendezvous_timeout: Some(5),
            fill_timeout: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(out, [0]);
}

#[test]
fn values_beyond_varints_are_refused() {
    let c = Control::MaxRequestId(u64::MAX);
    assert_eq!(c.to_bytes(Draft::D16), Err(EncodeError::TooLarge));
    let c = r(
        1,
        RequestKind::Unknown,
        Message::PublishBlocked(crate::message::PublishBlocked::default()),
    );
    assert!(matches!(
        c.to_bytes(Draft::D16),
        Err(EncodeError::Unsupported(_))
    ));
}

#[test]
fn malformed_input_is_an_error() {
    // Unknown parameter 0x04 (RENDEZVOUS_TIMEOUT is draft 18's).
    let b = frame(0x3, &[0, 1, 1, b'a', 1, b'b', 1, 0x04, 5]);
    assert_eq!(decode(&b), Err(DecodeError::UnknownParameter(4)));
    // Length longer than the payload.
    let b = frame(0xA, &[4, 0]);
    assert_eq!(decode(&b), Err(DecodeError::LengthMismatch));
    // Unknown message.
    assert_eq!(
        decode(&frame(0x40, &[])),
        Err(DecodeError::UnknownMessage(0x40))
    );
    // End group before start.
    let b = frame(0x3, &[0, 1, 1, b'a', 1, b'b', 1, 0x21, 4, 4, 9, 0, 3]);
    assert!(matches!(decode(&b), Err(DecodeError::Invalid(_))));
    // Truncated: Short, input untouched.
    let full = frame(0xA, &[4]);
    let part = full.slice(..2);
    let mut s = &part[..];
    assert_eq!(
        Control::decode(Draft::D16, &mut s, &part),
        Err(DecodeError::Short)
    );
    assert_eq!(s.len(), 2);
}

#[test]
fn frame_reader_splits_a_stream() {
    let mut all = Vec::new();
    for c in [
        Control::MaxRequestId(10),
        Control::Unsubscribe(4),
        Control::GoAway(Bytes::new()),
    ] {
        all.extend_from_slice(&c.to_bytes(Draft::D16).unwrap());
    }
    let mut r = LegacyFrameReader::new(Draft::D16);
    let mut got = Vec::new();
    for b in &all {
        r.push(&[*b]);
        while let Some(c) = r.next().unwrap() {
            got.push(c.name());
        }
    }
    assert_eq!(got, ["MAX_REQUEST_ID", "UNSUBSCRIBE", "GOAWAY"]);
    assert_eq!(r.pending(), 0);
}

#[test]
fn garbage_never_panics() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t = [
            0x2, 0x3, 0x4, 0x5, 0x7, 0xB, 0x11, 0x16, 0x18, 0x1D, 0x1E, 0x20,
        ][(x % 12) as usize];
        let len = (x >> 8) % 24;
        let payload: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
        let b = frame(t, &payload);
        let _ = decode(&b);
    }
}

#[test]
fn draft_14_layouts() {
    let d = Draft::D14;
    let track = FullTrackName::new("live", "clock");
    // CLIENT_SETUP lists versions; SERVER_SETUP picks one; types absolute.
    let c = Control::ClientSetup {
        versions: vec![super::super::VERSION_D14],
        options: vec![KeyValue::bytes(7, "x"), KeyValue::int(2, 100)],
    };
    let b = c.to_bytes(d).unwrap();
    assert_eq!(
        &b[..],
        [0x20, 0, 16, 1, 0xc0, 0, 0, 0, 0xff, 0, 0, 0x0e, 2, 7, 1, b'x', 2, 0x40, 100]
    );
    round_trip_as(d, c);
    round_trip_as(
        d,
        Control::ServerSetup {
            version: Some(super::super::VERSION_D14),
            options: vec![KeyValue::int(2, 1000)],
        },
    );
    // SUBSCRIBE: priority, order, forward and the filter are fields.
    let sub = Control::Request(Message::Subscribe(Subscribe {
        request_id: 0,
        track: track.clone(),
        params: Parameters {
            subscriber_priority: Some(7),
            group_order: Some(GroupOrder::Descending),
            forward: Some(true),
            subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
                start: Location::new(5, 1),
                end_group_delta: 2,
            }),
            object_delivery_timeout: Some(100),
            ..Default::default()
        },
    }));
    let b = sub.to_bytes(d).unwrap();
    assert_eq!(
        &b[3..],
        [
            0, 1, 4, b'l', b'i', b'v', b'e', 5, b'c', b'l', b'o', b'c', b'k', 7, 2, 1, 4, 5, 1, 7,
            1, 2, 0x40, 100
        ]
    );
    round_trip_as(d, sub);
    // An OK and an ERROR type per request.
    for (to, t) in [
        (RequestKind::Subscribe, 0x5),
        (RequestKind::Fetch, 0x19),
        (RequestKind::TrackStatus, 0xF),
        (RequestKind::Publish, 0x1F),
        (RequestKind::PublishNamespace, 0x8),
        (RequestKind::SubscribeNamespace, 0x13),
    ] {
        let e = r(
            4,
            to,
            Message::RequestError(RequestError {
                code: request_error::DOES_NOT_EXIST,
                reason: Bytes::from_static(b"gone"),
                ..Default::default()
            }),
        );
        let b = e.to_bytes(d).unwrap();
        assert_eq!(b[0], t);
        // Draft 14's TRACK_DOES_NOT_EXIST is 0x4, and no retry interval.
        assert_eq!(&b[3..], [4, 4, 4, b'g', b'o', b'n', b'e']);
        assert_eq!(decode_as(d, &b).unwrap(), e);
    }
    for (to, t) in [
        (RequestKind::PublishNamespace, 0x7),
        (RequestKind::SubscribeNamespace, 0x12),
    ] {
        let ok = r(4, to, Message::RequestOk(RequestOk::default()));
        let b = ok.to_bytes(d).unwrap();
        assert_eq!(&b[..], [t, 0, 1, 4]);
        assert_eq!(decode_as(d, &b).unwrap(), ok);
    }
    // TRACK_STATUS_OK is SUBSCRIBE_OK's layout with alias 0.
    let ok = r(
        6,
        RequestKind::TrackStatus,
        Message::RequestOk(RequestOk {
            params: Parameters {
                largest_object: Some(Location::new(9, 3)),
                ..Default::default()
            },
            properties: Vec::new(),
        }),
    );
    let b = ok.to_bytes(d).unwrap();
    assert_eq!(&b[..], [0xE, 0, 8, 6, 0, 0, 1, 1, 9, 3, 0]);
    assert_eq!(decode_as(d, &b).unwrap(), ok);
    // SUBSCRIBE_OK carries Largest as a field.
    round_trip_as(
        d,
        r(
            0,
            RequestKind::Subscribe,
            Message::SubscribeOk(SubscribeOk {
                track_alias: 3,
                params: Parameters {
                    largest_object: Some(Location::new(2, 0)),
                    expires: Some(30_000),
                    ..Default::default()
                },
                properties: Vec::new(),
            }),
        ),
    );
    // PUBLISH and PUBLISH_OK.
    round_trip_as(
        d,
        Control::Request(Message::Publish(Publish {
            request_id: 2,
            track: track.clone(),
            track_alias: 1,
            params: Parameters {
                largest_object: Some(Location::new(4, 4)),
                forward: Some(false),
                ..Default::default()
            },
            properties: Vec::new(),
        })),
    );
    round_trip_as(
        d,
        r(
            2,
            RequestKind::Publish,
            Message::PublishOk(RequestOk {
                params: Parameters {
                    forward: Some(true),
                    subscriber_priority: Some(1),
                    group_order: Some(GroupOrder::Ascending),
                    subscription_filter: Some(SubscriptionFilter::NextGroupStart),
                    ..Default::default()
                },
                properties: Vec::new(),
            }),
        ),
    );
    // FETCH carries priority and order as fields; FETCH_OK an order too.
    round_trip_as(
        d,
        Control::Request(Message::Fetch(Fetch {
            request_id: 8,
            kind: FetchKind::Standalone {
                track: track.clone(),
                start: Location::new(1, 0),
                end: Location::new(3, 0),
            },
            params: Parameters {
                subscriber_priority: Some(9),
                group_order: Some(GroupOrder::Ascending),
                ..Default::default()
            },
        })),
    );
    round_trip_as(
        d,
        r(
            8,
            RequestKind::Fetch,
            Message::FetchOk(FetchOk {
                end_of_track: false,
                end_location: Location::new(3, 0),
                params: Parameters::default(),
                properties: Vec::new(),
            }),
        ),
    );
    // SUBSCRIBE_UPDATE: Start, End Group plus one, priority, forward.
    let u = Control::Update {
        request_id: 10,
        existing: 0,
        params: Parameters {
            subscriber_priority: Some(3),
            forward: Some(false),
            subscription_filter: Some(SubscriptionFilter::AbsoluteRange {
                start: Location::new(6, 0),
                end_group_delta: 4,
            }),
            ..Default::default()
        },
    };
    let b = u.to_bytes(d).unwrap();
    assert_eq!(&b[..], [0x2, 0, 8, 10, 0, 6, 0, 11, 3, 0, 0]);
    round_trip_as(d, u);
    // Namespaces by name; PUBLISH_DONE's MALFORMED_TRACK is 0x7.
    let ns = TrackNamespace::from_path("live/room");
    round_trip_as(
        d,
        Control::PublishNamespaceDone(NamespaceRef::Namespace(ns.clone())),
    );
    round_trip_as(d, Control::UnsubscribeNamespace(ns.clone()));
    round_trip_as(
        d,
        Control::PublishNamespaceCancel {
            target: NamespaceRef::Namespace(ns.clone()),
            code: 1,
            reason: Bytes::from_static(b"no"),
        },
    );
    let done = r(
        0,
        RequestKind::Subscribe,
        Message::PublishDone(PublishDone {
            status: publish_done::MALFORMED_TRACK,
            stream_count: 1,
            reason: Bytes::new(),
        }),
    );
    assert_eq!(&done.to_bytes(d).unwrap()[3..5], [0, 7]);
    round_trip_as(d, done);
    // moq-dev subscribes to every namespace with an empty prefix.
    let b = frame(0x11, &[0, 0, 0]);
    assert!(matches!(
        decode_as(d, &b).unwrap(),
        Control::SubscribeNamespace { .. }
    ));
    // Unknown draft-14 parameters are ignored (draft 14 §8.2); draft-14
    // parameters draft 18 does not allow in a message are dropped.
    let b = frame(0x4, &[0, 1, 0, 1, 0, 2, 0x3e, 1, 0x02, 5]);
    let Control::Reply {
        msg: Message::SubscribeOk(ok),
        ..
    } = decode_as(d, &b).unwrap()
    else {
        panic!()
    };
    assert_eq!(ok.params, Parameters::default());
    // A version list that does not fit the frame.
    assert!(decode_as(d, &frame(0x20, &[5, 1])).is_err());
}

#[test]
fn draft_14_garbage_never_panics() {
    let mut x = 0x1234_5678_9abc_def1u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t = [
            0x2, 0x3, 0x4, 0x5, 0x7, 0xB, 0xE, 0x11, 0x14, 0x16, 0x18, 0x1D, 0x1E, 0x20, 0x21,
        ][(x % 15) as usize];
        let len = (x >> 8) % 24;
        let payload: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
        let _ = decode_as(Draft::D14, &frame(t, &payload));
    }
}
