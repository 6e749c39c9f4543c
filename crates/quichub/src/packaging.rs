//! Checks of what ships beside the binary: the license files and the
//! samples in `contrib/` (kept in step with the code by these tests).

/// The workspace's `Cargo.toml`.
const WORKSPACE_MANIFEST: &str = include_str!("../../../Cargo.toml");

#[test]
fn license_files_match_the_manifest() {
    let manifest: toml::Table = WORKSPACE_MANIFEST.parse().unwrap();
    let license = manifest["workspace"]["package"]["license"].as_str();
    assert_eq!(license, Some("MIT OR Apache-2.0"));
    let mit = include_str!("../../../LICENSE-MIT");
    assert!(
        mit.starts_with("Copyright (c) The quichub developers\n"),
        "{mit}"
    );
    assert!(mit.contains("Permission is hereby granted, free of charge, to any person"));
    assert!(mit.contains("THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND"));
    let apache = include_str!("../../../LICENSE-APACHE");
    assert!(apache.contains("Apache License\n                        Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
    let readme = include_str!("../../../README.md");
    assert!(readme.contains("(LICENSE-MIT)") && readme.contains("(LICENSE-APACHE)"));
}

const SERVICE: &str = include_str!("../../../contrib/quichub.service");
const DOCKERFILE: &str = include_str!("../../../contrib/Dockerfile");

/// The lines of a systemd unit (continuations joined), without comments.
fn unit_lines(unit: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cont = String::new();
    for line in unit.lines() {
        let line = line.trim();
        if cont.is_empty() && (line.starts_with('#') || line.starts_with(';')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                cont.push_str(part);
                cont.push(' ');
            }
            None => {
                cont.push_str(line);
                lines.push(std::mem::take(&mut cont));
            }
        }
    }
    lines
}

/// The values of `key=` in a unit, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit_lines(unit)
        .into_iter()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
        .collect()
}

/// Parses `args` (the program name first) with the real command line parser
/// and returns the relay's options.
fn relay_args(args: &[String]) -> crate::relay_cmd::RelayArgs {
    let cli = crate::Cli::try_parse_from(args)
        .unwrap_or_else(|e| panic!("quichub refuses {args:?}:\n{e}"));
    match cli.command {
        crate::Command::Relay(r) => r,
        _ => panic!("{args:?} is not `quichub relay`"),
    }
}

use clap::Parser;

