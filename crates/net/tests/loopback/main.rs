//! The network layer over real QUIC on loopback: ACK frequency, endpoint
//! shards on one port.

mod ack_frequency;
mod shards;
