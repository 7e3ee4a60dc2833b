//! The replicas of a chaos run: `keel run --role <role>` child processes, each with its
//! own log file, that the fault schedule kills with SIGKILL and restarts; and the
//! resource sampler (RSS and CPU time per role from `/proc`, PostgreSQL's connections
//! and CPU time).

use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};

/// One replica: its role, name, the running incarnation, and what it has used.
pub(super) struct Replica {
    pub(super) role: &'static str,
    pub(super) name: String,
    /// The api replica's listen port (fixed across restarts).
    pub(super) api_port: Option<u16>,
    child: Option<Child>,
    log: PathBuf,
    /// Incarnations started (1 + restarts).
    pub(super) starts: u32,
    /// CPU ticks of the incarnations that ended (their last sample).
    ticks_done: u64,
    /// CPU ticks of the running incarnation at its last sample.
    ticks_now: u64,
    /// The largest resident set seen, KiB.
    pub(super) rss_peak_kib: u64,
    rss_sum_kib: u64,
    rss_samples: u64,
}

impl Replica {
    /// Mean resident set over the samples, KiB.
    pub(super) fn rss_mean_kib(&self) -> u64 {
        self.rss_sum_kib.checked_div(self.rss_samples).unwrap_or(0)
    }

    /// CPU time used by every incarnation, in clock ticks (`sysconf(_SC_CLK_TCK)`,
    /// 100 per second on Linux).
    pub(super) fn cpu_ticks(&self) -> u64 {
        self.ticks_done + self.ticks_now
    }
}

/// Every replica of the run, started from the same executable and environment.
pub(super) struct Fleet {
    exe: PathBuf,
    env: Vec<(String, String)>,
    pub(super) replicas: Vec<Replica>,
}

