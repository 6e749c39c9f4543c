//! An HTTP/3 client from outside the project: aioquic, driven through
//! `py/h3_client.py`, which prints one JSON line per event.

use crate::within;

/// A run of `py/h3_client.py` (aioquic): its JSON lines as they come.
pub struct H3Client {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl H3Client {
    /// Starts the client against UDP `port` of 127.0.0.1 with `spec` (see the
    /// script) and extra arguments (`--ticket FILE`, `--zero-rtt`).
    pub async fn start(
        python: &std::path::Path,
        port: u16,
        spec: serde_json::Value,
        args: &[&str],
    ) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/h3_client.py");
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .args(["--port", &port.to_string()])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("h3_client.py");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(spec.to_string().as_bytes()).await.unwrap();
        drop(stdin);
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// Waits until response `i`'s headers have arrived.
    pub async fn ready(&mut self, i: u64) {
        within(15, async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("h3_client ended early");
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v["ready"] == i {
                    return;
                }
            }
        })
        .await
    }

    /// The final result: `{"early_data_accepted", "responses": [...]}`.
    pub async fn result(mut self) -> serde_json::Value {
        let v = within(30, async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v.get("responses").is_some() {
                    return v;
                }
            }
            panic!("h3_client ended without a result")
        })
        .await;
        let status = within(10, self.child.wait()).await.unwrap();
        assert!(status.success(), "h3_client exited with {status}");
        v
    }
}

/// One exchange's response from [`H3Client::result`].
pub fn h3_body(r: &serde_json::Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(r["body_b64"].as_str().unwrap())
        .unwrap()
}
