//! What the metrics listener serves besides `/healthz`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use quichub_gateway::Broker;
use quichub_net::server::AdmissionStats;
use quichub_relay::Relay;

/// `/metrics`: the relay's counters, QUIC admission, then the broker's.
pub(crate) fn text(relay: &Relay, broker: &Broker, quic: &AdmissionStats) -> String {
    relay.metrics.render()
        + &quichub_relay::metrics::render_upstreams(&relay.upstream_by_origin())
        + &quic.render()
        + &broker.render_metrics()
}

/// Reloads (SIGHUP, [`crate::Hub::reload`]) applied and refused: a refused
/// one left the configuration as it was, which an operator who thinks
/// they changed it needs to see.
#[derive(Debug, Default)]
pub(crate) struct Reloads {
    pub(crate) applied: AtomicU64,
    pub(crate) refused: AtomicU64,
}

impl Reloads {
    pub(crate) fn render(&self) -> String {
        format!(
            "# HELP quichub_config_reloads_total Configuration reloads, applied or refused whole.\n\
             # TYPE quichub_config_reloads_total counter\n\
             quichub_config_reloads_total{{result=\"applied\"}} {}\n\
             quichub_config_reloads_total{{result=\"refused\"}} {}\n",
            self.applied.load(Relaxed),
            self.refused.load(Relaxed)
        )
    }
}

/// `/readyz`: ready until the relay starts draining (shutdown), so a load
/// balancer stops sending new clients before the sessions are told to go.
pub(crate) fn readiness(relay: &Arc<Relay>) -> quichub_net::metrics_http::Readiness {
    let shutdown = relay.shutdown_signal();
    Arc::new(move || (*shutdown.borrow()).then(|| "draining: shutting down".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quichub_gateway::BrokerConfig;

    #[tokio::test]
    async fn healthz_and_readyz() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let relay = Relay::new(quichub_relay::Config::default());
        let listener = quichub_net::metrics_http::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = quichub_net::tcp_limits::TcpLimits::default();
        tokio::spawn(quichub_net::metrics_http::serve_with(
            quichub_net::tcp_limits::Acceptor::new(listener, limits.metrics_limiter()),
            Arc::new(String::new),
            readiness(&relay),
            limits.http_header_timeout(),
        ));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).await.unwrap();
            r
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        relay.begin_shutdown();
        let r = get("/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("draining"), "{r}");
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn metrics_include_the_brokers() {
        let text = text(
            &Relay::new(quichub_relay::Config::default()),
            &Broker::new(BrokerConfig::default()),
            &AdmissionStats::default(),
        );
        assert!(text.contains("quichub_quic_handshakes 0"), "{text}");
        assert!(text.contains("quichub_sessions "), "{text}");
        assert!(
            text.contains("quichub_mqtt_messages_dropped_total{reason=\"queue_full\"} 0"),
            "{text}"
        );
    }
}
