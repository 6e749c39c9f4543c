//! A real etcd (Debian's `etcd-server`) for the cluster tests, on loopback
//! ports with a temporary data directory.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The etcd binary: `QUICHUB_ETCD`, else `etcd` on the PATH. `None` (the
/// test is skipped, saying why) when there is none, unless
/// `QUICHUB_CLUSTER_TESTS=1` (scripts/test.sh), which makes it a failure.
pub fn etcd_binary() -> Option<PathBuf> {
    let bin = std::env::var_os("QUICHUB_ETCD")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("etcd"))
                    .find(|f| f.is_file())
            })
        });
    if bin.is_none() {
        let why = "no etcd (apt-get install etcd-server, or scripts/install-cluster-tools.sh)";
        if std::env::var("QUICHUB_CLUSTER_TESTS").as_deref() == Ok("1") {
            panic!("QUICHUB_CLUSTER_TESTS=1 but {why}");
        }
        println!("SKIPPED: {why}");
    }
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd member on loopback.
pub struct Etcd {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl Etcd {
    /// Starts etcd and waits until it serves.
    pub async fn start(bin: PathBuf) -> Etcd {
        let mut e = Etcd {
            bin,
            dir: tempfile::tempdir().unwrap(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        e.spawn().await;
        e
    }

    /// `etcd://127.0.0.1:PORT/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://127.0.0.1:{}/{prefix}", self.client_port)
    }

    async fn spawn(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.bin)
            .arg("--name=quichub-test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=quichub-test={peer}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        // Serving once a request goes through.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = self.client().await {
                if c.get("probe", None).await.is_ok() {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "etcd did not start in 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops etcd (SIGKILL: the data directory stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// A client of it.
    pub async fn client(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        let o = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(2));
        etcd_client::Client::connect([format!("http://127.0.0.1:{}", self.client_port)], Some(o))
            .await
    }

    /// Every key under `prefix`, as strings.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        let mut c = self.client().await.unwrap();
        let r = c
            .get(
                prefix,
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await
            .unwrap();
        r.kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
