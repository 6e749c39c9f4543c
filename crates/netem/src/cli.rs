//! The `quichub-lab netem` command line: `run`, `up`, `down` and `profiles`.

use std::ffi::OsString;

use crate::profile::{Direction, Profile, ProfileError, PROFILE_NAMES};

/// `quichub-lab netem`: a packet-level link emulator between two network
/// namespaces.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Emulate a network link (delay, jitter, loss, burst loss, rate, queue, duplication) between two network namespaces",
    long_about = "Emulate a network link between two network namespaces joined through TUN devices.\n\nThe client side is 10.201.0.1 and the server side 10.201.0.2; every IP packet between them crosses the emulator, so TCP and UDP (QUIC) see the same link. Needs root, or an unprivileged user namespace where the kernel allows it."
)]
pub struct NetemArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: NetemCommand,
}

/// Subcommands of `quichub-lab netem`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum NetemCommand {
    /// Run CMD in the client namespace with the server namespace reachable at 10.201.0.2
    Run(RunArgs),
    /// Bring the emulated link up and keep it up until Ctrl-C, SIGTERM or `quichub-lab netem down`
    Up(UpArgs),
    /// Stop running `quichub-lab netem up` instances and remove leftover namespaces
    Down(DownArgs),
    /// List the named profiles with their numbers and sources
    Profiles,
}

/// Link parameters: a named profile and/or custom values.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LinkArgs {
    /// Named profile: nb-iot, 5g, lte, wifi, satellite, lossy-N (N% random loss), none; flags below override it
    #[arg(long, short = 'p', value_name = "NAME")]
    pub profile: Option<String>,
    /// Round-trip time, split evenly between the directions (e.g. 50ms)
    #[arg(long, value_name = "DURATION")]
    pub rtt: Option<String>,
    /// One-way delay in each direction (e.g. 25ms)
    #[arg(long, value_name = "DURATION")]
    pub delay: Option<String>,
    /// Jitter: each packet's delay is uniform in delay ± JITTER
    #[arg(long, value_name = "DURATION")]
    pub jitter: Option<String>,
    /// Let jitter reorder packets (by default packets stay in order)
    #[arg(long)]
    pub reorder: bool,
    /// Independent random loss in each direction (e.g. 1 or 0.5%)
    #[arg(long, value_name = "PERCENT")]
    pub loss: Option<String>,
    /// Gilbert-Elliott burst loss in percent: `P,R[,LOSS_BAD[,LOSS_GOOD]]` (mean burst 100/R packets)
    #[arg(long, value_name = "P,R[,BAD[,GOOD]]")]
    pub gilbert: Option<String>,
    /// Rate limit in each direction, tc's units: 10mbit, 159kbit (bits/s);
    /// 2mbps, 2MBps (bytes/s, as tc)
    #[arg(long, value_name = "RATE")]
    pub rate: Option<String>,
    /// Drop-tail queue before the rate limiter, in bytes or time (e.g. 64kb, 50ms)
    #[arg(long, value_name = "SIZE|DURATION")]
    pub queue: Option<String>,
    /// Duplicate this percentage of packets
    #[arg(long, value_name = "PERCENT")]
    pub duplicate: Option<String>,
    /// Client->server overrides, KEY=VALUE list (keys: delay jitter reorder loss gilbert rate queue duplicate)
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub uplink: Vec<String>,
    /// Server->client overrides, KEY=VALUE list (same keys as --uplink)
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub downlink: Vec<String>,
    /// Seed of the random decisions (same seed and traffic, same drops)
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl LinkArgs {
    /// Builds the profile: the named one (or an unimpaired link), then the
    /// flags, then `--uplink` / `--downlink`.
    pub fn to_profile(&self) -> Result<Profile, ProfileError> {
        let mut p = match &self.profile {
            Some(name) => Profile::named(name)?,
            None => {
                let mut p = Profile::unimpaired();
                p.name = "custom".into();
                p.source = "custom values from flags".into();
                p
            }
        };
        let both = [
            ("rtt", &self.rtt),
            ("delay", &self.delay),
            ("jitter", &self.jitter),
            ("loss", &self.loss),
            ("gilbert", &self.gilbert),
            ("rate", &self.rate),
            ("queue", &self.queue),
            ("duplicate", &self.duplicate),
        ];
        for (key, value) in both {
            if let Some(v) = value {
                p.set(Direction::Both, key, v)?;
            }
        }
        if self.reorder {
            p.set(Direction::Both, "reorder", "on")?;
        }
        for spec in &self.uplink {
            p.set_spec(Direction::Up, spec)?;
        }
        for spec in &self.downlink {
            p.set_spec(Direction::Down, spec)?;
        }
        Ok(p)
    }
}

