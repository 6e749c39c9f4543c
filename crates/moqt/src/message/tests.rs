use super::*;
use crate::params::SubscriptionFilter;

fn roundtrip(m: Message) {
    let b = m.to_bytes();
    let (d, used) = Message::decode_bytes(&b).unwrap();
    assert_eq!(used, b.len());
    assert_eq!(d, m);
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
}
