//! Startup cost of the broker store: generates a large log and times
//! [`Store::open`] on it (run under `/usr/bin/time -v` for the peak RSS).
//!
//! ```text
//! cargo run -p quichub-gateway --example store_open -- gen FILE MIB
//! ln FILE DIR/broker.log   # open rewrites the log: a link keeps FILE
//! /usr/bin/time -v target/debug/examples/store_open open DIR
//! ```
//!
//! The log is header-less (format 0, which every version reads), and holds
//! retained messages on 10 000 topics, each overwritten many times: a large
//! file whose live state is small (about 10 MB), so the memory that replay
//! itself takes stands out.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use quichub_gateway::store::{Fsync, Recovery, Store};
use quichub_mqtt::{Packet, Properties, Publish, QoS, Version};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match (args.get(1).map(String::as_str), args.get(2), args.get(3)) {
        (Some("gen"), Some(file), Some(mib)) => {
            gen(Path::new(file), mib.parse().expect("MIB: a number"));
        }
        (Some("open"), Some(dir), None) => open(Path::new(dir)),
        _ => eprintln!("usage: store_open gen FILE MIB | store_open open DIR"),
    }
}

fn open(dir: &Path) {
    let t = Instant::now();
    let (_store, rec) = Store::open(dir, Fsync::Never, Recovery::Salvage).expect("open the store");
    println!(
        "open {:.2?}: {} records replayed, {} retained",
        t.elapsed(),
        rec.records,
        rec.retained.len()
    );
}

fn gen(file: &Path, mib: u64) {
    let mut w = BufWriter::with_capacity(1 << 20, File::create(file).expect("create"));
    let payload = Bytes::from(vec![b'x'; 1000]);
    let (mut written, mut seq) = (0u64, 0u64);
    let mut body = BytesMut::new();
    while written < mib << 20 {
        seq += 1;
        let topic = format!("sensors/{}", seq % 10_000);
        let mut publish = BytesMut::new();
        let p = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: topic.clone(),
            packet_id: Some(1),
            properties: Properties::default(),
            payload: payload.clone(),
        });
        quichub_mqtt::encode(&p, Version::V5, &mut publish).expect("encode");
        // Msg: tag 5, seq, expiry (none), the PUBLISH.
        body.clear();
        body.put_u8(5);
        body.put_u64(seq);
        body.put_u64(0);
        body.put_u32(publish.len() as u32);
        body.put_slice(&publish);
        written += put_record(&mut w, &body);
        // Retain: tag 8, topic, seq.
        body.clear();
        body.put_u8(8);
        body.put_u32(topic.len() as u32);
        body.put_slice(topic.as_bytes());
        body.put_u64(seq);
        written += put_record(&mut w, &body);
    }
    w.flush().expect("write");
    println!("{}: {written} bytes, {} records", file.display(), seq * 2);
}

fn put_record(w: &mut impl Write, body: &[u8]) -> u64 {
    w.write_all(&(body.len() as u32).to_be_bytes())
        .expect("write");
    w.write_all(&crc32fast::hash(body).to_be_bytes())
        .expect("write");
    w.write_all(body).expect("write");
    8 + body.len() as u64
}