/// `quichub-lab netem run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Link parameters.
    #[command(flatten)]
    pub link: LinkArgs,
    /// Shell command (run with sh -c) started in the server namespace before CMD and stopped after it
    #[arg(long, value_name = "SHELL-COMMAND")]
    pub server: Option<String>,
    /// Time given to the --server command to start before CMD runs
    #[arg(long, value_name = "DURATION", default_value = "500ms")]
    pub server_startup: String,
    /// Print per-direction packet counters when done
    #[arg(long)]
    pub stats: bool,
    /// Command to run in the client namespace (after --)
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// `quichub-lab netem up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Link parameters.
    #[command(flatten)]
    pub link: LinkArgs,
    /// Print per-direction packet counters when stopped
    #[arg(long)]
    pub stats: bool,
}

/// `quichub-lab netem down`.
#[derive(Debug, Clone, clap::Args)]
pub struct DownArgs {
    /// Only the instance with this process id (default: all)
    #[arg(long)]
    pub pid: Option<u32>,
}

/// Runs `quichub-lab netem`; returns the process exit code (for `run`, the
/// command's: its exit status, or 128 + the signal that killed it).
pub fn main(args: NetemArgs) -> anyhow::Result<i32> {
    match args.command {
        NetemCommand::Profiles => {
            print_profiles();
            Ok(0)
        }
        #[cfg(target_os = "linux")]
        NetemCommand::Run(a) => linux::run(a),
        #[cfg(target_os = "linux")]
        NetemCommand::Up(a) => linux::up(a),
        #[cfg(target_os = "linux")]
        NetemCommand::Down(a) => linux::down(a),
        #[cfg(not(target_os = "linux"))]
        _ => anyhow::bail!("quichub-lab netem needs Linux (network namespaces and TUN devices)"),
    }
}

fn print_profiles() {
    println!("Named profiles (up = client->server, down = server->client); lossy-N takes any N in (0, 100]:\n");
    for p in Profile::all_named() {
        println!("{}\n", p.describe());
    }
    println!("Names: {}", PROFILE_NAMES.join(", "));
}

/// Exit code of a finished child: its status, or 128 + the signal number.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

