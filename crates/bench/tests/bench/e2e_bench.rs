//! `quichub-bench run`'s library end to end against an in-process quichub
//! relay: the draft's scenario 1 and 2 profiles, shortened to a few seconds.

use std::time::Duration;

use quichub_bench::metrics::TrackState;
use quichub_bench::run::{self, RunConfig};
use quichub_bench::Profile;
use quichub_client::{TrackMode, Verify};
use quichub_testkit::TestRelay;

fn shortened(path: &str) -> Profile {
    let mut p =
        Profile::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../../").to_string() + path).unwrap();
    for t in &mut p.tracks {
        t.start_delay_ms = 1000;
        t.total_transmit_time_ms = 3500;
    }
    p
}

async fn bench(profile: &Profile, subscribers: usize, mode: TrackMode, scheme: &str) {
    let relay = TestRelay::start().await;
    let cfg = RunConfig {
        relay: relay.url(scheme),
        verify: Verify::Fingerprints(vec![relay.fingerprint.clone()]),
        draft: None,
        publish_mode: mode,
        subscribe_wait: Duration::from_secs(5),
        progress: false,
        relay_pid: Some(std::process::id()),
    };
    let r = run::run(&cfg, profile, subscribers, true).await.unwrap();
    assert_eq!(r.failed_subscriptions, 0);
    assert_eq!(r.report.tracks.len(), subscribers * profile.tracks.len());
    for t in &r.report.tracks {
        assert_eq!(
            t.state,
            TrackState::Completed,
            "{} {:?}",
            t.label,
            t.failure
        );
        let sent = t.objects_sent.unwrap();
        let tp = profile
            .tracks
            .iter()
            .find(|p| t.label.starts_with(&p.section))
            .unwrap();
        assert_eq!(
            sent,
            tp.data_objects(),
            "{}: the publisher sent the whole schedule",
            t.label
        );
        assert_eq!(
            t.received_objects, sent,
            "{}: every object received",
            t.label
        );
        assert_eq!(t.lost_objects, Some(0), "{}", t.label);
        assert_eq!(
            Some(t.received_groups),
            t.groups_sent,
            "{}: groups counted",
            t.label
        );
    }
    let all = r.report.aggregates.last().unwrap();
    assert_eq!(all.lost_objects, 0);
    assert!(all.latency.samples > 0);
    assert!(r.relay_us_per_object.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario1_audio_20_subscribers() {
    bench(
        &shortened("profiles/scenario1-audio.ini"),
        20,
        TrackMode::Announce,
        "moqt",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario2_audio_video_5_subscribers() {
    bench(
        &shortened("profiles/scenario2-audio-video.ini"),
        5,
        TrackMode::Push,
        "https",
    )
    .await;
}
