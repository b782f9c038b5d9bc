//! Prometheus text from the API server and the webhook, read as samples;
//! differences of counters and histograms between two scrapes; the RSS of
//! a process.

use std::collections::BTreeMap;

use kube::Client;

#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Scrape(pub Vec<Sample>);

pub fn parse(text: &str) -> Scrape {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        let mut map = BTreeMap::new();
        // Label values here never hold `",`.
        for pair in labels.split("\",") {
            if let Some((k, v)) = pair.split_once("=\"") {
                map.insert(k.trim().to_string(), v.trim_end_matches('"').to_string());
            }
        }
        out.push(Sample {
            name: name.to_string(),
            labels: map,
            value,
        });
    }
    Scrape(out)
}

impl Scrape {
    /// Sum of `name` over samples whose labels include every `want`.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                want.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Cumulative buckets of histogram `name` (`_bucket`), summed over the
    /// matching series: (upper bound, count).
    pub fn buckets(&self, name: &str, want: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let mut by: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for s in self.0.iter().filter(|s| s.name == format!("{name}_bucket")) {
            if !want
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            {
                continue;
            }
            let le = match s.labels.get("le").map(String::as_str) {
                Some("+Inf") => f64::INFINITY,
                Some(x) => x.parse().unwrap_or(f64::INFINITY),
                None => continue,
            };
            let e = by.entry(le.to_bits()).or_insert((le, 0.0));
            e.1 += s.value;
        }
        let mut v: Vec<(f64, f64)> = by.into_values().collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

/// `after - before` of cumulative buckets.
pub fn bucket_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, n)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map(|(_, n)| *n)
                .unwrap_or(0.0);
            (*le, n - b)
        })
        .collect()
}

/// The `q` quantile of cumulative buckets, linearly interpolated within the
/// bucket as Prometheus' histogram_quantile does.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return f64::NAN;
    };
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let span = n - prev.1;
            let frac = if span > 0.0 {
                (rank - prev.1) / span
            } else {
                1.0
            };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, n);
    }
    f64::NAN
}

pub async fn apiserver(admin: &Client) -> anyhow::Result<Scrape> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    Ok(parse(&admin.request_text(req).await?))
}

/// Resident set size of `pid` in bytes (`VmRSS`).
pub fn rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// CPU time (user + system) of `pid` in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_prometheus() {
        let s = parse(
            "x_bucket{le=\"0.1\",a=\"1\"} 50\nx_bucket{le=\"0.2\",a=\"1\"} 100\nx_bucket{le=\"+Inf\",a=\"1\"} 100\n",
        );
        let b = s.buckets("x", &[("a", "1")]);
        assert!((quantile(&b, 0.5) - 0.1).abs() < 1e-9);
        assert!((quantile(&b, 0.75) - 0.15).abs() < 1e-9);
    }

    /// The API server's counters carry empty labels (`subresource=""` for a
    /// main-resource write): matching one must not match a non-empty value.
    #[test]
    fn sum_matches_empty_label_values_exactly() {
        let s = parse(concat!(
            "# HELP apiserver_request_total x\n",
            "apiserver_request_total{code=\"422\",resource=\"nodes\",subresource=\"\",verb=\"PATCH\"} 3\n",
            "apiserver_request_total{code=\"422\",resource=\"nodes\",subresource=\"status\",verb=\"PATCH\"} 5\n",
            "apiserver_request_total{code=\"200\",resource=\"nodes\",subresource=\"\",verb=\"PATCH\"} 7\n",
            "apiserver_request_total{code=\"422\",resource=\"pods\",verb=\"PATCH\",subresource=\"\"} 11\n",
        ));
        let want = [
            ("resource", "nodes"),
            ("verb", "PATCH"),
            ("code", "422"),
            ("subresource", ""),
        ];
        assert_eq!(s.sum("apiserver_request_total", &want), 3.0);
        assert_eq!(
            s.sum("apiserver_request_total", &[("subresource", "")]),
            21.0
        );
    }
}
