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

/// TLS for a test etcd: its certificate, the CA that signs it and the
/// clients' certificates (`--client-cert-auth`), and the certificate the
/// harness's own client presents.
#[derive(Clone)]
pub struct EtcdTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// One etcd member on loopback.
pub struct Etcd {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    tls: Option<EtcdTlsFiles>,
    /// The user and password the harness's client authenticates as, once
    /// auth is on.
    pub root: Option<(String, String)>,
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
            tls: None,
            root: None,
        };
        e.spawn().await;
        e
    }

    /// Starts etcd serving clients over TLS only, each with a certificate
    /// signed by `tls.ca`.
    pub async fn start_tls(bin: PathBuf, tls: EtcdTlsFiles) -> Etcd {
        let mut e = Etcd {
            bin,
            dir: tempfile::tempdir().unwrap(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
            tls: Some(tls),
            root: None,
        };
        e.spawn().await;
        e
    }

    fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Turns etcd's auth on: `root` (all rights) with `root_password`, and
    /// `user` with `password` and a role that may read and write `prefix`
    /// only. The harness's client authenticates as root from now on.
    pub async fn enable_auth(
        &mut self,
        root_password: &str,
        user: &str,
        password: &str,
        prefix: &str,
    ) {
        let mut c = self.client().await.unwrap();
        c.user_add("root", root_password, None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.role_add("relays").await.unwrap();
        let range = etcd_client::Permission::read_write(prefix).with_prefix();
        c.role_grant_permission("relays", range).await.unwrap();
        c.user_add(user, password, None).await.unwrap();
        c.user_grant_role(user, "relays").await.unwrap();
        c.auth_enable().await.unwrap();
        self.root = Some(("root".into(), root_password.into()));
    }

    /// `etcd://127.0.0.1:PORT/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://127.0.0.1:{}/{prefix}", self.client_port)
    }

    /// Starts the etcd process. Its ports were picked by binding and
    /// releasing them, so another process may take one first: then etcd
    /// exits, and a first start tries again on other ports (a restart must
    /// keep its ports). The member name is this instance's own, so a probe
    /// answered by another test's etcd is not taken for this one.
    async fn spawn(&mut self) {
        let first = self.child.is_none() && !self.dir.path().join("data").exists();
        for attempt in 1.. {
            if self.try_spawn().await {
                return;
            }
            assert!(
                first && attempt < 5,
                "etcd did not start on 127.0.0.1:{} / {}",
                self.client_port,
                self.peer_port
            );
            let _ = std::fs::remove_dir_all(self.dir.path().join("data"));
            self.client_port = free_port();
            self.peer_port = free_port();
        }
    }

    /// This instance's member name.
    fn name(&self) -> String {
        let dir = self.dir.path().file_name().unwrap_or_default();
        format!("quichub-test-{}", dir.to_string_lossy())
    }

    /// Whether etcd came up, serving as this instance.
    async fn try_spawn(&mut self) -> bool {
        let client = self.client_url();
        let name = self.name();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&self.bin);
        if let Some(t) = &self.tls {
            cmd.arg(format!("--cert-file={}", t.cert.display()))
                .arg(format!("--key-file={}", t.key.display()))
                .arg(format!("--trusted-ca-file={}", t.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg(format!("--name={name}"))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={name}={peer}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        // Serving once a request goes through, as this member.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if let Ok(mut c) = self.client().await {
                match c.member_list().await {
                    Ok(m) if m.members().iter().any(|m| m.name() == name) => return true,
                    Ok(_) => {
                        // Another test's etcd on the port this one wanted.
                        self.stop();
                        return false;
                    }
                    // Where etcd's auth keeps the member list from the
                    // harness, a key read shows it serves.
                    Err(_) if c.get("probe", None).await.is_ok() => return true,
                    Err(_) => {}
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
        let mut o = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(2));
        if let Some(t) = &self.tls {
            let pem = |p: &PathBuf| std::fs::read(p).unwrap();
            o = o.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(pem(&t.ca)))
                    .identity(etcd_client::Identity::from_pem(
                        pem(&t.client_cert),
                        pem(&t.client_key),
                    )),
            );
        }
        if let Some((user, password)) = &self.root {
            o = o.with_user(user, password);
        }
        etcd_client::Client::connect([self.client_url()], Some(o)).await
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
