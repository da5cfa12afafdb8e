//! Case outcomes, the lines a child process reports them in, and the run's table of cases and
//! failures by category and backend.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use torsh_backend::BackendError;

/// What one case came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// As the reference, or the expected error.
    Pass,
    /// The backend does not run it (`Unsupported`, or `FeatureUnavailable` for a documented limit).
    Declined(String),
    /// Outputs outside the dtype's bound, or of another shape or dtype.
    Mismatch(String),
    /// A valid op failed.
    Error(String),
    /// An error of another kind than expected, or success where an error was expected.
    WrongError(String),
    /// The library panicked.
    Panic(String),
    /// The process died (abort, signal, exit) during the case.
    Crash(String),
    /// No answer within the watchdog's limit.
    Hang(String),
}

impl Outcome {
    /// The column this outcome counts in.
    pub fn column(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Declined(_) => "declined",
            Outcome::Mismatch(_) => "mismatch",
            Outcome::Error(_) => "error",
            Outcome::WrongError(_) => "wrong error",
            Outcome::Panic(_) => "panic",
            Outcome::Crash(_) => "crash",
            Outcome::Hang(_) => "hang",
        }
    }

    /// True for every outcome that is a defect.
    pub fn failed(&self) -> bool {
        !matches!(self, Outcome::Pass | Outcome::Declined(_))
    }

    /// The detail, if any.
    pub fn detail(&self) -> &str {
        match self {
            Outcome::Pass => "",
            Outcome::Declined(s)
            | Outcome::Mismatch(s)
            | Outcome::Error(s)
            | Outcome::WrongError(s)
            | Outcome::Panic(s)
            | Outcome::Crash(s)
            | Outcome::Hang(s) => s,
        }
    }

    /// The one-line form a child prints: the column, a tab, the detail without newlines.
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}",
            self.column(),
            self.detail().replace(['\n', '\t'], " ")
        )
    }

    /// Parses [`Outcome::to_line`]'s form.
    pub fn from_line(line: &str) -> Option<Outcome> {
        let (column, detail) = line.split_once('\t').unwrap_or((line, ""));
        let d = detail.to_string();
        Some(match column {
            "pass" => Outcome::Pass,
            "declined" => Outcome::Declined(d),
            "mismatch" => Outcome::Mismatch(d),
            "error" => Outcome::Error(d),
            "wrong error" => Outcome::WrongError(d),
            "panic" => Outcome::Panic(d),
            "crash" => Outcome::Crash(d),
            "hang" => Outcome::Hang(d),
            _ => return None,
        })
    }
}

/// The outcome columns of the table, in order.
pub const COLUMNS: [&str; 8] = [
    "pass",
    "declined",
    "mismatch",
    "error",
    "wrong error",
    "panic",
    "crash",
    "hang",
];

/// The name of an error's variant, to compare errors by kind.
pub fn error_kind(e: &BackendError) -> &'static str {
    match e {
        BackendError::Unavailable { .. } => "Unavailable",
        BackendError::ShapeMismatch { .. } => "ShapeMismatch",
        BackendError::DTypeMismatch { .. } => "DTypeMismatch",
        BackendError::InvalidArgument { .. } => "InvalidArgument",
        BackendError::SizeOverflow { .. } => "SizeOverflow",
        BackendError::InvalidPointer { .. } => "InvalidPointer",
        BackendError::OutOfBounds { .. } => "OutOfBounds",
        BackendError::Aliasing { .. } => "Aliasing",
        BackendError::IndexOutOfRange { .. } => "IndexOutOfRange",
        BackendError::DeviceMismatch { .. } => "DeviceMismatch",
        BackendError::OutOfMemory { .. } => "OutOfMemory",
        BackendError::MemoryPoolExhausted { .. } => "MemoryPoolExhausted",
        BackendError::Unsupported { .. } => "Unsupported",
        BackendError::FeatureUnavailable { .. } => "FeatureUnavailable",
        BackendError::NotInitialized { .. } => "NotInitialized",
        BackendError::DeviceLost { .. } => "DeviceLost",
        BackendError::Driver { .. } => "Driver",
        BackendError::KernelCompile { .. } => "KernelCompile",
        BackendError::GraphCapture { .. } => "GraphCapture",
        BackendError::Io(_) => "Io",
        _ => "other",
    }
}

/// Counts by (category, backend) and outcome column, and the failures' reproducers.
#[derive(Debug, Default)]
pub struct Tally {
    counts: BTreeMap<(String, String), BTreeMap<&'static str, u64>>,
    /// One line per failure: what failed and the command that replays it.
    pub failures: Vec<String>,
}

impl Tally {
    /// Counts `outcome` of a case in `category` on `backend`.
    pub fn add(&mut self, category: &str, backend: &str, outcome: &Outcome) {
        *self
            .counts
            .entry((category.to_string(), backend.to_string()))
            .or_default()
            .entry(outcome.column())
            .or_default() += 1;
    }

    /// Cases counted in all.
    pub fn cases(&self) -> u64 {
        self.counts.values().flat_map(|c| c.values()).sum()
    }

    /// Failing cases in all.
    pub fn failed(&self) -> u64 {
        self.counts
            .values()
            .flat_map(|c| c.iter())
            .filter(|(k, _)| !matches!(**k, "pass" | "declined"))
            .map(|(_, v)| v)
            .sum()
    }

    /// The table: a row per (category, backend), a column per outcome, and a total row.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = write!(out, "{:<10} {:<10} {:>8}", "category", "backend", "cases");
        for c in COLUMNS {
            let _ = write!(out, " {c:>11}");
        }
        out.push('\n');
        let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
        for ((category, backend), counts) in &self.counts {
            let cases: u64 = counts.values().sum();
            let _ = write!(out, "{category:<10} {backend:<10} {cases:>8}");
            for c in COLUMNS {
                let n = counts.get(c).copied().unwrap_or(0);
                *totals.entry(c).or_default() += n;
                let _ = write!(out, " {n:>11}");
            }
            out.push('\n');
        }
        let _ = write!(out, "{:<10} {:<10} {:>8}", "all", "", self.cases());
        for c in COLUMNS {
            let _ = write!(out, " {:>11}", totals.get(c).copied().unwrap_or(0));
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_survive_their_line_form() {
        for o in [
            Outcome::Pass,
            Outcome::Declined("f64".into()),
            Outcome::Mismatch("output 0\tbad\nvalue".into()),
            Outcome::Hang("60 s".into()),
        ] {
            let back = Outcome::from_line(&o.to_line()).unwrap();
            assert_eq!(back.column(), o.column());
            assert!(!back.detail().contains('\n'));
        }
    }

    #[test]
    fn the_table_counts_by_cell_and_column() {
        let mut t = Tally::default();
        t.add("valid", "cpu", &Outcome::Pass);
        t.add("valid", "cpu", &Outcome::Mismatch("x".into()));
        t.add("raw", "webgpu", &Outcome::Declined("f64".into()));
        assert_eq!((t.cases(), t.failed()), (3, 1));
        let table = t.table();
        assert!(table.contains("valid      cpu               2"), "{table}");
        assert!(table.lines().last().unwrap().starts_with("all"));
    }
}