/// Waits for `child` while SIGINT and SIGQUIT are ignored (they reach the
/// child, which shares the terminal) and SIGTERM / SIGHUP are forwarded to
/// it (SIGKILL after 5 s).
pub fn wait_forwarding_signals(
    child: &mut std::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    #[cfg(target_os = "linux")]
    {
        linux::wait_forwarding_signals(child)
    }
    #[cfg(not(target_os = "linux"))]
    {
        child.wait()
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::BTreeMap;
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::{bail, Context};

    use super::{exit_code, DownArgs, RunArgs, UpArgs};
    use crate::emulator::{Emulator, EmulatorConfig, EmulatorStats, CLIENT_ADDR, SERVER_ADDR};
    use crate::privileges;
    use crate::profile::Profile;
    use crate::sys;
    use crate::units::parse_duration;

    static SIGNAL: AtomicI32 = AtomicI32::new(0);

    extern "C" fn on_signal(sig: libc::c_int) {
        SIGNAL.store(sig, Ordering::SeqCst);
    }

    /// Installs handlers; restores the previous ones when dropped.
    struct Signals {
        old: Vec<(libc::c_int, libc::sigaction)>,
    }

    impl Signals {
        fn install(catch: &[libc::c_int], ignore: &[libc::c_int]) -> Signals {
            SIGNAL.store(0, Ordering::SeqCst);
            let mut old = Vec::new();
            let handler: extern "C" fn(libc::c_int) = on_signal;
            for (&sig, ign) in catch
                .iter()
                .map(|s| (s, false))
                .chain(ignore.iter().map(|s| (s, true)))
            {
                // SAFETY: sigaction is plain data; zeroed is a valid start.
                let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
                sa.sa_sigaction = if ign { libc::SIG_IGN } else { handler as usize };
                // SAFETY: valid pointers; the handler only stores an atomic.
                unsafe {
                    libc::sigemptyset(&mut sa.sa_mask);
                    let mut prev: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &sa, &mut prev) == 0 {
                        old.push((sig, prev));
                    }
                }
            }
            Signals { old }
        }

        fn received(&self) -> i32 {
            SIGNAL.load(Ordering::SeqCst)
        }
    }

    impl Drop for Signals {
        fn drop(&mut self) {
            for (sig, prev) in self.old.drain(..) {
                // SAFETY: restores a disposition returned by sigaction.
                unsafe { libc::sigaction(sig, &prev, std::ptr::null_mut()) };
            }
        }
    }

    fn kill(pid: i32, sig: libc::c_int) {
        // SAFETY: plain syscall.
        unsafe { libc::kill(pid, sig) };
    }

    pub(super) fn wait_forwarding_signals(child: &mut Child) -> std::io::Result<ExitStatus> {
        let signals = Signals::install(
            &[libc::SIGTERM, libc::SIGHUP],
            &[libc::SIGINT, libc::SIGQUIT],
        );
        let mut term_sent: Option<Instant> = None;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            let sig = signals.received();
            if sig != 0 && term_sent.is_none() {
                kill(child.id() as i32, libc::SIGTERM);
                term_sent = Some(Instant::now());
            }
            if term_sent.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
                let _ = child.kill();
                return child.wait();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `Ok(Some(code))` when the work was done by a copy re-executed in a
    /// user namespace; `Ok(None)` when this process may go on.
    fn ensure_privileges() -> anyhow::Result<Option<i32>> {
        let Some(reason) = privileges::missing() else {
            return Ok(None);
        };
        if !privileges::in_our_user_namespace()
            && !privileges::has_capabilities()
            && privileges::user_namespace_blocker().is_none()
        {
            tracing::info!("netem: {reason}; re-executing in an unprivileged user namespace");
            return match privileges::run_in_user_namespace() {
                Ok(code) => Ok(Some(code)),
                Err(e) => bail!(privileges::explain(&format!(
                    "{reason}, and entering an unprivileged user namespace failed: {e}"
                ))),
            };
        }
        bail!(privileges::explain(&reason))
    }

    /// Entries `qh-cli-<id>` / `qh-srv-<id>` under /run/netns, by owner pid.
    fn named_instances() -> BTreeMap<i32, Vec<String>> {
        let mut out: BTreeMap<i32, Vec<String>> = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir("/run/netns") else {
            return out;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name
                .strip_prefix("qh-cli-")
                .or_else(|| name.strip_prefix("qh-srv-"))
            else {
                continue;
            };
            let pid_txt = id.split('-').next().unwrap_or("");
            if let Ok(pid) = pid_txt.parse::<i32>() {
                out.entry(pid).or_default().push(name);
            }
        }
        out
    }

    /// Whether process `pid` holds the namespace mounted at /run/netns/`name`
    /// (guards against a recycled pid).
    fn owns_namespace(pid: i32, name: &str) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::metadata(format!("/run/netns/{name}")) else {
            return false;
        };
        let want = format!("net:[{}]", meta.ino());
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|l| l.to_string_lossy() == want)
                .unwrap_or(false)
        })
    }

    /// Removes namespaces left behind by instances that no longer run.
    fn remove_stale() -> usize {
        let mut removed = 0;
        for (pid, names) in named_instances() {
            if sys::pid_alive(pid) && names.iter().any(|n| owns_namespace(pid, n)) {
                continue;
            }
            for n in names {
                if sys::unmount_named_netns(&n).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    fn start(profile: Profile, seed: u64) -> anyhow::Result<Emulator> {
        let named = !privileges::in_our_user_namespace();
        if named {
            let n = remove_stale();
            if n > 0 {
                tracing::info!("netem: removed {n} stale namespace(s)");
            }
        }
        let mut cfg = EmulatorConfig::new(profile);
        cfg.seed = seed;
        cfg.named = named;
        match Emulator::start(cfg.clone()) {
            Ok(e) => Ok(e),
            Err(crate::emulator::EmulatorError::Sys(e))
                if named && e.step.contains("/run/netns") =>
            {
                eprintln!(
                    "netem: cannot name the namespaces ({e}); continuing with anonymous ones"
                );
                cfg.named = false;
                Emulator::start(cfg).context("starting the emulator")
            }
            Err(e) => Err(e).context("starting the emulator"),
        }
    }

    fn enter_hint(ns: &crate::emulator::Namespace) -> String {
        if ns.is_named() {
            format!("ip netns exec {} CMD", ns.name())
        } else if privileges::in_our_user_namespace() {
            format!(
                "nsenter --preserve-credentials --user=/proc/{pid}/ns/user --net={} CMD",
                ns.path().display(),
                pid = std::process::id()
            )
        } else {
            format!("nsenter --net={} CMD", ns.path().display())
        }
    }

    fn banner(emu: &Emulator) {
        eprintln!(
            "netem: {}",
            emu.profile().describe().replace('\n', "\nnetem: ")
        );
        for (role, ns) in [("client", emu.client()), ("server", emu.server())] {
            eprintln!(
                "netem: {role} {} in namespace {} (enter: {})",
                ns.addr(),
                ns.name(),
                enter_hint(ns)
            );
        }
    }

    fn print_stats(s: &EmulatorStats) {
        for (dir, d) in [("up  ", &s.up), ("down", &s.down)] {
            let l = &d.link;
            eprintln!(
                "netem: {dir} packets {} bytes {} | lost random {} burst {} | queue drops {} | duplicated {} | delivered {} written {} | overflow {} write errors {}",
                l.packets, l.bytes, l.lost_random, l.lost_burst, l.dropped_queue, l.duplicated, l.delivered, d.written, d.overflow, d.write_errors
            );
        }
    }

    fn env_for(emu: &Emulator) -> Vec<(String, String)> {
        vec![
            ("QUICHUB_NETEM_CLIENT_ADDR".into(), CLIENT_ADDR.to_string()),
            ("QUICHUB_NETEM_SERVER_ADDR".into(), SERVER_ADDR.to_string()),
            (
                "QUICHUB_NETEM_CLIENT_NETNS".into(),
                emu.client().path().display().to_string(),
            ),
            (
                "QUICHUB_NETEM_SERVER_NETNS".into(),
                emu.server().path().display().to_string(),
            ),
            ("QUICHUB_NETEM_PROFILE".into(), emu.profile().name.clone()),
        ]
    }

    /// Makes a spawned child die with SIGTERM when this thread exits.
    fn die_with_parent(cmd: &mut Command, own_group: bool) {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGTERM as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                if own_group {
                    libc::setpgid(0, 0);
                }
                Ok(())
            });
        }
    }

    /// Stops a process group started with `die_with_parent(.., true)`.
    fn stop_group(child: &mut Child) {
        let pid = child.id() as i32;
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        kill(-pid, libc::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if child.try_wait().ok().flatten().is_some() {
                kill(-pid, libc::SIGKILL); // leftovers of the group
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill(-pid, libc::SIGKILL);
        let _ = child.wait();
    }

    pub(super) fn run(args: RunArgs) -> anyhow::Result<i32> {
        let profile = args.link.to_profile()?;
        let startup = parse_duration(&args.server_startup)?;
        let Some((program, rest)) = args.command.split_first() else {
            bail!("no command given: quichub-lab netem run [OPTIONS] -- CMD [ARGS...]");
        };
        if let Some(code) = ensure_privileges()? {
            return Ok(code);
        }
        let emu = start(profile, args.link.seed)?;
        banner(&emu);
        let env = env_for(&emu);
        let mut server = match &args.server {
            Some(s) => {
                let mut cmd = emu.server().command("sh");
                cmd.arg("-c")
                    .arg(s)
                    .envs(env.iter().cloned())
                    .stdin(Stdio::null());
                die_with_parent(&mut cmd, true);
                let child = cmd
                    .spawn()
                    .with_context(|| format!("starting the server command {s:?}"))?;
                std::thread::sleep(startup);
                Some(child)
            }
            None => None,
        };
        let mut cmd = emu.client().command(program);
        cmd.args(rest).envs(env.iter().cloned());
        die_with_parent(&mut cmd, false);
        let spawned = cmd
            .spawn()
            .with_context(|| format!("starting {:?} in the client namespace", program));
        let status = match spawned {
            Ok(mut child) => wait_forwarding_signals(&mut child).context("waiting for the command"),
            Err(e) => Err(e),
        };
        if let Some(s) = server.as_mut() {
            stop_group(s);
        }
        let stats = emu.shutdown();
        if args.stats {
            print_stats(&stats);
        }
        Ok(exit_code(status?))
    }

    pub(super) fn up(args: UpArgs) -> anyhow::Result<i32> {
        let profile = args.link.to_profile()?;
        if let Some(code) = ensure_privileges()? {
            return Ok(code);
        }
        let emu = start(profile, args.link.seed)?;
        banner(&emu);
        eprintln!(
            "netem: link up (pid {}); Ctrl-C, SIGTERM or `quichub-lab netem down` stops it",
            std::process::id()
        );
        let signals = Signals::install(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP], &[]);
        while signals.received() == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(signals);
        let stats = emu.shutdown();
        if args.stats {
            print_stats(&stats);
        }
        eprintln!("netem: link down");
        Ok(0)
    }

    pub(super) fn down(args: DownArgs) -> anyhow::Result<i32> {
        let instances = named_instances();
        let wanted: Vec<(i32, Vec<String>)> = instances
            .into_iter()
            .filter(|(pid, _)| args.pid.is_none_or(|p| p as i32 == *pid))
            .collect();
        if wanted.is_empty() {
            eprintln!("netem: no emulator namespaces under /run/netns; nothing to stop");
            return Ok(0);
        }
        for (pid, names) in &wanted {
            if sys::pid_alive(*pid) && names.iter().any(|n| owns_namespace(*pid, n)) {
                eprintln!("netem: stopping instance {pid}");
                kill(*pid, libc::SIGTERM);
                let t = Instant::now();
                while sys::pid_alive(*pid) && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if sys::pid_alive(*pid) {
                    eprintln!("netem: instance {pid} did not stop within 5 s");
                }
            }
            for n in names {
                let path = std::path::Path::new("/run/netns").join(n);
                if path.exists() && (!sys::pid_alive(*pid) || !owns_namespace(*pid, n)) {
                    match sys::unmount_named_netns(n) {
                        Ok(()) => eprintln!("netem: removed /run/netns/{n}"),
                        Err(e) => eprintln!("netem: {e}"),
                    }
                }
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: NetemArgs,
    }

    fn parse(args: &[&str]) -> NetemArgs {
        Cli::try_parse_from(std::iter::once("netem").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn run_parses_profile_overrides_and_command() {
        let a = parse(&[
            "run",
            "--profile",
            "lte",
            "--loss",
            "2",
            "--uplink",
            "rate=1mbit",
            "--server",
            "echo hi",
            "--",
            "ping",
            "-c",
            "1",
            "10.201.0.2",
        ]);
        let NetemCommand::Run(r) = a.command else {
            panic!("not run")
        };
        assert_eq!(r.command, ["ping", "-c", "1", "10.201.0.2"]);
        assert_eq!(r.server.as_deref(), Some("echo hi"));
        let p = r.link.to_profile().unwrap();
        assert_eq!(p.up.loss, 0.02);
        assert_eq!(p.up.rate_bps, Some(1_000_000));
        assert_eq!(p.down.rate_bps, Some(16_900_000));
    }

    #[test]
    fn custom_values_without_profile() {
        let a = parse(&[
            "up",
            "--rtt",
            "100ms",
            "--rate",
            "5mbit",
            "--queue",
            "50ms",
            "--reorder",
            "--jitter",
            "5ms",
        ]);
        let NetemCommand::Up(u) = a.command else {
            panic!("not up")
        };
        let p = u.link.to_profile().unwrap();
        assert_eq!(p.name, "custom");
        assert_eq!(p.rtt(), std::time::Duration::from_millis(100));
        assert!(p.up.reorder && p.down.reorder);
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for bad in [
            vec!["--profile", "dialup"],
            vec!["--loss", "150"],
            vec!["--rate", "fast"],
            vec!["--rate", "5m"],
            vec!["--rate", "5Mbps"],
            vec!["--uplink", "colour=blue"],
            vec!["--gilbert", "1"],
        ] {
            let mut args = vec!["up"];
            args.extend(bad.iter().copied());
            let NetemCommand::Up(u) = parse(&args).command else {
                panic!()
            };
            assert!(u.link.to_profile().is_err(), "{bad:?}");
        }
        assert!(Cli::try_parse_from(["netem", "run", "--profile", "lte"]).is_err());
    }

    #[test]
    fn profiles_subcommand_runs() {
        assert_eq!(main(parse(&["profiles"])).unwrap(), 0);
    }
}
