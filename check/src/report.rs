//! The report: one line per check, and the exit code that follows from it.

use std::fmt::Write;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    /// Works, but a risk the operator should know about; exit stays 0.
    Warn,
    Fail,
    /// Could not be checked (e.g. no permission); exit stays 0.
    Skip,
    /// Worth knowing, no risk (e.g. a harmless leftover); exit stays 0.
    Info,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
            Status::Info => "INFO",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The check's name; per-line checks carry the webhook entry's
    /// (`line <entry>`), hence owned.
    pub check: String,
    pub status: Status,
    pub detail: String,
}

impl Line {
    pub fn new(check: impl Into<String>, status: Status, detail: impl Into<String>) -> Line {
        Line {
            check: check.into(),
            status,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    pub fn add(&mut self, check: impl Into<String>, status: Status, detail: impl Into<String>) {
        self.lines.push(Line::new(check, status, detail));
    }

    /// The lines of a verdict, in its order.
    pub fn extend(&mut self, lines: impl IntoIterator<Item = Line>) {
        self.lines.extend(lines);
    }

    pub fn count(&self, status: Status) -> usize {
        self.lines.iter().filter(|l| l.status == status).count()
    }

    /// The line of `check`, if it ran.
    pub fn get(&self, check: &str) -> Option<&Line> {
        self.lines.iter().find(|l| l.check == check)
    }

    pub fn failed(&self) -> bool {
        self.count(Status::Fail) > 0
    }

    pub fn exit_code(&self) -> i32 {
        i32::from(self.failed())
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            let _ = writeln!(out, "{}  {:<22} {}", l.status.as_str(), l.check, l.detail);
        }
        // Notes are counted only when there are any: the install's checks
        // make none, and their summary stays as it was.
        let info = match self.count(Status::Info) {
            0 => String::new(),
            n => format!(", {n} info"),
        };
        let _ = writeln!(
            out,
            "result: {} ({} passed, {} failed, {} warnings, {} skipped{info})",
            if self.failed() { "FAIL" } else { "PASS" },
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::Warn),
            self.count(Status::Skip),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_follows_failures_only() {
        let mut r = Report::default();
        r.add("a", Status::Pass, "ok");
        r.add("b", Status::Warn, "hm");
        r.add("c", Status::Skip, "no rights");
        assert_eq!(r.exit_code(), 0);
        assert!(
            r.render()
                .ends_with("result: PASS (1 passed, 0 failed, 1 warnings, 1 skipped)\n")
        );
        r.add("e", Status::Info, "harmless");
        assert_eq!(r.exit_code(), 0);
        assert!(r.render().contains("INFO  e "));
        assert!(r.render().ends_with("1 skipped, 1 info)\n"));
        r.add("d", Status::Fail, "broken");
        assert_eq!(r.exit_code(), 1);
        assert!(r.render().contains("FAIL  d                      broken\n"));
    }
}
