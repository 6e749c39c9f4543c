//! The studies the experiments reproduce or extend, cited as a reader would
//! look them up (title and authors).

use serde::Serialize;

/// A published study.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Study {
    /// Authors, as printed ("" when the text gives none).
    pub authors: &'static str,
    /// Title.
    pub title: &'static str,
    /// Venue and year, or year ("" when unknown).
    pub published: &'static str,
    /// Short form for tables and plot titles ("Cao et al.").
    pub short: &'static str,
}

impl Study {
    /// Full citation: `A. Sengupta, "Title", 2025`.
    pub fn cite(&self) -> String {
        let mut s = String::new();
        if !self.authors.is_empty() {
            s.push_str(self.authors);
            s.push_str(", ");
        }
        s.push('"');
        s.push_str(self.title);
        s.push('"');
        if !self.published.is_empty() {
            s.push_str(", ");
            s.push_str(self.published);
        }
        s
    }
}

/// The IMU, video priority and fingerprinting study (`lab imu`).
pub const SENGUPTA_2025: Study = Study {
    authors: "A. Sengupta",
    title: "Streaming over QUIC: Applications in Media and IoT",
    published: "2025",
    short: "Sengupta 2025",
};

/// The mobile augmented reality transport study (`lab mar`).
pub const CAO_MAR: Study = Study {
    authors: "J. Cao, X. Su, B. Finley, P. Zhou, P. Hui",
    title: "Evaluating Transport Protocols on 5G for Mobile Augmented Reality",
    published: "",
    short: "Cao et al.",
};

/// The live-video throughput study, MoQ against RTMP ingest + HLS delivery
/// over TCP (`lab live-video`).
pub const ESTUPINAN_2025: Study = Study {
    authors: "E. P. Estupiñan-Cuesta, J. C. Martínez, W. A. Roldán-Pineda",
    title: "Evaluation of Throughput in Live Video Streaming: TCP vs. QUIC as a Proof of Concept",
    published: "Visión Investigadora 19(1), 2025",
    short: "Estupiñan-Cuesta et al. 2025",
};

/// The Drift paper: HTTP/3 pub/sub against MQTT over QUIC (`lab zero-rtt`
/// extends its time-to-broker measurement to 0-RTT, which it set aside).
pub const DRIFT: Study = Study {
    authors: "",
    title: "A Pure HTTP/3 Alternative to MQTT-over-QUIC in Resource-Constrained IoT",
    published: "",
    short: "the Drift paper",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_name_title_and_authors() {
        assert_eq!(
            SENGUPTA_2025.cite(),
            "A. Sengupta, \"Streaming over QUIC: Applications in Media and IoT\", 2025"
        );
        assert!(CAO_MAR
            .cite()
            .starts_with("J. Cao, X. Su, B. Finley, P. Zhou, P. Hui, \"Evaluating"));
        assert!(DRIFT.cite().starts_with("\"A Pure HTTP/3"));
        assert!(ESTUPINAN_2025
            .cite()
            .ends_with("Visión Investigadora 19(1), 2025"));
    }
}
