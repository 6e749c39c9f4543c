//! Third-party tools the tests drive, found or skipped the same way
//! everywhere: a missing tool skips its test (printing `SKIPPED: why`),
//! except under `scripts/test.sh`, whose environment variables
//! (`QUICHUB_MQTT_PYTHON` here) make it a failure.

/// The third-party MQTT tools, or `None` (test skipped) when they are not
/// installed and `QUICHUB_MQTT_PYTHON` is unset; with it set (as
/// `scripts/test.sh` does) a missing tool fails the test.
pub fn mqtt_tools() -> Option<std::path::PathBuf> {
    let required = std::env::var_os("QUICHUB_MQTT_PYTHON").map(std::path::PathBuf::from);
    let python = required.clone().or_else(|| {
        std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".cache/quichub/tools/py/bin/python"))
    });
    // mosquitto_passwd (Debian's mosquitto) writes the auth tests' password files.
    let have_mosquitto = ["mosquitto_pub", "mosquitto_passwd"]
        .iter()
        .all(|t| std::process::Command::new(t).arg("--help").output().is_ok());
    let py_ok = python.as_ref().is_some_and(|p| {
        std::process::Command::new(p)
            .args(["-c", "import paho.mqtt"])
            .status()
            .is_ok_and(|s| s.success())
    });
    match (&required, have_mosquitto && py_ok) {
        (_, true) => python,
        (Some(p), false) => panic!(
            "QUICHUB_MQTT_PYTHON={} is set but mosquitto_pub or paho-mqtt is missing: run scripts/install-mqtt-tools.sh",
            p.display()
        ),
        (None, false) => {
            eprintln!("SKIPPED: mosquitto clients / paho-mqtt not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// Whether `curl` with HTTP/2 is installed; `None` skips the test, except
/// where `QUICHUB_MQTT_PYTHON` is set (scripts/test.sh), where it fails.
pub fn curl_http2() -> Option<()> {
    let ok = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("HTTP2"));
    match (ok, std::env::var_os("QUICHUB_MQTT_PYTHON").is_some()) {
        (true, _) => Some(()),
        (false, true) => panic!("curl with HTTP2 is missing: run scripts/install-mqtt-tools.sh"),
        (false, false) => {
            eprintln!("SKIPPED: curl with HTTP/2 not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// Whether the `openssl` command line (the certificate tests' CA and client
/// certificates, scripts/install-mqtt-tools.sh) is installed; `None` skips
/// the test, except where `QUICHUB_MQTT_PYTHON` is set (scripts/test.sh),
/// where it fails.
pub fn openssl() -> Option<()> {
    let ok = std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    match (ok, std::env::var_os("QUICHUB_MQTT_PYTHON").is_some()) {
        (true, _) => Some(()),
        (false, true) => panic!("openssl is missing: run scripts/install-mqtt-tools.sh"),
        (false, false) => {
            eprintln!("SKIPPED: openssl not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}

/// Python with aioquic (the venv of scripts/install-mqtt-tools.sh), or `None`
/// (test skipped) when missing and `QUICHUB_MQTT_PYTHON` is unset; with it
/// set a missing aioquic fails the test.
pub fn h3_python() -> Option<std::path::PathBuf> {
    let required = std::env::var_os("QUICHUB_MQTT_PYTHON").map(std::path::PathBuf::from);
    let python = required.clone().or_else(|| {
        std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".cache/quichub/tools/py/bin/python"))
    })?;
    let ok = std::process::Command::new(&python)
        .args(["-c", "import aioquic.h3.connection"])
        .status()
        .is_ok_and(|s| s.success());
    match (ok, required.is_some()) {
        (true, _) => Some(python),
        (false, true) => panic!(
            "QUICHUB_MQTT_PYTHON={} is set but aioquic is missing: run scripts/install-mqtt-tools.sh",
            python.display()
        ),
        (false, false) => {
            eprintln!("SKIPPED: aioquic not installed (scripts/install-mqtt-tools.sh)");
            None
        }
    }
}
