//! MQTT 5 reason codes and MQTT 3.1.1 CONNACK return codes.
//!
//! Several MQTT 5 codes share a value (0x00 is Success, Normal Disconnection
//! and Granted QoS 0); the constants below name each meaning.

/// Success (CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK, AUTH).
pub const SUCCESS: u8 = 0x00;
/// Normal disconnection (DISCONNECT).
pub const NORMAL_DISCONNECTION: u8 = 0x00;
/// Granted QoS 0 (SUBACK).
pub const GRANTED_QOS_0: u8 = 0x00;
/// Granted QoS 1 (SUBACK).
pub const GRANTED_QOS_1: u8 = 0x01;
/// Granted QoS 2 (SUBACK).
pub const GRANTED_QOS_2: u8 = 0x02;
/// Disconnect with Will Message (DISCONNECT).
pub const DISCONNECT_WITH_WILL: u8 = 0x04;
/// No matching subscribers (PUBACK, PUBREC).
pub const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
/// No subscription existed (UNSUBACK).
pub const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
/// Continue authentication (AUTH).
pub const CONTINUE_AUTHENTICATION: u8 = 0x18;
/// Re-authenticate (AUTH).
pub const REAUTHENTICATE: u8 = 0x19;
/// Unspecified error.
pub const UNSPECIFIED_ERROR: u8 = 0x80;
/// Malformed Packet.
pub const MALFORMED_PACKET: u8 = 0x81;
/// Protocol Error.
pub const PROTOCOL_ERROR: u8 = 0x82;
/// Implementation specific error.
pub const IMPLEMENTATION_SPECIFIC_ERROR: u8 = 0x83;
/// Unsupported Protocol Version (CONNACK).
pub const UNSUPPORTED_PROTOCOL_VERSION: u8 = 0x84;
/// Client Identifier not valid (CONNACK).
pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
/// Bad User Name or Password (CONNACK).
pub const BAD_USERNAME_OR_PASSWORD: u8 = 0x86;
/// Not authorized.
pub const NOT_AUTHORIZED: u8 = 0x87;
/// Server unavailable (CONNACK).
pub const SERVER_UNAVAILABLE: u8 = 0x88;
/// Server busy.
pub const SERVER_BUSY: u8 = 0x89;
/// Banned (CONNACK).
pub const BANNED: u8 = 0x8A;
/// Server shutting down (DISCONNECT).
pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
/// Bad authentication method.
pub const BAD_AUTHENTICATION_METHOD: u8 = 0x8C;
/// Keep Alive timeout (DISCONNECT).
pub const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
/// Session taken over (DISCONNECT).
pub const SESSION_TAKEN_OVER: u8 = 0x8E;
/// Topic Filter invalid.
pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
/// Topic Name invalid.
pub const TOPIC_NAME_INVALID: u8 = 0x90;
/// Packet Identifier in use.
pub const PACKET_IDENTIFIER_IN_USE: u8 = 0x91;
/// Packet Identifier not found.
pub const PACKET_IDENTIFIER_NOT_FOUND: u8 = 0x92;
/// Receive Maximum exceeded (DISCONNECT).
pub const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
/// Topic Alias invalid (DISCONNECT).
pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
/// Packet too large.
pub const PACKET_TOO_LARGE: u8 = 0x95;
/// Message rate too high (DISCONNECT).
pub const MESSAGE_RATE_TOO_HIGH: u8 = 0x96;
/// Quota exceeded.
pub const QUOTA_EXCEEDED: u8 = 0x97;
/// Administrative action (DISCONNECT).
pub const ADMINISTRATIVE_ACTION: u8 = 0x98;
/// Payload format invalid.
pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
/// Retain not supported.
pub const RETAIN_NOT_SUPPORTED: u8 = 0x9A;
/// QoS not supported.
pub const QOS_NOT_SUPPORTED: u8 = 0x9B;
/// Use another server.
pub const USE_ANOTHER_SERVER: u8 = 0x9C;
/// Server moved.
pub const SERVER_MOVED: u8 = 0x9D;
/// Shared Subscriptions not supported.
pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
/// Connection rate exceeded.
pub const CONNECTION_RATE_EXCEEDED: u8 = 0x9F;
/// Maximum connect time (DISCONNECT).
pub const MAXIMUM_CONNECT_TIME: u8 = 0xA0;
/// Subscription Identifiers not supported.
pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: u8 = 0xA1;
/// Wildcard Subscriptions not supported.
pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0xA2;

/// MQTT 3.1.1 CONNACK return code: connection accepted.
pub const V311_ACCEPTED: u8 = 0;
/// MQTT 3.1.1 CONNACK return code: unacceptable protocol version.
pub const V311_UNACCEPTABLE_PROTOCOL_VERSION: u8 = 1;
/// MQTT 3.1.1 CONNACK return code: identifier rejected.
pub const V311_IDENTIFIER_REJECTED: u8 = 2;
/// MQTT 3.1.1 CONNACK return code: server unavailable.
pub const V311_SERVER_UNAVAILABLE: u8 = 3;
/// MQTT 3.1.1 CONNACK return code: bad user name or password.
pub const V311_BAD_USERNAME_OR_PASSWORD: u8 = 4;
/// MQTT 3.1.1 CONNACK return code: not authorized.
pub const V311_NOT_AUTHORIZED: u8 = 5;
/// MQTT 3.1.1 SUBACK return code: failure.
pub const V311_SUBACK_FAILURE: u8 = 0x80;

/// Maps an MQTT 5 CONNACK reason code to the closest MQTT 3.1.1 return code.
pub fn connack_v311(code: u8) -> u8 {
    match code {
        SUCCESS => V311_ACCEPTED,
        UNSUPPORTED_PROTOCOL_VERSION => V311_UNACCEPTABLE_PROTOCOL_VERSION,
        CLIENT_IDENTIFIER_NOT_VALID => V311_IDENTIFIER_REJECTED,
        BAD_USERNAME_OR_PASSWORD => V311_BAD_USERNAME_OR_PASSWORD,
        NOT_AUTHORIZED | BANNED | BAD_AUTHENTICATION_METHOD => V311_NOT_AUTHORIZED,
        _ => V311_SERVER_UNAVAILABLE,
    }
}

/// Whether `code` is an error (0x80 or above) rather than a success.
pub fn is_error(code: u8) -> bool {
    code >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v311_mapping() {
        assert_eq!(connack_v311(SUCCESS), 0);
        assert_eq!(connack_v311(UNSUPPORTED_PROTOCOL_VERSION), 1);
        assert_eq!(connack_v311(CLIENT_IDENTIFIER_NOT_VALID), 2);
        assert_eq!(connack_v311(SERVER_BUSY), 3);
        assert_eq!(connack_v311(BAD_USERNAME_OR_PASSWORD), 4);
        assert_eq!(connack_v311(BANNED), 5);
        assert_eq!(connack_v311(MALFORMED_PACKET), 3);
        assert!(is_error(PROTOCOL_ERROR) && !is_error(GRANTED_QOS_2));
    }
}