impl Fleet {
    /// A fleet of `sizes` replicas per role (api, runner, indexer), none started yet;
    /// the api replicas listen on `api_ports`.
    pub(super) fn new(
        env: Vec<(String, String)>,
        logs: &Path,
        sizes: [(&'static str, usize); 3],
        api_ports: &[u16],
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the keel binary")?;
        let mut replicas = Vec::new();
        for (role, n) in sizes {
            for i in 0..n {
                let name = format!("{role}-{i}");
                replicas.push(Replica {
                    role,
                    log: logs.join(format!("{name}.log")),
                    name,
                    api_port: (role == "api").then(|| api_ports.get(i).copied()).flatten(),
                    child: None,
                    starts: 0,
                    ticks_done: 0,
                    ticks_now: 0,
                    rss_peak_kib: 0,
                    rss_sum_kib: 0,
                    rss_samples: 0,
                });
            }
        }
        Ok(Self { exe, env, replicas })
    }

    /// Starts replica `i` (a new incarnation; its output appended to its log).
    pub(super) fn start(&mut self, i: usize) -> anyhow::Result<()> {
        let exe = self.exe.clone();
        let env = self.env.clone();
        let r = self.replicas.get_mut(i).context("no such replica")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .with_context(|| format!("opening {}", r.log.display()))?;
        let err = log.try_clone().context("duplicating the log handle")?;
        let mut cmd = Command::new(exe);
        cmd.args(["run", "--role", r.role, "--termination-grace-seconds", "5"])
            .envs(env)
            .env("KEEL__CLUSTER__HOST", &r.name)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        if let Some(port) = r.api_port {
            cmd.env("KEEL__API__LISTENADDRESS", format!("127.0.0.1:{port}"));
        }
        r.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting {}", r.name))?,
        );
        r.starts += 1;
        r.ticks_done += r.ticks_now;
        r.ticks_now = 0;
        Ok(())
    }

    /// Starts every replica that is not running.
    pub(super) fn start_missing(&mut self) -> anyhow::Result<()> {
        for i in 0..self.replicas.len() {
            if !self.running(i) {
                self.start(i)?;
            }
        }
        Ok(())
    }

    /// Whether replica `i`'s incarnation is alive.
    pub(super) fn running(&mut self, i: usize) -> bool {
        match self.replicas.get_mut(i).and_then(|r| r.child.as_mut()) {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends SIGKILL to replica `i` and reaps it.
    pub(super) async fn kill9(&mut self, i: usize) {
        self.sample_one(i);
        if let Some(r) = self.replicas.get_mut(i)
            && let Some(mut child) = r.child.take()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Replicas that exited without being killed (name, exit status).
    pub(super) fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for r in &mut self.replicas {
            if let Some(child) = r.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                out.push((r.name.clone(), status.to_string()));
                r.child = None;
            }
        }
        out
    }

    /// SIGTERM to every replica, then waits up to `grace` for each (SIGKILL after).
    pub(super) async fn stop(&mut self, grace: Duration) {
        self.sample();
        for r in &self.replicas {
            if let Some(pid) = r.child.as_ref().and_then(Child::id) {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
        }
        for r in &mut self.replicas {
            if let Some(mut child) = r.child.take()
                && tokio::time::timeout(grace, child.wait()).await.is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }

    fn sample_one(&mut self, i: usize) {
        let Some(r) = self.replicas.get_mut(i) else {
            return;
        };
        let Some(pid) = r.child.as_ref().and_then(Child::id) else {
            return;
        };
        if let Some(ticks) = proc_cpu_ticks(pid) {
            r.ticks_now = ticks;
        }
        if let Some(rss) = proc_rss_kib(pid) {
            r.rss_peak_kib = r.rss_peak_kib.max(rss);
            r.rss_sum_kib += rss;
            r.rss_samples += 1;
        }
    }

    /// Samples every running replica's RSS and CPU time.
    pub(super) fn sample(&mut self) {
        for i in 0..self.replicas.len() {
            self.sample_one(i);
        }
    }

    /// Per role: (replicas, restarts, peak RSS KiB, mean RSS KiB of one replica, CPU
    /// seconds of all replicas).
    pub(super) fn by_role(&self) -> BTreeMap<&'static str, RoleUse> {
        let mut out: BTreeMap<&'static str, RoleUse> = BTreeMap::new();
        for r in &self.replicas {
            let e = out.entry(r.role).or_default();
            e.replicas += 1;
            e.restarts += u64::from(r.starts.saturating_sub(1));
            e.rss_peak_kib = e.rss_peak_kib.max(r.rss_peak_kib);
            e.rss_mean_sum_kib += r.rss_mean_kib();
            e.cpu_ticks += r.cpu_ticks();
        }
        out
    }
}

/// What one role's replicas used.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RoleUse {
    pub(super) replicas: u64,
    pub(super) restarts: u64,
    pub(super) rss_peak_kib: u64,
    /// Sum over the replicas of each one's mean RSS, KiB.
    pub(super) rss_mean_sum_kib: u64,
    pub(super) cpu_ticks: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat` (Linux's USER_HZ).
pub(super) const TICKS_PER_SECOND: u64 = 100;

/// utime + stime of `pid` in clock ticks (fields 14 and 15 of `/proc/<pid>/stat`,
/// counted after the parenthesised command name).
pub(super) fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS of `pid`, KiB (`/proc/<pid>/status`).
pub(super) fn proc_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU ticks of the PostgreSQL server: every live `postgres` process's own time plus
/// the time of the backends it has reaped (the postmaster's cutime + cstime) — the whole
/// server, not only this run's database. A restart starts the count again
/// ([`MonotonicTicks`] carries it over).
pub(super) fn postgres_cpu_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == "postgres")
                .unwrap_or(false)
        })
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = stat.rsplit_once(')')?.1.to_owned();
            let f: Vec<u64> = after
                .split_whitespace()
                .skip(11)
                .take(4)
                .filter_map(|v| v.parse().ok())
                .collect();
            Some(f.iter().sum::<u64>())
        })
        .sum()
}

/// A counter read from a source that restarts from zero (a restarted server): each
/// drop is taken as a restart and the last value before it is kept.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct MonotonicTicks {
    first: Option<u64>,
    carried: u64,
    last: u64,
}

impl MonotonicTicks {
    /// Records a reading.
    pub(super) fn observe(&mut self, v: u64) {
        if self.first.is_none() {
            self.first = Some(v);
        }
        if v < self.last {
            self.carried += self.last;
        }
        self.last = v;
    }

    /// Ticks since the first reading.
    pub(super) fn total(&self) -> u64 {
        (self.carried + self.last).saturating_sub(self.first.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart of the source (a drop) keeps what was counted before it.
    #[test]
    fn ticks_carry_over_a_restart() {
        let mut t = MonotonicTicks::default();
        t.observe(100);
        t.observe(150);
        assert_eq!(t.total(), 50);
        t.observe(10);
        assert_eq!(t.total(), 60);
        t.observe(40);
        assert_eq!(t.total(), 90);
    }

    /// This process's own CPU time and resident set read from /proc.
    #[test]
    fn reads_this_process_from_proc() {
        let pid = std::process::id();
        assert!(proc_rss_kib(pid).is_some_and(|kib| kib > 0));
        assert!(proc_cpu_ticks(pid).is_some());
        assert!(proc_rss_kib(u32::MAX).is_none());
    }
}