#[test]
fn systemd_unit_runs_a_relay_the_cli_accepts() {
    let exec = unit_values(SERVICE, "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let mut args: Vec<String> = exec[0].split_whitespace().map(str::to_string).collect();
    assert!(args[0].ends_with("/quichub"), "{args:?}");
    args[0] = "quichub".into();
    let relay = relay_args(&args);
    assert_eq!(
        relay.config.as_deref(),
        Some(std::path::Path::new("/etc/quichub/relay.toml"))
    );
    // State in the unit's StateDirectory, given explicitly (the service's
    // user has no usable home or XDG_STATE_HOME).
    assert_eq!(unit_values(SERVICE, "StateDirectory"), ["quichub"]);
    assert_eq!(relay.data_dir.as_deref(), Some("/var/lib/quichub"));
    // The certificate and key come in as credentials (`%d/NAME`).
    let creds = unit_values(SERVICE, "LoadCredential");
    for path in [&relay.cert, &relay.key] {
        let path = path.as_ref().expect("--cert and --key").to_str().unwrap();
        let name = path.strip_prefix("%d/").expect("a credential path");
        assert!(
            creds
                .iter()
                .any(|c| c.starts_with(&format!("{name}:/etc/quichub/"))),
            "no LoadCredential={name}:... in {creds:?}"
        );
    }
    let bind = quichub_hub::resolve_addr(relay.bind.as_deref().expect("--bind")).unwrap();
    assert!(bind.port() >= 1024 && bind.ip().is_unspecified());
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("DynamicUser", "yes"),
        ("LimitNOFILE", "65536"),
        ("Restart", "on-failure"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(unit_values(SERVICE, key), [value], "{key}");
    }
    // `systemctl reload` is SIGHUP: certificate and [auth] re-read.
    assert_eq!(
        unit_values(SERVICE, "ExecReload"),
        ["/bin/kill -HUP $MAINPID"]
    );
    // Every port is unprivileged, so no capability is granted.
    assert!(unit_values(SERVICE, "AmbientCapabilities").is_empty());
    assert_eq!(unit_values(SERVICE, "WantedBy"), ["multi-user.target"]);
}

/// An instruction's JSON (exec form) argument list in a Dockerfile.
fn docker_exec_form(dockerfile: &str, instruction: &str) -> Vec<String> {
    let lines: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{instruction} ")))
        .collect();
    assert_eq!(lines.len(), 1, "one {instruction} in the Dockerfile");
    serde_json::from_str(lines[0])
        .unwrap_or_else(|e| panic!("{instruction} is not in exec form: {e}"))
}

#[test]
fn dockerfile_runs_a_relay_the_cli_accepts() {
    let mut args = docker_exec_form(DOCKERFILE, "ENTRYPOINT");
    assert_eq!(args, ["quichub"]);
    args.extend(docker_exec_form(DOCKERFILE, "CMD"));
    let relay = relay_args(&args);
    let mut c = quichub_hub::Config::default();
    relay.apply(&mut c);
    // In a container every listener must bind all interfaces...
    assert_eq!(c.quic.bind, "0.0.0.0:4443");
    let addrs = [
        &c.metrics.address,
        &c.mqtt.tcp,
        &c.mqtt.tls,
        &c.http.address,
    ];
    for addr in addrs {
        assert!(addr.starts_with("0.0.0.0:"), "{args:?}");
    }
    // ...and be exposed.
    let expose: Vec<&str> = DOCKERFILE
        .lines()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(str::split_whitespace)
        .collect();
    let mut want = vec![format!("{}/udp", c.quic.bind_addr().unwrap().port())];
    for addr in addrs {
        want.push(addr.rsplit(':').next().unwrap().to_string());
    }
    let mut have: Vec<String> = expose.iter().map(|p| p.to_string()).collect();
    want.sort();
    have.sort();
    assert_eq!(have, want, "EXPOSE");
    // The sample config the image ships, and state on the volume.
    assert_eq!(
        relay.config.as_deref(),
        Some(std::path::Path::new("/etc/quichub/relay.toml"))
    );
    assert!(DOCKERFILE.contains("COPY contrib/relay.toml /etc/quichub/relay.toml\n"));
    assert_eq!(relay.data_dir.as_deref(), Some("/var/lib/quichub"));
    assert!(DOCKERFILE.contains("VOLUME [\"/var/lib/quichub\"]\n"));
    // Two stages, the second slim; not root at run time.
    assert!(DOCKERFILE.contains("\nFROM rust:1-bookworm AS build\n"));
    assert!(DOCKERFILE.contains("\nFROM debian:bookworm-slim\n"));
    let users: Vec<&str> = DOCKERFILE
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .collect();
    assert!(
        matches!(users.as_slice(), [u] if *u != "root" && *u != "0"),
        "{users:?}"
    );
}

#[test]
fn unit_parsing_joins_continuations_and_skips_comments() {
    let unit = "# x\n[Service]\nExecStart=/bin/a \\\n    --b c \\\n    --d\nFoo=1\n";
    assert_eq!(unit_values(unit, "ExecStart"), ["/bin/a  --b c  --d"]);
    assert_eq!(unit_values(unit, "Foo"), ["1"]);
}

#[test]
fn readme_deploying_section_names_the_files() {
    let readme = include_str!("../../../README.md");
    let deploying = readme
        .split("\n## Deploying")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README has a Deploying section");
    for file in [
        "contrib/quichub.service",
        "contrib/Dockerfile",
        "contrib/relay.toml",
        "quichub completions",
    ] {
        assert!(deploying.contains(file), "README Deploying: no {file}");
    }
}
