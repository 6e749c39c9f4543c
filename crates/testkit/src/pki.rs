//! A test PKI made by the `openssl` command line: a CA and the
//! certificates it signs, as PEM files (`NAME.pem`, `NAME.key`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA in a directory, and the leaves it signed there.
pub struct Pki {
    dir: PathBuf,
    /// The directory is the PKI's own, removed when dropped.
    owned: bool,
}

impl Pki {
    /// A CA (`ca.pem`, `ca.key`) in a temporary directory of its own.
    pub fn temp(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("quichub-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Pki::ca(dir, true)
    }

    /// A CA in `dir`, which stays when the PKI is dropped.
    pub fn ca_in(dir: &Path) -> Pki {
        Pki::ca(dir.to_path_buf(), false)
    }

    fn ca(dir: PathBuf, owned: bool) -> Pki {
        let pki = Pki { dir, owned };
        pki.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=quichub test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        pki
    }

    /// `server.pem`/`server.key` for `localhost` and 127.0.0.1.
    pub fn server(&self) -> &Self {
        self.leaf(
            "server",
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
    }

    /// `NAME.pem` and `NAME.key` for `subject`, with the x509v3
    /// extensions `ext`, signed by the CA.
    pub fn leaf(&self, name: &str, subject: &str, ext: &str) -> &Self {
        let ext_file = format!("{name}.ext");
        std::fs::write(self.path(&ext_file), ext).unwrap();
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &ext_file,
        ]);
        self
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A file of the PKI.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// [`Pki::path`] as a string, for command lines.
    pub fn s(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
