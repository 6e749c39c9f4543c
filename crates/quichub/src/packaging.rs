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
