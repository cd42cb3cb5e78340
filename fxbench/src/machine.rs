//! A description of the machine a benchmark ran on, recorded beside the
//! results so numbers from different machines are never mistaken for each
//! other. Linux only: everything is read from `/proc`.

use std::fs;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The machine and the moment of a run. Fields that could not be read are
/// `None` (`null` in JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    pub hostname: Option<String>,
    /// The kernel release, as `uname -r` prints it.
    pub kernel: Option<String>,
    pub arch: &'static str,
    /// The first CPU's model name from `/proc/cpuinfo`.
    pub cpu_model: Option<String>,
    /// Logical CPUs the machine has.
    pub logical_cpus: Option<usize>,
    /// Logical CPUs this process may run on (affinity and cgroup limits).
    pub available_cpus: Option<usize>,
    /// Total memory, in bytes.
    pub memory_bytes: Option<u64>,
    /// When the description was taken, in UTC, RFC 3339.
    pub date: String,
}

impl Machine {
    /// Describes this machine, now.
    pub fn describe() -> Self {
        let read = |path: &str| fs::read_to_string(path).ok();
        let line = |path: &str| read(path).map(|s| s.trim().to_owned());
        let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Machine {
            hostname: line("/proc/sys/kernel/hostname"),
            kernel: line("/proc/sys/kernel/osrelease"),
            arch: std::env::consts::ARCH,
            cpu_model: cpu_model(&cpuinfo),
            logical_cpus: Some(cpu_count(&cpuinfo)).filter(|&n| n > 0),
            available_cpus: std::thread::available_parallelism().ok().map(usize::from),
            memory_bytes: read("/proc/meminfo").as_deref().and_then(mem_total),
            date: rfc3339_utc(now),
        }
    }
}

/// The value of the first `model name` line of `/proc/cpuinfo` (x86), or of
/// the first `Processor`/`cpu model` line on architectures that name it so.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Processor", "cpu model"]
        .iter()
        .find_map(|key| field(cpuinfo, key))
        .map(str::to_owned)
}

/// The number of `processor` entries in `/proc/cpuinfo`.
fn cpu_count(cpuinfo: &str) -> usize {
    cpuinfo
        .lines()
        .filter(|l| l.split(':').next().map(str::trim) == Some("processor"))
        .count()
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    kib_field(meminfo, "MemTotal")?.checked_mul(1024)
}

/// The value of a `key: N kB` line (as in `/proc/meminfo` and
/// `/proc/*/smaps_rollup`), in KiB.
pub(crate) fn kib_field(text: &str, key: &str) -> Option<u64> {
    field(text, key)?.strip_suffix("kB")?.trim().parse().ok()
}

/// The value of the first `key: value` line whose key is `key`.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key)
            .then(|| v.trim())
            .filter(|v| !v.is_empty())
    })
}

/// Seconds since the Unix epoch as an RFC 3339 UTC time,
/// `2024-02-29T23:59:59Z`.
pub fn rfc3339_utc(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01, by Howard
/// Hinnant's `civil_from_days` (eras of 400 years starting in March, so the
/// leap day falls at the end of a year).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_234_567_890), "2009-02-13T23:31:30Z");
        assert_eq!(rfc3339_utc(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339_utc(4_102_444_800), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn every_day_follows_the_one_before() {
        let mut prev = civil_from_days(0);
        for day in 1..200_000 {
            let (y, m, d) = civil_from_days(day);
            let next_day = (y, m, d) == (prev.0, prev.1, prev.2 + 1);
            let next_month = (y, m, d) == (prev.0, prev.1 + 1, 1);
            let next_year = (y, m, d) == (prev.0 + 1, 1, 1) && prev.1 == 12;
            assert!(
                next_day || next_month || next_year,
                "{prev:?} -> {y}-{m}-{d}"
            );
            prev = (y, m, d);
        }
    }

    const CPUINFO: &str =
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\n\
                           processor\t: 1\nmodel name\t: AMD EPYC 7B13\n\n";

    #[test]
    fn cpuinfo_gives_model_and_count() {
        assert_eq!(cpu_model(CPUINFO).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_count(CPUINFO), 2);
        assert_eq!(cpu_model("processor\t: 0\n"), None);
    }

    #[test]
    fn meminfo_gives_total_bytes() {
        let meminfo = "MemTotal:       24684084 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_684_084 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn this_machine_is_described() {
        let m = Machine::describe();
        assert!(m.date.ends_with('Z') && m.date.len() == 20, "{}", m.date);
        assert!(m.kernel.is_some() && m.memory_bytes.is_some(), "{m:?}");
        assert!(m.logical_cpus.unwrap_or(0) >= 1, "{m:?}");
    }
}
