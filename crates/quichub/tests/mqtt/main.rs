//! End-to-end tests of the MQTT broker: over TCP, TLS and QUIC (0-RTT,
//! client certificates), authentication and ACLs, durability across a kill,
//! and third-party clients (mosquitto, paho). The paho scripts sit beside
//! the modules that run them.

mod e2e_mqtt;
mod e2e_mqtt_0rtt;
mod e2e_mqtt_auth;
mod e2e_mqtt_certs;
mod e2e_mqtt_durability;
mod e2e_mqtt_paho;
mod e2e_mqtt_quic;
